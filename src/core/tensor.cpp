#include "longctx/core/tensor.h"

#include <cstring>

#include "core/cuda_runtime.h"
#include "core/strided_copy.h"
#include "longctx/core/allocator.h"
#include "longctx/core/stream.h"

namespace longctx {

// Sizes come from files (configs, safetensors headers): a product that overflows would give an
// undersized buffer that later writes run past, so every product here is checked.
Shape contiguous_strides(const Shape& shape) {
  Shape s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    LONGCTX_CHECK(!__builtin_mul_overflow(acc, shape[i], &acc), ErrorCode::kInvalidArgument,
                  "shape {} has more than 2^63 elements", shape_to_string(shape));
  }
  return s;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    LONGCTX_CHECK(!__builtin_mul_overflow(n, d, &n), ErrorCode::kInvalidArgument,
                  "shape {} has more than 2^63 elements", shape_to_string(shape));
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Tensor Tensor::allocate(const Shape& shape, DType dtype, Device device, Allocator& alloc) {
  for (int64_t d : shape)
    LONGCTX_CHECK(d >= 0, ErrorCode::kInvalidArgument, "negative dimension in shape {}",
                  shape_to_string(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.defined_ = true;
  Allocator* a = &alloc;
  int64_t signed_bytes = 0;
  LONGCTX_CHECK(
      !__builtin_mul_overflow(t.numel_, static_cast<int64_t>(dtype_size(dtype)), &signed_bytes),
      ErrorCode::kInvalidArgument, "tensor {} of {} needs more than 2^63 bytes",
      shape_to_string(shape), dtype_name(dtype));
  const auto bytes = static_cast<size_t>(signed_bytes);
  void* p = nullptr;
  try {
    p = a->allocate(bytes);
  } catch (const std::bad_alloc&) {
    LONGCTX_THROW(ErrorCode::kOutOfMemory,
                  "cannot allocate {} bytes ({:.1f} GiB) on {} for a {} "
                  "tensor of shape {}",
                  bytes, bytes / double(1 << 30), device.str(), dtype_name(dtype),
                  shape_to_string(shape));
  }
  t.data_ = p;
  t.storage_ = std::shared_ptr<void>(p, [a, bytes](void* q) { a->deallocate(q, bytes); });
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return allocate(shape, dtype, device, default_allocator(device));
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  return allocate(shape, dtype, Device::cpu(), pinned_host_allocator());
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu())
    std::memset(t.data_, 0, t.nbytes());
  else
    detail::cuda_memset_zero(t.data_, t.nbytes(), device.index);
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device,
                         std::shared_ptr<void> keepalive, const Shape& strides) {
  LONGCTX_ASSERT(strides.empty() || strides.size() == shape.size(), "strides rank mismatch");
  Tensor t;
  t.shape_ = shape;
  t.strides_ = strides.empty() ? contiguous_strides(shape) : strides;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.data_ = data;
  t.storage_ = std::move(keepalive);
  t.defined_ = true;
  return t;
}

int64_t Tensor::size(int64_t dim) const {
  int64_t r = rank();
  if (dim < 0) dim += r;
  LONGCTX_ASSERT(dim >= 0 && dim < r, "dim {} out of range for rank {}", dim, r);
  return shape_[dim];
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  LONGCTX_ASSERT(is_contiguous(), "view() of a non-contiguous tensor {}", str());
  Shape s = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      LONGCTX_ASSERT(infer < 0, "view(): more than one -1");
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[infer] = known ? numel_ / known : 0;
  LONGCTX_ASSERT(shape_numel(s) == numel_, "view {} of {} elements from {}", shape_to_string(s),
                 numel_, str());
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end) const {
  int64_t r = rank();
  if (dim < 0) dim += r;
  LONGCTX_ASSERT(dim >= 0 && dim < r, "slice dim {} of rank {}", dim, r);
  LONGCTX_ASSERT(0 <= start && start <= end && end <= shape_[dim], "slice [{}, {}) of size {}",
                 start, end, shape_[dim]);
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + start * strides_[dim] * int64_t(element_size());
  t.shape_[dim] = end - start;
  t.numel_ = shape_numel(t.shape_);
  return t;
}

Tensor Tensor::select(int64_t dim, int64_t idx) const {
  int64_t r = rank();
  if (dim < 0) dim += r;
  Tensor t = slice(dim, idx, idx + 1);
  t.shape_.erase(t.shape_.begin() + dim);
  t.strides_.erase(t.strides_.begin() + dim);
  return t;
}

namespace {

// Element-wise copy between two views on the same device (CPU reference or CUDA kernel).
void strided_copy(const Tensor& dst, const Tensor& src) {
  const auto p = detail::make_strided_copy_params(
      dst.data_ptr(), dst.strides().data(), src.data_ptr(), src.strides().data(),
      src.shape().data(), static_cast<int>(src.rank()), src.element_size());
  if (dst.device().is_cpu())
    detail::strided_copy_cpu(p);
  else
    detail::strided_copy_cuda(p, dst.device().index);
}

}  // namespace

Tensor Tensor::unflatten(int64_t dim, const Shape& sizes) const {
  const int64_t r = rank();
  if (dim < 0) dim += r;
  LONGCTX_ASSERT(dim >= 0 && dim < r, "unflatten dim {} of rank {}", dim, r);
  LONGCTX_ASSERT(shape_numel(sizes) == shape_[dim], "unflatten {} of size {}",
                 shape_to_string(sizes), shape_[dim]);
  Tensor t = *this;
  t.shape_.erase(t.shape_.begin() + dim);
  t.strides_.erase(t.strides_.begin() + dim);
  int64_t stride = strides_[dim];
  for (size_t k = sizes.size(); k-- > 0;) {
    t.shape_.insert(t.shape_.begin() + dim, sizes[k]);
    t.strides_.insert(t.strides_.begin() + dim, stride);
    stride *= sizes[k];
  }
  return t;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = empty(shape_, dtype_, device_);
  strided_copy(out, *this);
  return out;
}

Tensor Tensor::to(Device device) const {
  Tensor out = empty(shape_, dtype_, device);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  LONGCTX_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, ErrorCode::kInvalidArgument,
                "copy_from: {} into {}", src.str(), str());
  if (numel_ == 0) return;
  if (device_ == src.device_) {
    if (is_contiguous() && src.is_contiguous()) {
      if (device_.is_cpu())
        std::memcpy(data_, src.data_, nbytes());
      else
        detail::cuda_copy_async(data_, device_, src.data_, src.device_, nbytes(),
                                current_stream(device_.index));
    } else {
      strided_copy(*this, src);
    }
    return;
  }
  // Across devices the bytes move contiguous: gather on the source's device, copy, scatter on
  // ours. Temporaries are freed after the copy is ordered on the same stream (pool contract).
  Tensor s = src.contiguous();
  if (is_contiguous()) {
    detail::cuda_copy(data_, device_, s.data_, s.device_, nbytes());
    return;
  }
  Tensor staged = empty(shape_, dtype_, device_);
  detail::cuda_copy(staged.data_, device_, s.data_, s.device_, nbytes());
  strided_copy(*this, staged);
}

void Tensor::copy_from_async(const Tensor& src, void* stream) {
  LONGCTX_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, ErrorCode::kInvalidArgument,
                "copy_from_async: {} into {}", src.str(), str());
  LONGCTX_CHECK(is_contiguous() && src.is_contiguous(), ErrorCode::kInvalidArgument,
                "copy_from_async needs contiguous tensors (use contiguous() first): {} into {}",
                src.str(), str());
  if (numel_ == 0) return;
  if (device_.is_cpu() && src.device_.is_cpu()) {
    std::memcpy(data_, src.data_, nbytes());
    return;
  }
  detail::cuda_copy_async(data_, device_, src.data_, src.device_, nbytes(), stream);
}

