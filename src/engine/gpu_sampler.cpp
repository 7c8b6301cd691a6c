// GpuSampler: packs the batch's per-row parameters, penalty entries (engine/sampling_pack.h) and
// the token masks of structured-output rows into one pinned buffer, uploads it, runs the sampling
// op (ops/sampling.h) on the device, and reads the results back.
#include "engine/gpu_sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/sampling_pack.h"
#include "longctx/core/error.h"
#include "longctx/core/stream.h"
#include "ops/sampling.h"

#ifdef LONGCTX_WITH_CUDA
#include "core/cuda_stream.h"
#include "longctx/core/cuda_check.h"
#endif

namespace longctx {

#ifdef LONGCTX_WITH_CUDA

namespace {

constexpr int64_t kInitialPenaltyEntries = 1 << 16;

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

int64_t params_bytes(int64_t rows) {
  return align_up(rows * static_cast<int64_t>(sizeof(kernels::SamplingRowParams)), 16);
}
int64_t penalized_offset(int64_t rows) { return params_bytes(rows); }
int64_t entries_offset(int64_t rows) {
  return penalized_offset(rows) + align_up(rows * static_cast<int64_t>(sizeof(int32_t)), 16);
}

}  // namespace

GpuSampler::GpuSampler(int64_t max_rows, int64_t vocab, Device device)
    : max_rows_(max_rows), vocab_(vocab), device_(device) {
  LONGCTX_CHECK(device.is_cuda(), ErrorCode::kInvalidArgument,
                "GpuSampler needs a CUDA device, got {}", device.str());
  LONGCTX_CHECK(max_rows >= 1, ErrorCode::kInvalidArgument, "GpuSampler: max_rows {} < 1",
                max_rows);
  LONGCTX_CHECK(vocab >= 1 && vocab <= kernels::kMaxSamplingVocab, ErrorCode::kInvalidArgument,
                "GpuSampler: vocabulary {} not in [1, {}]", vocab, kernels::kMaxSamplingVocab);
  const int64_t result_bytes = max_rows * static_cast<int64_t>(sizeof(kernels::SamplingRowResult));
  results_host_ = Tensor::empty_pinned({result_bytes}, DType::kU8);
  results_dev_ = Tensor::empty({result_bytes}, DType::kU8, device);
  work_ = Tensor::empty({max_rows, vocab}, DType::kF32, device);
  upload_stream_ = std::make_unique<Stream>(device);
  uploaded_ = std::make_unique<Event>(device);
  reserve_penalties(kInitialPenaltyEntries);
}

bool GpuSampler::reserve_penalties(int64_t entries) {
  if (entries <= penalty_capacity_) return false;
  penalty_capacity_ = std::max(entries, 2 * penalty_capacity_);
  const int64_t bytes = masks_offset() + max_rows_ * kernels::sampling_mask_words(vocab_) *
                                             static_cast<int64_t>(sizeof(uint32_t));
  upload_host_ = Tensor::empty_pinned({bytes}, DType::kU8);
  upload_dev_ = Tensor::empty({bytes}, DType::kU8, device_);
  upload_dev_fresh_ = true;
  return true;
}

int64_t GpuSampler::masks_offset() const {
  return align_up(
      entries_offset(max_rows_) +
          penalty_capacity_ * static_cast<int64_t>(sizeof(kernels::SamplingPenaltyEntry)),
      16);
}

int64_t GpuSampler::device_bytes() const {
  return static_cast<int64_t>(upload_dev_.nbytes() + results_dev_.nbytes() + work_.nbytes());
}

std::vector<SampleResult> GpuSampler::sample(const Tensor& logits,
                                             std::span<SamplerState* const> states,
                                             std::span<const SamplingParams* const> params) {
  constexpr auto kBad = ErrorCode::kInvalidArgument;
  LONGCTX_CHECK(logits.defined() && logits.device() == device_, kBad,
                "GpuSampler: logits must be on {}, got {}", device_.str(),
                logits.defined() ? logits.str() : std::string("an undefined tensor"));
  LONGCTX_CHECK(logits.dtype() == DType::kF32 && logits.rank() == 2 && logits.size(1) == vocab_ &&
                    logits.strides()[1] == 1,
                kBad, "GpuSampler: logits must be f32 [B, {}] with contiguous rows, got {}", vocab_,
                logits.str());
  const int64_t rows = logits.size(0);
  LONGCTX_CHECK(rows <= max_rows_, kBad, "GpuSampler: {} rows, at most {}", rows, max_rows_);
  LONGCTX_CHECK(
      static_cast<int64_t>(states.size()) == rows && static_cast<int64_t>(params.size()) == rows,
      kBad, "GpuSampler: {} logits rows but {} states and {} params", rows, states.size(),
      params.size());
  if (rows == 0) return {};

  std::vector<kernels::SamplingPenaltyEntry> entries;
  std::vector<kernels::SamplingRowParams> rp(static_cast<size_t>(rows));
  std::vector<int32_t> penalized;
  std::vector<const uint32_t*> masks;  // of the masked rows, by mask_row
  const int64_t words = kernels::sampling_mask_words(vocab_);
  for (int64_t i = 0; i < rows; ++i) {
    LONGCTX_CHECK(states[i] != nullptr && params[i] != nullptr, kBad,
                  "GpuSampler: row {} has no state or params", i);
    const SamplingParams& p = *params[i];
    p.validate();
    kernels::SamplingRowParams& r = rp[i];
    r = sampling_row_params(p, *states[i], vocab_);
    const size_t begin = entries.size();
    append_penalty_entries(p, *states[i], vocab_, entries);
    const std::vector<uint32_t>& mask = states[i]->token_mask();
    LONGCTX_CHECK(mask.empty() || static_cast<int64_t>(mask.size()) == words, kBad,
                  "GpuSampler: row {} has a token mask of {} words for {} logits", i, mask.size(),
                  vocab_);
    if (!mask.empty()) {
      r.mask_row = static_cast<int32_t>(masks.size());
      masks.push_back(mask.data());
    }
    // Only penalized rows need a work copy; the kernels apply a mask as they read the row.
    if (entries.size() > begin) {
      r.work_row = static_cast<int32_t>(penalized.size());
      r.penalty_begin = static_cast<int32_t>(begin);
      r.penalty_count = static_cast<int32_t>(entries.size() - begin);
      penalized.push_back(static_cast<int32_t>(i));
    }
  }
  reserve_penalties(static_cast<int64_t>(entries.size()));

  auto* up = static_cast<uint8_t*>(upload_host_.data_ptr());
  std::memcpy(up, rp.data(), rp.size() * sizeof(rp[0]));
  std::memcpy(up + penalized_offset(max_rows_), penalized.data(),
              penalized.size() * sizeof(int32_t));
  std::memcpy(up + entries_offset(max_rows_), entries.data(), entries.size() * sizeof(entries[0]));
  const size_t upload_bytes = static_cast<size_t>(entries_offset(max_rows_)) +
                              entries.size() * sizeof(kernels::SamplingPenaltyEntry);
  const size_t mask_bytes = static_cast<size_t>(words) * sizeof(uint32_t);
  pack_token_masks(masks, words, reinterpret_cast<uint32_t*>(up + masks_offset()));

  DeviceGuard guard(device_.index);
  cudaStream_t stream = current_cuda_stream(device_.index);
  // The previous call's kernels, the last readers of upload_dev_, finished (it synchronized).
  // Without masks the upload is a few KB, which the event would cost as much as it saves.
  cudaStream_t copies = upload_dev_fresh_ || masks.empty() ? stream : cuda_handle(*upload_stream_);
  auto* dev = static_cast<uint8_t*>(upload_dev_.data_ptr());
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(dev, up, upload_bytes, cudaMemcpyHostToDevice, copies));
  if (!masks.empty()) {
    LONGCTX_CUDA_CHECK(cudaMemcpyAsync(dev + masks_offset(), up + masks_offset(),
                                       masks.size() * mask_bytes, cudaMemcpyHostToDevice, copies));
  }
  if (copies != stream) {
    uploaded_->record(*upload_stream_);
    LONGCTX_CUDA_CHECK(cudaStreamWaitEvent(stream, cuda_handle(*uploaded_), 0));
  }
  upload_dev_fresh_ = false;
  kernels::SamplingBatch batch;
  batch.logits = logits.data<float>();
  batch.logits_stride = logits.strides()[0];
  batch.num_rows = static_cast<int32_t>(rows);
  batch.vocab = static_cast<int32_t>(vocab_);
  batch.rows = reinterpret_cast<const kernels::SamplingRowParams*>(dev);
  batch.work = work_.data<float>();
  batch.penalized_rows = reinterpret_cast<const int32_t*>(dev + penalized_offset(max_rows_));
  batch.num_penalized = static_cast<int32_t>(penalized.size());
  batch.penalties =
      reinterpret_cast<const kernels::SamplingPenaltyEntry*>(dev + entries_offset(max_rows_));
  batch.results = static_cast<kernels::SamplingRowResult*>(results_dev_.data_ptr());
  batch.masks = reinterpret_cast<const uint32_t*>(dev + masks_offset());
  ops::sample_rows(batch, device_);
  const size_t result_bytes = static_cast<size_t>(rows) * sizeof(kernels::SamplingRowResult);
  LONGCTX_CUDA_CHECK(cudaMemcpyAsync(results_host_.data_ptr(), batch.results, result_bytes,
                                     cudaMemcpyDeviceToHost, stream));
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));

  const auto* res = static_cast<const kernels::SamplingRowResult*>(results_host_.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    check_sampling_result(res[i], static_cast<size_t>(i));
    LONGCTX_ASSERT(res[i].token >= 0 && res[i].token < vocab_, "GPU sampler: token {} of row {}",
                   res[i].token, i);
  }
  std::vector<SampleResult> out(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    out[i] = to_sample_result(res[i], *params[i]);
    states[i]->advance();
  }
  return out;
}

#else  // no CUDA

GpuSampler::GpuSampler(int64_t max_rows, int64_t vocab, Device device)
    : max_rows_(max_rows), vocab_(vocab), device_(device) {
  LONGCTX_THROW(ErrorCode::kUnsupported,
                "GpuSampler: this build of longctx has no CUDA backend (configure with "
                "-DLONGCTX_CUDA=ON)");
}

bool GpuSampler::reserve_penalties(int64_t) { return false; }

int64_t GpuSampler::masks_offset() const { return 0; }

int64_t GpuSampler::device_bytes() const { return 0; }

std::vector<SampleResult> GpuSampler::sample(const Tensor&, std::span<SamplerState* const>,
                                             std::span<const SamplingParams* const>) {
  LONGCTX_THROW(ErrorCode::kUnsupported, "GpuSampler: this build of longctx has no CUDA backend");
}

#endif

}  // namespace longctx
