#include "kv/state_pool.h"

#include <cstring>

#include "core/cuda_runtime.h"
#include "longctx/core/error.h"

namespace longctx {

namespace {

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

StatePool::StatePool(int64_t num_slots, int64_t num_layers, const Shape& recurrent,
                     const Shape& conv, Device device)
    : num_slots_(num_slots),
      num_layers_(num_layers),
      recurrent_shape_(recurrent),
      conv_shape_(conv) {
  LONGCTX_CHECK(num_slots > 0 && num_layers > 0 && !recurrent.empty() && !conv.empty(),
                ErrorCode::kInvalidArgument, "state pool: {} slots of {} layers", num_slots,
                num_layers);
  for (const Shape* s : {&recurrent, &conv})
    for (int64_t d : *s)
      LONGCTX_CHECK(d >= 0, ErrorCode::kInvalidArgument, "state pool: negative state size");
  recurrent_floats_ = numel_of(recurrent);
  conv_floats_ = numel_of(conv);
  slot_floats_ = num_layers * (recurrent_floats_ + conv_floats_);
  // Not zeroed: a slot is reset when a sequence starts in it, and only then touched.
  data_ = Tensor::empty({num_slots * slot_floats_}, DType::kF32, device);
}

float* StatePool::layer_base(int64_t slot, int64_t layer) const {
  LONGCTX_CHECK(slot >= 0 && slot < num_slots_ && layer >= 0 && layer < num_layers_,
                ErrorCode::kOutOfRange,
                "state pool: slot {} layer {} (pool of {} slots, {} layers)", slot, layer,
                num_slots_, num_layers_);
  return data_.data<float>() + slot * slot_floats_ + layer * (recurrent_floats_ + conv_floats_);
}

Tensor StatePool::recurrent(int64_t slot, int64_t layer) const {
  return Tensor::from_blob(layer_base(slot, layer), recurrent_shape_, DType::kF32, device());
}

Tensor StatePool::conv(int64_t slot, int64_t layer) const {
  return Tensor::from_blob(layer_base(slot, layer) + recurrent_floats_, conv_shape_, DType::kF32,
                           device());
}

Tensor StatePool::slot_view(int64_t slot) const {
  return Tensor::from_blob(layer_base(slot, 0), {slot_floats_}, DType::kF32, device());
}

void StatePool::reset(int64_t slot) {
  if (device().is_cuda())
    detail::cuda_memset_zero(layer_base(slot, 0), static_cast<size_t>(slot_bytes()),
                             device().index);
  else
    std::memset(layer_base(slot, 0), 0, static_cast<size_t>(slot_bytes()));
}

void StatePool::copy(int64_t src, int64_t dst) {
  if (src == dst) {
    layer_base(src, 0);  // the range check
    return;
  }
  // On CUDA a device-to-device copy on the current stream (no host wait).
  slot_view(dst).copy_from(slot_view(src));
}

}  // namespace longctx
