// The engine's batched sampler on the GPU. Same semantics and arithmetic as the CPU sampler
// (longctx/engine/sampler.h): for the same logits, parameters and SamplerState (seed, step,
// penalty history) it returns the same token as sample_token, and a row's token depends on that
// row alone, never on the rest of the batch. Built without CUDA, construction throws
// Error(kUnsupported).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "longctx/core/device.h"
#include "longctx/core/stream.h"
#include "longctx/core/tensor.h"
#include "longctx/engine/sampler.h"
#include "longctx/engine/sampling_params.h"

namespace longctx {

class GpuSampler {
 public:
  // Allocates every buffer once (device pool and pinned host memory), so the device addresses
  // stay fixed; only the penalty-entry buffer grows, when a call needs more entries than ever.
  GpuSampler(int64_t max_rows, int64_t vocab, Device device);

  // Row i of `logits` (device f32 [B, vocab], last dim contiguous, B <= max_rows) is sampled
  // with *params[i] and *states[i] (and its token_mask(), if any); on success every state
  // advances one step. One upload (row parameters, penalty entries; the masks, when a row has
  // one, in a second copy), one download (tokens, logprobs), one stream synchronization, on
  // current_stream(). With masks the upload runs on a stream of its own, which current_stream()
  // waits for before sampling: it overlaps the step's forward instead of following it (a batch
  // of masked rows uploads megabytes). Throws Error(kInvalidArgument) for bad shapes or parameters
  // and, like sample_token (naming the batch row too), for NaN / +inf / all -inf logits; no state
  // advances then.
  std::vector<SampleResult> sample(const Tensor& logits, std::span<SamplerState* const> states,
                                   std::span<const SamplingParams* const> params);

  int64_t max_rows() const { return max_rows_; }
  int64_t vocab() const { return vocab_; }
  // Device bytes held; the penalized-row copies dominate (max_rows x vocab x 4).
  int64_t device_bytes() const;

 private:
  // Returns whether the upload buffers were (re)allocated.
  bool reserve_penalties(int64_t entries);
  // Where the token masks start in the upload buffers (after the penalty entries' capacity).
  int64_t masks_offset() const;

  int64_t max_rows_ = 0;
  int64_t vocab_ = 0;
  Device device_;
  int64_t penalty_capacity_ = 0;  // entries the upload buffers hold
  // [upload bytes] u8 pinned: row params | penalized rows | penalties | token masks
  Tensor upload_host_;
  Tensor upload_dev_;    // [upload bytes] u8: the same, on the device
  Tensor results_host_;  // [max_rows * sizeof(SamplingRowResult)] u8 pinned
  Tensor results_dev_;   // [max_rows * sizeof(SamplingRowResult)] u8
  Tensor work_;          // [max_rows, vocab] f32: penalized copies of the rows that need them
  std::unique_ptr<Stream> upload_stream_;
  std::unique_ptr<Event> uploaded_;  // recorded on upload_stream_ after a call's upload
  // upload_dev_ is new: the pool may have handed out memory that work still queued on
  // current_stream() uses (pool frees are ordered on that stream only), so the next upload is
  // ordered there too.
  bool upload_dev_fresh_ = true;
};

}  // namespace longctx
