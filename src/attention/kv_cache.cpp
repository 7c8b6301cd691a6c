#include "longctx/attention/kv_cache.h"

namespace longctx {

KVCache::KVCache(const ModelConfig& config, int64_t max_tokens) : capacity_(max_tokens) {
  LONGCTX_CHECK(max_tokens >= 0, ErrorCode::kInvalidArgument, "KVCache: negative capacity {}",
                max_tokens);
  LONGCTX_CHECK(
      config.num_hidden_layers > 0 && config.num_key_value_heads > 0 && config.head_dim > 0,
      ErrorCode::kInvalidArgument,
      "KVCache: config needs layers, kv heads and head_dim (got {}, {}, {})",
      config.num_hidden_layers, config.num_key_value_heads, config.head_dim);
  const Shape shape = {max_tokens, config.num_key_value_heads, config.head_dim};
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    // Not zeroed: slots past length() are never read, and a large cache stays untouched (and
    // mostly unbacked by RAM) until tokens arrive.
    k_.push_back(Tensor::empty(shape, DType::kF32));
    v_.push_back(Tensor::empty(shape, DType::kF32));
  }
  positions_ = Tensor::zeros({max_tokens}, DType::kI64);
  recurrent_.resize(config.num_hidden_layers);
  conv_.resize(config.num_hidden_layers);
  const LinearAttentionConfig& l = config.linear;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    if (config.layer_type(i) != LayerAttention::kLinear) continue;
    LONGCTX_CHECK(l.num_value_heads > 0 && l.key_head_dim > 0 && l.value_head_dim > 0 &&
                      l.conv_kernel_dim > 0,
                  ErrorCode::kInvalidArgument,
                  "KVCache: layer {} is linear attention but the linear_* sizes are not all "
                  "positive",
                  i);
    const int64_t conv_dim =
        2 * l.num_key_heads * l.key_head_dim + l.num_value_heads * l.value_head_dim;
    recurrent_[i] =
        Tensor::zeros({l.num_value_heads, l.key_head_dim, l.value_head_dim}, DType::kF32);
    conv_[i] = Tensor::zeros({l.conv_kernel_dim - 1, conv_dim}, DType::kF32);
    has_state_ = true;
  }
}

void KVCache::advance(int64_t n) {
  LONGCTX_CHECK(n >= 0 && length_ + n <= capacity_, ErrorCode::kOutOfRange,
                "KVCache: cannot advance by {} tokens ({} stored, capacity {})", n, length_,
                capacity_);
  length_ += n;
}

void KVCache::truncate(int64_t length) {
  LONGCTX_CHECK(length >= 0 && length <= length_, ErrorCode::kOutOfRange,
                "KVCache: cannot truncate to {} tokens ({} stored)", length, length_);
  LONGCTX_CHECK(!has_state_ || length == length_, ErrorCode::kUnsupported,
                "KVCache: cannot truncate to {} tokens: its linear-attention state holds {} and "
                "keeps no earlier one",
                length, length_);
  length_ = length;
}

}  // namespace longctx
