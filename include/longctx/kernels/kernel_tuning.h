// Kernel tuning as data: the choices the attention kernels' plans make (which kernel, tiling,
// stages, loader, split) with the measured defaults, passed to the kernels' plan() functions and
// held by the attention backends (GpuRunnerOptions::tuning). Benchmarks and tests override them
// explicitly (bench_attention / bench_model flags, parse_kernel_tuning_flag; a struct in tests);
// production code reads none of them from the environment. docs/architecture.md ("Tuning") has
// the table of fields, values, defaults and why.
//
// A public header (GpuRunnerOptions carries a KernelTuning) of plain enums and integers only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace longctx::kernels {

// The paged prefill's kernel: the Hopper kernel (wgmma, prefill_sm90.cu) where the device is
// sm_90 and the binary carries it, else the mma.sync one (prefill.cu); kFa2 forces mma.sync.
enum class PrefillKernel : uint8_t { kSm90, kFa2 };

// The Hopper kernel's variant: consumer warpgroups taking turns at the tensor cores over
// persistent CTAs (the default), persistent CTAs without the turns, one CTA per work item.
enum class PrefillSm90Variant : uint8_t { kPingpong, kPersistent, kGrid };

// The Hopper kernel's tiling where no block mask is given: kAuto takes the lean tiling (no
// bitmaps, no output staging) with 3 K/V stages at head_dim 128 under cp.async, else 2;
// kFull keeps the block-sparse plans' tiling; kLean2 / kLean3 pin the stages.
enum class PrefillLean : uint8_t { kAuto, kFull, kLean2, kLean3 };

// The Hopper prefill's stream-K split (kernels/prefill_schedule.h), where the plan's workspace
// has room for it: the cost model decides (kAuto), never, or wherever a split exists.
enum class PrefillSplitMode { kAuto, kNever, kAlways };

struct PrefillTuning {
  PrefillKernel kernel = PrefillKernel::kSm90;
  PrefillSm90Variant variant = PrefillSm90Variant::kPingpong;
  bool tma = true;  // Hopper: 64-key TMA boxes where pages hold 64-token runs (else cp.async)
  PrefillLean lean = PrefillLean::kAuto;
  int head_dim64_rows = 192;  // Hopper rows per work item at head_dim 64: 192 (3 consumer
                              // warpgroups) or 128
  PrefillSplitMode split = PrefillSplitMode::kAuto;
  int unit_heads = 0;  // Hopper unit order: 0 the plan chooses; n > 0 the largest divisor of
                       // num_kv_heads up to n (split or not)
  // FP8 caches: the staging pool's cap in MiB (kernels/fp8_stage_params.h): a prefill call whose
  // pages' 16-bit K and V fit runs the 16-bit kernel over them after one conversion launch, a
  // larger one converts in the kernel (as every call does at 0). 512 MiB: 128K keys of a layer
  // of 8 KV heads x 128 (docs/fp8_kv.md, "Staged prefill").
  int fp8_stage_mib = 512;
};

// The split-KV decode's K/V loader: kAuto takes the TMA kernel where the device has it and the
// pages hold whole tiles (at head_dim 128 stages of 64 tokens where they hold those), else the
// cp.async ring; kCpAsync forces the ring; kTmaTile keeps the TMA stages at one tile (no doubled
// stages).
enum class DecodeLoader : uint8_t { kAuto, kCpAsync, kTmaTile };

// How the TMA kernel's stages are filled: kAuto by every thread's cp.async for splits of 1024
// keys and more (and pages that are not whole tiles), else by TMA boxes; kTmaBoxes never by
// cp.async (and pages that are not whole tiles keep the ring); kCpAsync always by cp.async (and
// pages that are not whole tiles take the TMA kernel too).
enum class DecodeStageCopy : uint8_t { kAuto, kTmaBoxes, kCpAsync };

// The split-KV decode's kernel over an FP8 cache: kConvertTile converts each landed tile of codes
// into a 16-bit tile in shared memory that the 16-bit compute reads; kRegisters converts the codes
// in registers right before the tensor-core fragments and folds the page scales into the scores
// and the softmax weights; kRegistersDeep the same with a deeper ring (more bytes in flight, 2
// CTAs per SM instead of 3 at head_dim 128). kAuto: kRegisters.
enum class DecodeFp8Kernel : uint8_t { kAuto, kConvertTile, kRegisters, kRegistersDeep };

struct DecodeTuning {
  DecodeLoader loader = DecodeLoader::kAuto;
  DecodeStageCopy copy = DecodeStageCopy::kAuto;
  DecodeFp8Kernel fp8_kernel = DecodeFp8Kernel::kAuto;
  int slots = 0;      // the wave model's CTAs per SM; 0: its own (2 where one wave holds the grid,
                      // else the occupancy's)
  int overhead = 64;  // the wave model's fixed cost of a CTA, in keys
  // The most queries per sequence of a call the split-KV decode takes (a speculative verify
  // step's K + 1; 1 to 16): calls with more, or 1 here, take the paged prefill. 1 by default:
  // at Llama-3-8B's heads (32 / 8, head_dim 128) a 9-query verify over 131K keys measured 0.74
  // ms in the decode (its CTAs take 8 of a KV head's 36 rows, so 5 of them read each K/V tile)
  // against 0.21 ms in the prefill (H100); the decode wins only where the prefill's grid is a
  // few CTAs (the needle model's 4 heads: 658 against 593 decode tok/s end to end).
  int max_q_len = 1;
};

// The paged backends' kernel for every call: kAuto the prefill / split-KV decode kernels at
// head_dim 64 / 128 and the generic kernel elsewhere; kGeneric the generic kernel always (P and
// every sum in fp32: the precision reference of exactness experiments).
enum class AttentionKernel : uint8_t { kAuto, kGeneric };

struct KernelTuning {
  PrefillTuning prefill;
  DecodeTuning decode;
  AttentionKernel attention = AttentionKernel::kAuto;
  // Programmatic dependent launch on sm_90 (kernels/cuda/pdl.cuh) for every launch on the
  // backend's device (a per-device setting the backends apply when they are made).
  bool pdl = true;
};

// One benchmark flag onto `tuning`: name without the leading dashes, e.g. "prefill-kernel" with
// "fa2" (the names and values: kernel_tuning_flags_help()). Returns false and sets *error on an
// unknown name or value; the only place where the choices are strings.
bool parse_kernel_tuning_flag(std::string_view name, std::string_view value, KernelTuning* tuning,
                              std::string* error);
// Whether `name` (without dashes) is one of parse_kernel_tuning_flag's flags.
bool is_kernel_tuning_flag(std::string_view name);
// The flags: name (without dashes), values ("sm90|fa2", "N") and a line of help with the default.
struct KernelTuningFlag {
  std::string_view name, values, help;
};
std::vector<KernelTuningFlag> kernel_tuning_flags();
// The flags, their values and defaults, a line each (for a benchmark's --help).
std::string kernel_tuning_flags_help();

}  // namespace longctx::kernels
