// The decode GEMVs over packed quantized weights (kernels/cuda/quantized_gemv.cu): out[j, o] =
// sum_k x[j, k] W[o, k] (+ bias[o]) for up to kQuantizedGemvPassRows rows j of x, W packed as
// its checkpoint stores it (include/longctx/loader/quantization.h gives the layouts), fp32
// accumulation. The params are raw device pointers; the schedule (which kernel, tile and split
// of K) is host code, tested on the CPU.
#pragma once

#include <cstdint>
#include <string>

#include "longctx/core/dtype.h"

namespace longctx::kernels {

// Rows of x one GEMV launch takes (a pass: the op runs more rows in passes).
inline constexpr int64_t kQuantizedGemvPassRows = 8;
// Split-K partitions at most (bounds the partials' workspace).
inline constexpr int64_t kQuantizedGemvMaxSplits = 64;
// Output tiles at most whose K slices the GEMV reduces itself (kLastCta: a u32 arrival counter per
// tile, kept zero between launches).
inline constexpr int64_t kQuantizedGemvMaxTileCounters = 16384;

enum class QuantizedGemvFormat {
  kGptq,        // qweight [in/8, out] i32 (8 inputs of one output a word), scales [in/g, out]
  kAwq,         // qweight [in, out/8] i32 (8 outputs of one input a word), scales [in/g, out]
  kFp8Block,    // weight [out, in] E4M3, scales [ceil(out/block_out), ceil(in/block_in)]
  kFp8Channel,  // weight [out, in] E4M3, scales [out] (per channel) or [1] (per tensor)
};

// The kernel family:
//   kSimt: CUDA-core kernels for every format. int4 words are decoded in registers to the exact
//     (q - z) in half2 (the magic-number trick), widened to f32 and multiplied by x in f32; FP8
//     E4M3 -> f16 -> f32.
//   kMma: int4 only (GPTQ and AWQ): the exact (q - z) in bf16 / f16 (x's type) fed to the tensor
//     cores (mma.sync m16n8k16, fp32 accumulation) with x as the 8-column B operand; the
//     products (q - z) x are exact, each group's sum is scaled in fp32. Takes in and the group a
//     multiple of 32, x rows 16-byte aligned, and for AWQ out a multiple of 16.
//   kMmaAsync: kMma's math with the weights (and each group's zeros and scales) copied by
//     cp.async into a per-warp ring of shared memory several steps ahead of the math (more bytes
//     in flight than registers hold). Takes kMma's shapes with 16-bit scales, scales 16-byte and
//     qzeros 8-byte aligned.
//   kAuto: kMmaAsync, else kMma, else kSimt, the first that runs.
enum class QuantizedGemvKernel { kAuto, kSimt, kMma, kMmaAsync };

// How the fp32 partials of several K slices become the outputs (both add the slices in slice
// order: the same bits):
//   kLastCta: in the GEMV: the last CTA of an output tile to finish its slice (a per-tile arrival
//     counter, which that CTA resets to zero for the next launch and graph replay) adds them.
//   kKernel: a second kernel adds them.
//   kAuto: kLastCta where the tiles fit kQuantizedGemvMaxTileCounters, else kKernel.
enum class QuantizedGemvReduce { kAuto, kLastCta, kKernel };

// Each CTA's bulk prefetch of its whole weight slice into L2 (the weights stream at more bytes in
// flight than the kernels' registers or rings hold):
//   kOff (the default): none. Whole decode steps measured faster without it in every format
//     (H100, Llama-3.1-8B shapes after 32K, TPOT with kAfterWait -> kOff: FP8 blocks 6.005 ->
//     5.533 ms, GPTQ 6.269 -> 5.993, AWQ 7.804 -> 6.722; docs/benchmarks.md), though a GEMV
//     timed alone is about even: the prefetch's extra L2 traffic costs the kernels around it.
//   kAfterWait: once the previous kernel has finished (pdl_wait).
//   kBeforeWait: before that, under the previous kernel's tail (the bf16 GEMV measured slower per
//     token prefetching 4-16 KB of each row that way: it takes bandwidth from that kernel).
enum class QuantizedGemvPrefetch { kAfterWait, kBeforeWait, kOff };

// What the schedule reads.
struct QuantizedGemvProblem {
  QuantizedGemvFormat format = QuantizedGemvFormat::kGptq;
  int64_t n = 1;  // rows of the pass, 1..kQuantizedGemvPassRows
  int64_t in = 0, out = 0;
  int64_t group = 0;                    // int4: inputs per group (in for one group)
  int64_t block_out = 0, block_in = 0;  // FP8 block scales
  DType x_dtype = DType::kBF16;
  bool x_aligned16 = true;        // x's address and row stride are multiples of 16 bytes
  bool qweight_aligned16 = true;  // the packed weight's address is
  DType scale_dtype = DType::kF16;
  bool params_aligned = true;  // scales' address a multiple of 16 bytes, qzeros' of 8
  int sm_count = 132;
  QuantizedGemvKernel kernel = QuantizedGemvKernel::kAuto;
  // CTAs the split of K aims for per SM (0: the kernel's default: 4 for int4; for FP8 a split
  // only where the output tiles are fewer than the SMs, as the bf16 GEMV, which has none).
  int ctas_per_sm = 0;
  // K slices wanted (0: from ctas_per_sm), clamped to the kernel's range (the SIMT int4 kernels
  // stage at most 1024 inputs of x a slice).
  int64_t splits = 0;
  QuantizedGemvReduce reduce = QuantizedGemvReduce::kAuto;
  QuantizedGemvPrefetch prefetch = QuantizedGemvPrefetch::kOff;
};

struct QuantizedGemvSchedule {
  std::string refusal;  // why no GEMV runs the problem ("" when one does)
  QuantizedGemvKernel kernel = QuantizedGemvKernel::kSimt;  // kSimt, kMma or kMmaAsync
  int64_t tile = 0;                                         // outputs per CTA
  int awq_words = 1;   // kSimt AWQ: words per lane load (1, 2 or 4)
  int64_t splits = 1;  // K slices (blockIdx.y); > 1: fp32 partials + a reduction
  int64_t k_per_split = 0;
  int64_t col_tiles = 0;      // CTAs along the outputs (blockIdx.x)
  int64_t partial_bytes = 0;  // workspace for the partials [splits, n, out] f32
  // splits > 1: kLastCta (needs QuantizedGemvParams::tile_counters) or kKernel; 1: kAuto.
  QuantizedGemvReduce reduce = QuantizedGemvReduce::kAuto;
  QuantizedGemvPrefetch prefetch = QuantizedGemvPrefetch::kOff;  // the problem's
};

// The kernel, tile and split of K for p: splits so that col_tiles x splits fills the SMs (a few
// CTAs each) without slices shorter than a few thousand bytes of weight per warp. A requested
// kernel that cannot run p gives a refusal naming why; kAuto picks kMma where it runs.
QuantizedGemvSchedule quantized_gemv_schedule(const QuantizedGemvProblem& p);

// "gemv <format> <kernel> tile T splits S (K inputs each)[ reduce last-cta|kernel]", for plans
// and benchmarks.
std::string quantized_gemv_name(const QuantizedGemvProblem& p, const QuantizedGemvSchedule& s);

// One pass of the GEMV (device pointers).
struct QuantizedGemvParams {
  QuantizedGemvFormat format = QuantizedGemvFormat::kGptq;
  const void* x = nullptr;  // [n, in] of x_dtype (bf16 or f16), row stride ldx elements
  int64_t ldx = 0;
  DType x_dtype = DType::kBF16;
  int n = 0;                      // rows, 1..kQuantizedGemvPassRows
  const void* qweight = nullptr;  // the format's packed weight
  const void* scales = nullptr;   // the format's scales, scale_dtype (f32, bf16 or f16)
  DType scale_dtype = DType::kF16;
  const uint32_t* qzeros = nullptr;  // int4: [in/g, out/8], packed like AWQ's / GPTQ's qweight
  const void* bias = nullptr;        // [out] or nullptr, bias_dtype
  DType bias_dtype = DType::kF32;
  void* out = nullptr;  // [n, out] of out_dtype (f32 or x's), row stride ldo (splits == 1)
  int64_t ldo = 0;
  DType out_dtype = DType::kBF16;
  float* partial = nullptr;  // [splits, n, out] f32 (splits > 1)
  // [>= col_tiles] u32, all zero before the launch and after it (splits > 1 with kLastCta).
  uint32_t* tile_counters = nullptr;
  QuantizedGemvPrefetch prefetch = QuantizedGemvPrefetch::kOff;  // set from the schedule
  int64_t in = 0, out_features = 0;
  int64_t group = 0;                                    // int4: inputs per group
  int zero_offset = 0;                                  // GPTQ v1: qzeros hold z - 1
  int64_t block_out = 1, block_in = 1, scale_cols = 1;  // FP8 block scales
  int scale_stride = 0;                                 // FP8 channel (1) or tensor (0) scales
};

}  // namespace longctx::kernels
