#include "kv/paged_kv_pool.h"

#include <limits>

#include "longctx/core/error.h"

namespace longctx {

int64_t PagedKVPoolConfig::bytes_per_block() const {
  const int64_t scales = fp8() ? num_kv_heads * int64_t(sizeof(float)) : 0;
  return 2 * num_layers *
         (block_size * num_kv_heads * head_dim * static_cast<int64_t>(dtype_size(dtype)) + scales);
}

PagedKVPool::PagedKVPool(const PagedKVPoolConfig& config) : config_(config) {
  LONGCTX_CHECK(config.num_layers > 0 && config.num_kv_heads > 0 && config.head_dim > 0 &&
                    config.block_size > 0 && config.num_blocks > 0,
                ErrorCode::kInvalidArgument,
                "KV pool: layers {}, kv heads {}, head_dim {}, block size {}, blocks {} must all "
                "be positive",
                config.num_layers, config.num_kv_heads, config.head_dim, config.block_size,
                config.num_blocks);
  LONGCTX_CHECK(config.num_blocks <= std::numeric_limits<int32_t>::max() / config.block_size,
                ErrorCode::kOutOfRange, "KV pool: {} blocks of {} tokens overflow int32 slots",
                config.num_blocks, config.block_size);
  const Shape shape = {config.num_blocks, config.block_size, config.num_kv_heads, config.head_dim};
  for (int64_t l = 0; l < config.num_layers; ++l) {
    k_.push_back(Tensor::empty(shape, config.dtype, config.device));
    v_.push_back(Tensor::empty(shape, config.dtype, config.device));
    const Shape scale_shape =
        config.fp8() ? Shape{config.num_blocks, config.num_kv_heads} : Shape{0};
    // Zeroed: a block's scales are defined before its first write (which restarts them).
    k_scale_.push_back(Tensor::zeros(scale_shape, DType::kF32, config.device));
    v_scale_.push_back(Tensor::zeros(scale_shape, DType::kF32, config.device));
  }
  free_.reserve(config.num_blocks);
  for (int64_t b = config.num_blocks; b-- > 0;) free_.push_back(static_cast<int32_t>(b));
  used_.assign(config.num_blocks, 0);
}

std::vector<int32_t> PagedKVPool::allocate(int64_t n) {
  LONGCTX_CHECK(n >= 0, ErrorCode::kInvalidArgument, "KV pool: allocate {} blocks", n);
  LONGCTX_CHECK(n <= num_free_blocks(), ErrorCode::kOutOfMemory,
                "KV pool: {} blocks of {} tokens needed, {} of {} free", n, config_.block_size,
                num_free_blocks(), config_.num_blocks);
  std::vector<int32_t> out(free_.rbegin(), free_.rbegin() + n);
  free_.resize(free_.size() - n);
  for (int32_t b : out) used_[b] = 1;
  return out;
}

void PagedKVPool::free(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    LONGCTX_CHECK(b >= 0 && b < config_.num_blocks && used_[b], ErrorCode::kInternal,
                  "KV pool: freeing block {} that is not allocated", b);
    used_[b] = 0;
    free_.push_back(b);
  }
}

std::vector<const Tensor*> PagedKVPool::block_tensors() const {
  std::vector<const Tensor*> t;
  for (const auto* group : {&k_, &v_}) {
    for (const Tensor& x : *group) t.push_back(&x);
  }
  if (config_.fp8()) {
    for (const auto* group : {&k_scale_, &v_scale_}) {
      for (const Tensor& x : *group) t.push_back(&x);
    }
  }
  return t;
}

void PagedKVPool::check_block_io(int32_t block, size_t bytes) const {
  LONGCTX_CHECK(block >= 0 && block < config_.num_blocks &&
                    static_cast<int64_t>(bytes) == config_.bytes_per_block(),
                ErrorCode::kInternal, "KV pool: block {} (of {}) I/O of {} bytes ({} a block)",
                block, config_.num_blocks, bytes, config_.bytes_per_block());
}

void PagedKVPool::read_block(int32_t block, std::span<std::byte> out) const {
  check_block_io(block, out.size());
  std::byte* p = out.data();
  for (const Tensor* t : block_tensors()) {
    const Tensor src = t->select(0, block);
    Tensor::from_blob(p, src.shape(), src.dtype()).copy_from(src);
    p += src.nbytes();
  }
}

void PagedKVPool::write_block(int32_t block, std::span<const std::byte> in) {
  check_block_io(block, in.size());
  const std::byte* p = in.data();
  for (const Tensor* t : block_tensors()) {
    Tensor dst = t->select(0, block);
    dst.copy_from(Tensor::from_blob(const_cast<std::byte*>(p), dst.shape(), dst.dtype()));
    p += dst.nbytes();
  }
}

void PagedKVPool::read_block_async(int32_t block, std::span<std::byte> out, void* stream) const {
  check_block_io(block, out.size());
  std::byte* p = out.data();
  for (const Tensor* t : block_tensors()) {
    const Tensor src = t->select(0, block);  // one contiguous slab a tensor
    Tensor::from_blob(p, src.shape(), src.dtype()).copy_from_async(src, stream);
    p += src.nbytes();
  }
}

void PagedKVPool::write_block_async(int32_t block, std::span<const std::byte> in, void* stream) {
  check_block_io(block, in.size());
  const std::byte* p = in.data();
  for (const Tensor* t : block_tensors()) {
    Tensor dst = t->select(0, block);
    dst.copy_from_async(Tensor::from_blob(const_cast<std::byte*>(p), dst.shape(), dst.dtype()),
                        stream);
    p += dst.nbytes();
  }
}

}  // namespace longctx
