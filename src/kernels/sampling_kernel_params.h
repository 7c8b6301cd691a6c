// The batched GPU sampler's inputs and outputs (kernels/cuda/sampling.h), as plain structs the
// host packs into one upload and reads back from one download. CUDA-free.
#pragma once

#include <cstdint>

namespace longctx::kernels {

inline constexpr int kSamplingMaxTop = 20;  // SamplingParams::kMaxLogprobs
// Masses of a whole vocabulary must fit an uint64: 2^kMassBits * vocab < 2^64
// (kernels/sampling_math.h).
inline constexpr int64_t kMaxSamplingVocab = int64_t(1) << 20;

// One token's penalty: its logit is divided / multiplied by repetition_penalty when `repeated`
// (prompt or output), then lowered by frequency * count + presence when count > 0.
struct SamplingPenaltyEntry {
  int32_t token = 0;
  int32_t count = 0;     // times generated
  int32_t repeated = 0;  // in prompt or output (repetition_penalty applies)
  int32_t pad = 0;
};

struct SamplingRowParams {
  uint64_t seed = 0;
  uint64_t step = 0;       // the draw's Philox counter
  double top_p = 1.0;      // 1 = off
  double log_min_p = 0.0;  // log(min_p), used when use_min_p
  double frequency_penalty = 0.0;
  double presence_penalty = 0.0;
  float inv_temperature = 1.0f;  // float(1 / temperature), as the CPU sampler scales
  float repetition_penalty = 1.0f;
  int32_t top_k = 0;  // 0 = off (the host maps <= 0 and >= vocab to 0)
  int32_t greedy = 0;
  int32_t use_min_p = 0;
  int32_t logprobs = -1;      // -1: none; else the number of top logprobs (<= kSamplingMaxTop)
  int32_t work_row = -1;      // this row's penalized copy in SamplingBatch::work; -1: none
  int32_t penalty_begin = 0;  // this row's entries in SamplingBatch::penalties
  int32_t penalty_count = 0;
  // This row's allowed-token bitmask in SamplingBatch::masks (structured outputs); -1: none.
  // Disallowed tokens become -inf after the penalties (logprobs stay the raw distribution's).
  // The kernels read the mask with the row's logits (a masked row needs no work copy).
  int32_t mask_row = -1;
};

enum SamplingStatus : int32_t {
  kSamplingOk = 0,
  kSamplingNaN = 1,             // bad_index: the first NaN logit
  kSamplingPosInf = 2,          // bad_index: the first +inf logit
  kSamplingAllNegInf = 3,       // every logit is -inf
  kSamplingOverflow = 4,        // bad_index: a finite logit became +inf (penalties / temperature)
  kSamplingAllNegInfAfter = 5,  // every logit is -inf after penalties and temperature
};

struct SamplingRowResult {
  int32_t token = -1;
  int32_t status = kSamplingOk;
  int32_t bad_index = -1;
  int32_t num_top = 0;
  int64_t rank = 0;      // 1 + tokens with a larger raw logit
  float logprob = 0.0f;  // raw log_softmax of `token`
  int32_t pad = 0;
  int32_t top_ids[kSamplingMaxTop] = {};
  float top_logprobs[kSamplingMaxTop] = {};
};

// Device pointers. Rows r < num_rows: logits + r * logits_stride, `vocab` contiguous f32.
struct SamplingBatch {
  const float* logits = nullptr;  // [num_rows, logits_stride] f32
  int64_t logits_stride = 0;      // elements between rows (>= vocab)
  int32_t num_rows = 0;
  int32_t vocab = 0;
  const SamplingRowParams* rows = nullptr;  // [num_rows]
  float* work = nullptr;                    // [num_penalized, vocab] f32: penalized rows
  const int32_t* penalized_rows = nullptr;  // [num_penalized]: the batch row of each work row
  int32_t num_penalized = 0;
  const SamplingPenaltyEntry* penalties = nullptr;  // entries of every penalized row
  SamplingRowResult* results = nullptr;             // [num_rows]
  // [masked rows, sampling_mask_words(vocab)]: bit t of word t / 32 set = token t allowed.
  const uint32_t* masks = nullptr;
};

inline constexpr int64_t sampling_mask_words(int64_t vocab) { return (vocab + 31) / 32; }

}  // namespace longctx::kernels
