// The KV cache of one sequence for the CPU reference backend: per layer, keys and values of
// every token so far, contiguous by position slot. (The paged GPU cache and host offload build
// on the same notion: slot i holds the i-th token of the sequence.) Each slot also records the
// token's position, which attention compares against query positions (causal by position); for
// an ordinary sequence slot i holds position i. A linear-attention layer keeps its fixed-size
// state here instead (its K/V slots stay unused and untouched).
#pragma once

#include <cstdint>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/loader/model_config.h"

namespace longctx {

class KVCache {
 public:
  // Room for max_tokens tokens of every layer of `config`, fp32.
  KVCache(const ModelConfig& config, int64_t max_tokens);

  int64_t num_layers() const { return static_cast<int64_t>(k_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }  // tokens stored (all layers agree)
  // Called once per forward after every layer wrote its n new tokens.
  void advance(int64_t n);
  // Drops everything past `length` (rollback after a failed/abandoned step).
  void truncate(int64_t length);

  Tensor& k(int64_t layer) { return k_[layer]; }  // [capacity, n_kv_heads, head_dim] f32
  Tensor& v(int64_t layer) { return v_[layer]; }  // [capacity, n_kv_heads, head_dim] f32
  Tensor& positions() { return positions_; }      // [capacity] i64, shared by all layers
  // A linear-attention layer's state after length() tokens (undefined for other layers):
  // recurrent [value_heads, key_head_dim, value_head_dim] and conv [kernel - 1, conv channels]
  // f32, zeros while the cache is empty. Such a cache cannot truncate (the state holds no past).
  Tensor& recurrent_state(int64_t layer) { return recurrent_[layer]; }
  Tensor& conv_state(int64_t layer) { return conv_[layer]; }
  bool has_state() const { return has_state_; }

 private:
  std::vector<Tensor> k_;                 // per layer [capacity, n_kv_heads, head_dim]
  std::vector<Tensor> v_;                 // per layer [capacity, n_kv_heads, head_dim]
  Tensor positions_;                      // [capacity] i64
  std::vector<Tensor> recurrent_, conv_;  // per layer; defined for linear-attention layers
  bool has_state_ = false;
  int64_t capacity_ = 0;
  int64_t length_ = 0;
};

}  // namespace longctx
