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

class Tensor {
 public:
  Tensor() = default;

  // Uninitialized owning tensor from default_allocator(device).
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
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
  // A contiguous copy (or *this when already contiguous).
  Tensor contiguous() const;
  // A copy on `device` (always a new tensor).
  Tensor to(Device device) const;
  // Element-wise copy; shapes and dtypes must match; any devices.
  void copy_from(const Tensor& src);
  // A copy converted to another dtype (CPU only; f32/bf16/f16 among themselves).
  Tensor to_dtype(DType dtype) const;

  std::string shape_str() const;  // "[2, 3, 4]"
  std::string str() const;        // "Tensor(bf16, [2, 3], cpu)"

 private:
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