Tensor Tensor::to_dtype(DType dtype) const {
  LONGCTX_CHECK(device_.is_cpu(), ErrorCode::kUnsupported, "to_dtype on {}", device_.str());
  Tensor src = contiguous();
  if (dtype == dtype_) return src.to(device_);
  Tensor out = empty(shape_, dtype, device_);
  auto load = [&](int64_t i) -> float {
    switch (dtype_) {
      case DType::kF32:
        return src.data<float>()[i];
      case DType::kBF16:
        return bf16_to_f32(src.data<uint16_t>()[i]);
      case DType::kF16:
        return f16_to_f32(src.data<uint16_t>()[i]);
      default:
        LONGCTX_THROW(ErrorCode::kUnsupported, "to_dtype from {}", dtype_name(dtype_));
    }
  };
  for (int64_t i = 0; i < numel_; ++i) {
    float v = load(i);
    switch (dtype) {
      case DType::kF32:
        out.data<float>()[i] = v;
        break;
      case DType::kBF16:
        out.data<uint16_t>()[i] = f32_to_bf16(v);
        break;
      case DType::kF16:
        out.data<uint16_t>()[i] = f32_to_f16(v);
        break;
      default:
        LONGCTX_THROW(ErrorCode::kUnsupported, "to_dtype to {}", dtype_name(dtype));
    }
  }
  return out;
}

std::string Tensor::shape_str() const { return shape_to_string(shape_); }

std::string Tensor::str() const {
  return fmt::format("Tensor({}, {}, {})", dtype_name(dtype_), shape_str(), device_.str());
}

}  // namespace longctx
