// The split-KV decode plan's host side (kernels/cuda/decode.cu's decode_plan): the requests'
// lengths from the page table, the wave model that sizes the splits, which loader brings the K/V
// tiles and how its stages are filled, and the work list the kernel reads. Host code only, so
// the choices are tested on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/decode_params.h"
#include "kernels/host_device.h"
#include "longctx/kernels/kernel_tuning.h"

namespace longctx::kernels {

// Tokens of K and of V per stage of the cp.async ring for head_dim d: 16 KB together for both
// head dims, so the ring's bytes in flight do not depend on d. The TMA kernel's stages hold one
// (loader 1) or two (loader 2) of these tiles.
// 16 KB of K + V per stage at head_dim 64 / 128; at 256 a stage keeps 32 tokens (32 KB), since each
// of the kernel's 4 warps takes whole 8-token blocks.
constexpr int decode_tile_tokens(int head_dim) { return head_dim > 128 ? 32 : 4096 / head_dim; }

// Keys per split from which the TMA kernel's stages are filled by every thread's cp.async rather
// than by TMA boxes (decode_cp_async_stages).
constexpr int64_t kDecodeCpAsyncStagesMinChunk = 1024;

// Int32s per work item: request, kv begin, kv end, partial slot (-1: write o / lse directly), the
// request's kv_indptr entry, its first partial slot and partial count (0 unless split), and the
// plan's cp_async_stages (in the work list, not a kernel parameter, so that a CUDA graph's
// replay takes each new plan's choice); then the request's first query row, its query count, its
// keys (kv_len) and 1 for the causal tail rule (DecodeParams), 0 for none.
constexpr int kDecodeWorkInts = 12;

// The query rows of a call (DecodeParams::qo_indptr, here a host array; nullptr: one each) and
// the rule they see keys by (DecodeParams::causal).
struct DecodeQueries {
  const int32_t* qo_indptr = nullptr;  // [batch + 1] host
  bool causal = true;
};

// Each request's query count from `queries` (all 1 without qo_indptr). Throws
// Error(kInvalidArgument) where qo_indptr[0] != 0 or a count is outside [0, kDecodeMaxQLen].
std::vector<int32_t> decode_q_lens(const DecodeQueries& queries, int batch);

// Keys of each request: (pages - 1) * page_size + last_page_len, 0 without pages. Host inputs
// kv_indptr [batch + 1], last_page_len [batch]. Throws Error(kInvalidArgument) where kv_indptr
// decreases or a last_page_len is outside [1, page_size].
std::vector<int64_t> decode_lengths(const int32_t* kv_indptr, const int32_t* last_page_len,
                                    int batch, int page_size);

// A request of len keys at chunk size `chunk`: `count` even splits of `sub` keys (the last
// shorter), sub a multiple of 64 (whole tiles for both head dims, and where a 64-token stage may
// start).
struct DecodeSplit {
  int64_t count = 1, sub = 64;
};
DecodeSplit decode_split(int64_t len, int64_t chunk);

// The wave model's inputs. resident: CTAs per SM the kernel's occupancy allows; slots_override
// (> 0) forces the CTAs per SM the model assumes; overhead: a CTA's fixed cost (pipeline fill,
// epilogue, merge) in keys.
struct DecodeWaveModel {
  int num_sms = 0;
  int resident = 2;
  int slots_override = 0;
  int64_t overhead = 64;
  int min_chunk_tokens = 256;
};

// The plan's chunk (keys per split) for requests of `len` keys, each split taking
// ctas_per_item CTAs, at most max_items work items. CTAs run in waves of the resident slots; a
// wave costs its longest split plus the overhead; candidates split the longest request into
// k = 1, 2, ... even parts down to min_chunk_tokens, and the first (fewest splits) of the
// cheapest wins. When one wave of 2 CTAs per SM holds the grid, the model takes 2 CTAs per SM
// even where 3 fit (longer CTAs, fewer partial states: measured faster at batch 1); otherwise
// the full resident count.
int64_t decode_chunk(const std::vector<int64_t>& len, int64_t max_items, int64_t ctas_per_item,
                     const DecodeWaveModel& model);

// The loader: 0 the cp.async ring; 1 the TMA kernel's stages of decode_tile_tokens keys; 2 its
// stages of twice that (head_dim 128). The TMA kernel (where the device has it: `tma`) takes
// pages that hold whole tiles, at head_dim 128 in stages of 64 tokens where the pages hold
// those; other pages keep the ring unless tuning.copy is kCpAsync (stages filled across pages).
// tuning.loader kCpAsync forces the ring, kTmaTile no doubled stages.
int decode_loader(int page_size, int head_dim, bool tma, const DecodeTuning& tuning);

// Whether the TMA kernel's stages are filled by every thread's cp.async instead of TMA boxes:
// for splits of kDecodeCpAsyncStagesMinChunk keys and more (the boxes' 128-byte rows top out at
// ~4.2 TB/s on the H200, the threads' copies at 4.6; over a few tiles the one issuing thread
// starts sooner), and always for pages that are not whole tiles; tuning.copy pins either. False
// for the ring.
bool decode_cp_async_stages(int loader, int page_size, int head_dim, int64_t chunk,
                            const DecodeTuning& tuning);

// The wave model of `tuning` (its slots and overhead) for these SMs, resident CTAs per SM and
// chunk floor.
DecodeWaveModel decode_wave_model(const DecodeTuning& tuning, int num_sms, int resident,
                                  int min_chunk_tokens);

// The first key each request's queries see under a sliding window of `window` keys (0: none;
// then all 0): the first query's, max(0, len - q_len + 1 - window) with the causal rule,
// max(0, len - window) without (q_len: decode_q_lens; empty: one query each).
std::vector<int64_t> decode_first_keys(const std::vector<int64_t>& len, int window,
                                       const std::vector<int32_t>& q_len = {}, bool causal = true);

// The keys a request's splits cover: from the multiple of 64 at or before its first key (where a
// split may start, and the kernel's tiles) to its end. What the wave model sizes.
std::vector<int64_t> decode_spans(const std::vector<int64_t>& len,
                                  const std::vector<int64_t>& first);

// The work list ([items, kDecodeWorkInts]) and the partial slots it uses. Requests b < real are
// split at `chunk`; the others (a CUDA graph's padding) get one item over all their keys. A
// request's splits cover [first & ~63, len) in multiples of 64; its first item begins at
// first[b] exactly (the kernel masks the keys before it in that tile, and reads no earlier tile).
// Each item also names its request's query rows (queries.qo_indptr; row b without) and count
// (q_len; 1 each when empty).
struct DecodeWork {
  std::vector<int32_t> items;
  int32_t num_partials = 0;
};
DecodeWork decode_work_items(const std::vector<int64_t>& len, const std::vector<int64_t>& first,
                             const int32_t* kv_indptr, int real, int64_t chunk,
                             bool cp_async_stages, const DecodeQueries& queries = {},
                             const std::vector<int32_t>& q_len = {});

// The fused merge of a split request's n partial states (per kv head and head tile of q rows).
// One level (g >= n): the last of the n CTAs to finish reads all n states. Two levels (g < n):
// the splits form groups of g consecutive partial slots (the last group shorter); the last CTA
// of a group merges its states into the group's first slot, and the last group to finish merges
// the ceil(n / g) group states into o. At 4 kv heads and batch 1 a request takes 64 splits of
// 8 q rows: one level is one CTA per kv head reading 256 KB of fp32 states in 8 dependent
// rounds of L2 loads after every other CTA has ended; two levels of 8 spread the first merges
// over the CTAs that end early and leave 32 KB for the tail. `pinned` (> 0, DecodePlan's
// merge_group) sets g (at least 2); 0 takes one level up to kDecodeMergeOneLevelMax states,
// else g = ceil(sqrt(n)). Shared by the plan and the kernel, so the kernel evaluates the same
// rule for any plan a CUDA graph replays.
constexpr int kDecodeMergeOneLevelMax = 32;
LONGCTX_HD_INLINE int decode_merge_group(int n, int pinned) {
  if (pinned > 0) return pinned < 2 ? 2 : pinned < n ? pinned : n;
  if (n <= kDecodeMergeOneLevelMax) return n;
  int g = 1;
  while (g * g < n) ++g;
  return g;
}

// Partial slots a plan may use when decode_chunk held its items to max_items for `batch`
// requests: a split request of k items takes k slots, k <= 2 (k - 1), and the extra items
// sum_b (k_b - 1) are at most max_items - batch, so 2 (max_items - batch) bound them (and the
// workspace's partial buffers, which scale with the queries per request).
int64_t decode_max_partials(int64_t max_items, int64_t batch);

}  // namespace longctx::kernels
