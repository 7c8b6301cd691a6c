// One body for the KV store's block I/O on any device (tests/kv on the CPU, tests/gpu_engine on
// CUDA): every block byte written by write_block comes back from read_block, a block's bytes land
// in that block only (its neighbours keep theirs), and the order is the store's (every layer's K,
// then V, then FP8 scales), checked against the pool tensors copied to the host. The
// asynchronous copies (read_block_async / write_block_async, the GPU engine's on a copy stream
// from and into pinned memory) give the synchronous ones' bytes once their stream is synchronized.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <vector>

#include "kv/paged_kv_pool.h"
#include "longctx/core/error.h"

namespace longctx::testing {

inline std::vector<std::byte> pattern_bytes(size_t n, uint32_t seed) {
  std::vector<std::byte> b(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : b) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    v = static_cast<std::byte>(x);
  }
  return b;
}

inline void check_block_io_round_trip(Device device, DType dtype) {
  PagedKVPoolConfig c;
  c.num_layers = 3;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.block_size = 5;
  c.num_blocks = 4;
  c.dtype = dtype;
  c.device = device;
  PagedKVPool pool(c);
  const auto n = static_cast<size_t>(c.bytes_per_block());
  std::vector<std::vector<std::byte>> written;
  for (int32_t b = 0; b < c.num_blocks; ++b) {
    written.push_back(pattern_bytes(n, static_cast<uint32_t>(b + 1)));
    pool.write_block(b, written.back());
  }
  // Rewriting block 2 leaves 1 and 3 as they were.
  written[2] = pattern_bytes(n, 99);
  pool.write_block(2, written[2]);
  for (int32_t b = 0; b < c.num_blocks; ++b) {
    std::vector<std::byte> got(n);
    pool.read_block(b, got);
    EXPECT_EQ(std::memcmp(got.data(), written[b].data(), n), 0) << "block " << b;
  }
  // The store's order: layer 0's K starts the block, the last layer's V ends its 16-bit part.
  const Tensor k0 = pool.k(0).select(0, 1).to(Device::cpu());
  EXPECT_EQ(std::memcmp(k0.data_ptr(), written[1].data(), k0.nbytes()), 0);
  const Tensor v_last = pool.v(c.num_layers - 1).select(0, 1).to(Device::cpu());
  const size_t kv_bytes = 2 * c.num_layers * k0.nbytes();
  EXPECT_EQ(std::memcmp(v_last.data_ptr(), written[1].data() + kv_bytes - v_last.nbytes(),
                        v_last.nbytes()),
            0);
  if (c.fp8()) {
    const Tensor s = pool.k_scale(0).select(0, 1).to(Device::cpu());
    EXPECT_EQ(std::memcmp(s.data_ptr(), written[1].data() + kv_bytes, s.nbytes()), 0);
  }
  // A block out of range or a span of another size is refused, naming the sizes.
  std::vector<std::byte> bad(n + 1);
  EXPECT_THROW(pool.read_block(0, bad), Error);
  EXPECT_THROW(pool.write_block(static_cast<int32_t>(c.num_blocks), written[0]), Error);
}

// `host(n)`: a host buffer of n bytes (pinned for CUDA); `stream`: the copies' stream (a
// cudaStream_t; nullptr on the CPU) and `sync` waits for it.
inline void check_async_block_io(Device device, DType dtype, void* stream,
                                 const std::function<Tensor(int64_t)>& host,
                                 const std::function<void()>& sync) {
  PagedKVPoolConfig c;
  c.num_layers = 3;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.block_size = 5;
  c.num_blocks = 4;
  c.dtype = dtype;
  c.device = device;
  PagedKVPool pool(c);
  const int64_t n = c.bytes_per_block();
  std::vector<std::vector<std::byte>> written;
  std::vector<Tensor> staged;  // alive until the stream ran the copies
  for (int32_t b = 0; b < c.num_blocks; ++b) {
    written.push_back(pattern_bytes(static_cast<size_t>(n), static_cast<uint32_t>(b + 7)));
    staged.push_back(host(n));
    std::memcpy(staged.back().data_ptr(), written.back().data(), static_cast<size_t>(n));
    pool.write_block_async(
        b, {static_cast<const std::byte*>(staged.back().data_ptr()), static_cast<size_t>(n)},
        stream);
  }
  sync();
  std::vector<Tensor> read;
  for (int32_t b = 0; b < c.num_blocks; ++b) {
    read.push_back(host(n));
    std::memset(read.back().data_ptr(), 0, static_cast<size_t>(n));
    pool.read_block_async(
        b, {static_cast<std::byte*>(read.back().data_ptr()), static_cast<size_t>(n)}, stream);
  }
  sync();
  for (int32_t b = 0; b < c.num_blocks; ++b) {
    EXPECT_EQ(std::memcmp(read[b].data_ptr(), written[b].data(), static_cast<size_t>(n)), 0)
        << "block " << b;
    std::vector<std::byte> sync_read(static_cast<size_t>(n));
    pool.read_block(b, sync_read);
    EXPECT_EQ(std::memcmp(sync_read.data(), written[b].data(), static_cast<size_t>(n)), 0)
        << "block " << b;
  }
  std::vector<std::byte> bad(static_cast<size_t>(n) + 1);
  EXPECT_THROW(pool.read_block_async(0, bad, stream), Error);
  EXPECT_THROW(pool.write_block_async(static_cast<int32_t>(c.num_blocks), written[0], stream),
               Error);
}

}  // namespace longctx::testing
