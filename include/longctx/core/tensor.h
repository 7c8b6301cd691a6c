// Tensor: a typed, shaped, strided view over bytes on one device. Owning tensors hold their
// storage through a shared_ptr; views (slices, checkpoint weights viewed in place in an mmap)
// share or borrow it. Copies of a Tensor object are shallow, like torch.Tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "longctx/core/device.h"
#include "longctx/core/dtype.h"
#include "longctx/core/error.h"

namespace longctx {

using Shape = std::vector<int64_t>;

class Allocator;

class Tensor {
 public:
  Tensor() = default;

  // Uninitialized owning tensor from default_allocator(device) (the device pool for CUDA).
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  // On CUDA the zero-fill is enqueued on current_stream(device.index), without a host wait.
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // Uninitialized page-locked host memory (Device::cpu(), pinned_host_allocator()): the source
  // or destination of truly asynchronous copies. Throws Error(kUnsupported) without CUDA.
  static Tensor empty_pinned(const Shape& shape, DType dtype);
  // A view over memory longctx does not own. `keepalive` (may be null) is held for as long as
  // any view exists, e.g. the mmap of a checkpoint. Empty `strides` means contiguous.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype,
                          Device device = Device::cpu(), std::shared_ptr<void> keepalive = nullptr,
                          const Shape& strides = {});

  bool defined() const { return defined_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t numel() const { return numel_; }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel_) * element_size(); }
  bool is_contiguous() const;

  void* data_ptr() const { return data_; }
  // Typed pointer; asserts sizeof(T) matches the dtype's size (bf16/f16 read as uint16_t).
  template <typename T>
  T* data() const {
    LONGCTX_ASSERT(sizeof(T) == element_size(), "data<T>() size mismatch for {}",
                   dtype_name(dtype_));
    return static_cast<T*>(data_);
  }

  // Contiguous reinterpretation; one dim may be -1.
  Tensor view(const Shape& shape) const;
  // Strided view of [start, end) along dim.
  Tensor slice(int64_t dim, int64_t start, int64_t end) const;
  // Drops dim, taking index idx.
  Tensor select(int64_t dim, int64_t idx) const;
  // Splits dim into `sizes` (their product must equal size(dim)); works on strided views, e.g.
  // [T, Hq * d] columns of a fused QKV output -> [T, Hq, d].
  Tensor unflatten(int64_t dim, const Shape& sizes) const;
  // A contiguous copy (or *this when already contiguous). On CUDA the gather is enqueued on
  // current_stream() (rank <= 6 after merging contiguous dims).
  Tensor contiguous() const;
  // A copy on `device` (always a new tensor).
  Tensor to(Device device) const;
  // Element-wise copy; shapes and dtypes must match; any devices, either side may be strided.
  // Copies that touch host memory have finished on return; device-to-device ones are enqueued on
  // current_stream() of the destination's device (no host wait, like cudaMemcpy D2D).
  void copy_from(const Tensor& src);
  // cudaMemcpyAsync of src's bytes into this tensor on `stream` (a cudaStream_t; nullptr = the
  // legacy default stream). Both contiguous, same shape and dtype, any device pair; CPU -> CPU is
  // a plain memcpy. Asynchronous for host memory only when it is pinned (empty_pinned); both
  // tensors must stay alive until the stream has run the copy.
  void copy_from_async(const Tensor& src, void* stream);
  // A copy converted to another dtype (CPU only; f32/bf16/f16 among themselves).
  Tensor to_dtype(DType dtype) const;

  std::string shape_str() const;  // "[2, 3, 4]"
  std::string str() const;        // "Tensor(bf16, [2, 3], cpu)"

 private:
  static Tensor allocate(const Shape& shape, DType dtype, Device device, Allocator& alloc);

  std::shared_ptr<void> storage_;  // keeps the bytes alive; null for borrowed memory
  void* data_ = nullptr;
  Shape shape_;
  Shape strides_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
  Device device_;
  bool defined_ = false;
};

Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);
std::string shape_to_string(const Shape& shape);

}  // namespace longctx
