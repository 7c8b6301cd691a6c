#include "models/weight_loader.h"

#include <cstring>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/core/pinned_upload.h"

namespace longctx::models {

WeightLoader::WeightLoader(Device device, DType device_dtype)
    : device_(device), device_dtype_(device_dtype) {
  LONGCTX_CHECK(device_.is_cpu() || device_dtype == DType::kBF16 || device_dtype == DType::kF16,
                ErrorCode::kUnsupported, "GPU weights must be bf16 or f16, not {}",
                dtype_name(device_dtype));
  if (device_.is_cuda()) uploader_ = std::make_unique<PinnedUploader>(device_.index);
}

WeightLoader::~WeightLoader() = default;

void WeightLoader::upload_into(const Tensor& src, const Tensor& dst) {
  Tensor s = src.dtype() == device_dtype_ ? src.contiguous() : src.to_dtype(device_dtype_);
  LONGCTX_ASSERT(s.nbytes() == dst.nbytes(), "upload of {} into {}", s.str(), dst.str());
  uploader_->upload(s.data_ptr(), dst.data_ptr(), s.nbytes());
  // A converted copy must outlive its asynchronous upload: the uploader has read it into pinned
  // memory once upload() returns, so nothing needs keeping here.
}

Tensor WeightLoader::load(const Tensor& w) {
  if (!w.defined()) return w;
  if (device_.is_cpu()) return w;
  Tensor d = Tensor::empty(w.shape(), device_dtype_, device_);
  upload_into(w, d);
  return d;
}

Tensor WeightLoader::load_fused(std::initializer_list<Tensor> parts) {
  return load_fused(std::vector<Tensor>(parts));
}

Tensor WeightLoader::load_fused(const std::vector<Tensor>& ps) {
  int64_t defined = 0, rows = 0;
  for (const Tensor& p : ps) {
    if (!p.defined()) continue;
    ++defined;
    // Matrices share their column count; biases (rank 1) are simply concatenated.
    LONGCTX_CHECK(p.rank() == ps[0].rank() && p.dtype() == ps[0].dtype() &&
                      (p.rank() == 1 || p.size(-1) == ps[0].size(-1)),
                  ErrorCode::kInvalidArgument, "fusing weights of different shapes: {} and {}",
                  ps[0].str(), p.str());
    rows += p.size(0);
  }
  if (defined == 0) return Tensor();
  LONGCTX_CHECK(defined == static_cast<int64_t>(ps.size()), ErrorCode::kInvalidArgument,
                "fusing weights: {} of {} parts are missing (e.g. a bias on q_proj but not "
                "k_proj)",
                ps.size() - defined, ps.size());
  Shape shape = ps[0].shape();
  shape[0] = rows;
  const DType dtype = device_.is_cpu() ? ps[0].dtype() : device_dtype_;
  Tensor out = Tensor::empty(shape, dtype, device_);
  int64_t row = 0;
  for (const Tensor& p : ps) {
    Tensor dst = out.slice(0, row, row + p.size(0));
    if (device_.is_cpu())
      dst.copy_from(p);
    else
      upload_into(p, dst);
    row += p.size(0);
  }
  return out;
}

QuantizedWeight WeightLoader::load_packed(const QuantizedWeight& w) {
  if (device_.is_cpu()) return w;
  QuantizedWeight d = w;
  for (Tensor QuantizedWeight::*f : {&QuantizedWeight::qweight, &QuantizedWeight::scales,
                                     &QuantizedWeight::qzeros, &QuantizedWeight::g_idx}) {
    const Tensor& src = w.*f;
    if (!src.defined()) continue;
    Tensor c = src.contiguous();
    d.*f = Tensor::empty(c.shape(), c.dtype(), device_);
    uploader_->upload(c.data_ptr(), (d.*f).data_ptr(), c.nbytes());
  }
  return d;
}

void WeightLoader::finish() {
  if (uploader_) uploader_->finish();
}

}  // namespace longctx::models
