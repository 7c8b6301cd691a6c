// Puts checkpoint weights on the model's device. CPU: weights stay views of the checkpoint's
// mmaps (no copy) except fused ones, which are concatenated once. CUDA: every weight is copied
// to the device pool in the activation dtype (bf16, or f16) through pinned staging buffers
// (PinnedUploader: the mmap is read into pinned chunks while earlier chunks cross PCIe), other
// checkpoint dtypes converted on the host.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/loader/quantization.h"

namespace longctx {
class PinnedUploader;
}

namespace longctx::models {

class WeightLoader {
 public:
  // device_dtype: the dtype of weights on a CUDA device (bf16 or f16); unused on the CPU.
  WeightLoader(Device device, DType device_dtype);
  ~WeightLoader();

  // `w` on the device (undefined stays undefined).
  Tensor load(const Tensor& w);
  // The rows of `parts` (each [rows_i, cols], same cols) concatenated: [sum rows_i, cols].
  // Undefined parts are not allowed; returns undefined when every part is undefined.
  Tensor load_fused(std::initializer_list<Tensor> parts);
  Tensor load_fused(const std::vector<Tensor>& parts);
  // A quantized Linear's packed tensors on the device, each in its own dtype (the CPU keeps
  // them as they are).
  QuantizedWeight load_packed(const QuantizedWeight& w);
  // Waits for every copy.
  void finish();

 private:
  // Copies host tensor `src` (contiguous) into `dst` (contiguous, device_, bf16) at row offset.
  void upload_into(const Tensor& src, const Tensor& dst);

  Device device_;
  DType device_dtype_;
  std::unique_ptr<PinnedUploader> uploader_;
};

}  // namespace longctx::models
