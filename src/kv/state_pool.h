// The storage of a state KV group (KvGroupKind::kState: linear-attention layers): a fixed number
// of slots, each holding one sequence's recurrent and conv state for every layer of the group,
// f32, on the CPU or a CUDA device. The BlockManager hands out the slots (a state group's table is
// its slot); the paged backends (CPU and CUDA) give a layer its sequences' states through it. On
// the CPU, pages are touched only when a slot is first used (reset or copied into), so idle
// slots cost address space, not memory; on CUDA the whole pool is allocated up front (the GPU
// memory plan counts it), and reset / copy are enqueued on the device's current stream.
#pragma once

#include <cstdint>

#include "longctx/core/tensor.h"

namespace longctx {

class StatePool {
 public:
  // Throws Error(kInvalidArgument) for a non-positive size.
  StatePool(int64_t num_slots, int64_t num_layers, const Shape& recurrent, const Shape& conv,
            Device device = Device::cpu());

  int64_t num_slots() const { return num_slots_; }
  int64_t num_layers() const { return num_layers_; }
  Device device() const { return data_.device(); }
  // Bytes of one slot (every layer's states).
  int64_t slot_bytes() const { return slot_floats_ * static_cast<int64_t>(sizeof(float)); }
  // Layer j's states in slot s (views of the pool): recurrent and conv as constructed.
  Tensor recurrent(int64_t slot, int64_t layer) const;
  Tensor conv(int64_t slot, int64_t layer) const;
  // Their first elements (range-checked as above): what the device sequence arrays hold.
  float* recurrent_data(int64_t slot, int64_t layer) const { return layer_base(slot, layer); }
  float* conv_data(int64_t slot, int64_t layer) const {
    return layer_base(slot, layer) + recurrent_floats_;
  }
  // Zeros every layer's state of the slot (a sequence starting at its first token).
  void reset(int64_t slot);
  // Copies every layer's state of slot `src` into slot `dst` (a prefix-cache snapshot saved
  // from, or restored into, a sequence's slot).
  void copy(int64_t src, int64_t dst);

 private:
  float* layer_base(int64_t slot, int64_t layer) const;
  Tensor slot_view(int64_t slot) const;  // every layer's states of the slot, flat

  int64_t num_slots_, num_layers_;
  Shape recurrent_shape_, conv_shape_;
  int64_t recurrent_floats_ = 0, conv_floats_ = 0, slot_floats_ = 0;
  Tensor data_;  // [slots * slot_floats_] f32
};

}  // namespace longctx
