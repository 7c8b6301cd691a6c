// The paged KV pool of one device: per layer K and V, each [num_blocks, block_size, kv_heads,
// head_dim] (the layout the paged prefill / decode kernels read), allocated once from the device
// pool so their addresses never change. Block ids are handed out by a free list; the
// BlockManager (prefix caching, ref counts) builds on top of it. An FP8 pool (dtype kFP8E4M3)
// also keeps per layer the fp32 scales of K and V, each [num_blocks, kv_heads]
// (kernels/kv_format.h: one scale per block and KV head, kept by the KV store).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "longctx/core/tensor.h"

namespace longctx {

struct PagedKVPoolConfig {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;  // tokens per block
  int64_t num_blocks = 0;
  DType dtype = DType::kBF16;
  Device device = Device::cpu();
  // FP8 pools: the dtype of the rows the KV store encodes and of the attention's q and o (the
  // model's activations); a 16-bit pool's is `dtype` (compute_dtype()).
  DType fp8_source_dtype = DType::kBF16;

  // K and V of every layer for one block (FP8: and their scales).
  int64_t bytes_per_block() const;
  bool fp8() const { return dtype == DType::kFP8E4M3; }
  DType compute_dtype() const { return fp8() ? fp8_source_dtype : dtype; }
};

class PagedKVPool {
 public:
  // Throws Error(kInvalidArgument) for a non-positive size, Error(kOutOfMemory) (from the device
  // pool) when the blocks do not fit the device budget.
  explicit PagedKVPool(const PagedKVPoolConfig& config);

  const PagedKVPoolConfig& config() const { return config_; }
  int64_t block_size() const { return config_.block_size; }
  int64_t num_blocks() const { return config_.num_blocks; }
  const Tensor& k(int64_t layer) const { return k_[layer]; }  // [blocks, block_size, Hkv, d]
  const Tensor& v(int64_t layer) const { return v_[layer]; }  // [blocks, block_size, Hkv, d]
  // FP8 pools: the scales, f32 [blocks, Hkv]; empty tensors otherwise.
  const Tensor& k_scale(int64_t layer) const { return k_scale_[layer]; }
  const Tensor& v_scale(int64_t layer) const { return v_scale_[layer]; }

  int64_t num_free_blocks() const { return static_cast<int64_t>(free_.size()); }

  // One block's bytes in the KV store's order (config().bytes_per_block() of them): every
  // layer's K, then every layer's V, then (FP8) every layer's K scales, then V scales. On CUDA
  // the copies are synchronous: call them between steps, after the step that wrote the block.
  // Throws Error(kInternal) for a block out of range or a span of another size.
  void read_block(int32_t block, std::span<std::byte> out) const;
  void write_block(int32_t block, std::span<const std::byte> in);
  // The same copies enqueued on `stream` (a cudaStream_t of the pool's device) with no host wait:
  // truly asynchronous when `out` / `in` is pinned host memory, which must stay alive, and the
  // block unwritten, until the stream has run them. A CPU pool copies at once.
  void read_block_async(int32_t block, std::span<std::byte> out, void* stream) const;
  void write_block_async(int32_t block, std::span<const std::byte> in, void* stream);
  // n block ids (lowest first); throws Error(kOutOfMemory) naming the shortfall, allocating none.
  std::vector<int32_t> allocate(int64_t n);
  void free(const std::vector<int32_t>& blocks);

 private:
  // The tensors of read_block's order.
  std::vector<const Tensor*> block_tensors() const;
  void check_block_io(int32_t block, size_t bytes) const;

  PagedKVPoolConfig config_;
  std::vector<Tensor> k_;                  // per layer [num_blocks, block_size, Hkv, d]
  std::vector<Tensor> v_;                  // per layer [num_blocks, block_size, Hkv, d]
  std::vector<Tensor> k_scale_, v_scale_;  // FP8: per layer [num_blocks, Hkv] f32
  std::vector<int32_t> free_;              // free block ids, popped from the back
  std::vector<uint8_t> used_;              // [num_blocks] 1 while allocated (double-free check)
};

}  // namespace longctx
