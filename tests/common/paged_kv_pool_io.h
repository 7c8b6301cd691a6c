// One body for the KV store's block I/O on any device (tests/kv on the CPU, tests/gpu_engine on
// CUDA): every block byte written by write_block comes back from read_block, a block's bytes land
// in that block only (its neighbours keep theirs), and the order is the store's (every layer's K,
// then V, then FP8 scales), checked against the pool tensors copied to the host.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
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

}  // namespace longctx::testing
