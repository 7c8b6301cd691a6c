// PinnedUploader: ~2 GB from pageable memory in several calls of odd sizes arrives byte-exact
// (checksums and memcmp), with the GB/s printed next to a plain pageable cudaMemcpy; small
// chunks / one buffer; bad destinations.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/core/parallel.h"
#include "longctx/core/pinned_upload.h"
#include "longctx/core/tensor.h"

using namespace longctx;

namespace {
const Device kGpu = Device::cuda(0);

// Fills with a position-dependent pattern, in parallel (first touch of fresh pageable pages).
void fill_pattern(uint8_t* p, size_t n, uint64_t seed) {
  parallel_for(int64_t((n + (1 << 20) - 1) >> 20), [&](int64_t b, int64_t e) {
    for (size_t i = size_t(b) << 20; i < std::min(n, size_t(e) << 20); i += 8) {
      uint64_t x = (i + seed) * 0x9E3779B97F4A7C15ull;
      x ^= x >> 29;
      std::memcpy(p + i, &x, std::min<size_t>(8, n - i));
    }
  });
}

// Order-dependent checksum per 1 MiB block, folded.
uint64_t checksum(const uint8_t* p, size_t n) {
  const int64_t blocks = int64_t((n + (1 << 20) - 1) >> 20);
  std::vector<uint64_t> part(blocks);
  parallel_for(blocks, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      uint64_t h = 1469598103934665603ull ^ uint64_t(k);
      for (size_t i = size_t(k) << 20; i < std::min(n, size_t(k + 1) << 20); ++i)
        h = (h ^ p[i]) * 1099511628211ull;
      part[k] = h;
    }
  });
  uint64_t h = 0;
  for (uint64_t v : part) h = h * 31 + v;
  return h;
}
}  // namespace

TEST(PinnedUploader, TwoGigabytesFromPageableMemory) {
  const size_t n = (size_t{2} << 30) + 12345;  // not a multiple of the chunk
  std::unique_ptr<uint8_t[]> src(new uint8_t[n]);
  fill_pattern(src.get(), n, 1);
  Tensor dev = Tensor::empty({int64_t(n)}, DType::kU8, kGpu);
  auto* d = static_cast<uint8_t*>(dev.data_ptr());

  PinnedUploader up(0);
  // As a loader would: many tensors of odd sizes, back to back.
  const size_t parts[] = {1, 4095, (size_t{1} << 20) + 3, size_t{300} << 20, (size_t{64} << 20)};
  size_t off = 0;
  for (size_t p : parts) {
    up.upload(src.get() + off, d + off, p);
    off += p;
  }
  up.upload(src.get() + off, d + off, n - off);
  up.finish();
  EXPECT_EQ(up.bytes(), n);
  const double gbs = double(n) / up.seconds() / 1e9;

  // Reference speed: one pageable cudaMemcpy of the same bytes.
  Tensor dev2 = Tensor::empty({int64_t(n)}, DType::kU8, kGpu);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(cudaMemcpy(dev2.data_ptr(), src.get(), n, cudaMemcpyHostToDevice), cudaSuccess);
  const double plain_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "  PinnedUploader: %.2f GB in %.3f s = %.1f GB/s (%d threads); pageable cudaMemcpy "
      "%.1f GB/s\n",
      double(n) / 1e9, up.seconds(), gbs, num_threads(), double(n) / plain_s / 1e9);

  std::unique_ptr<uint8_t[]> back(new uint8_t[n]);
  ASSERT_EQ(cudaMemcpy(back.get(), d, n, cudaMemcpyDeviceToHost), cudaSuccess);
  const uint64_t want = checksum(src.get(), n), got = checksum(back.get(), n);
  std::printf("  checksum src %016llx device %016llx\n", (unsigned long long)want,
              (unsigned long long)got);
  EXPECT_EQ(got, want);
  EXPECT_EQ(std::memcmp(back.get(), src.get(), n), 0);
  EXPECT_GT(gbs, 1.0);  // sanity: a broken pipeline (one sync per byte range) is far slower
}

TEST(PinnedUploader, SmallChunksOneBufferAndRounds) {
  for (int buffers : {1, 2, 3}) {
    const size_t n = (size_t{37} << 20) + 777;
    std::vector<uint8_t> src(n);
    fill_pattern(src.data(), n, uint64_t(buffers));
    Tensor dev = Tensor::empty({int64_t(n)}, DType::kU8, kGpu);
    auto* d = static_cast<uint8_t*>(dev.data_ptr());
    PinnedUploader up(0, (size_t{1} << 20) + 3, buffers);  // odd chunk size
    up.upload(src.data(), d, n / 2);
    up.finish();
    const double first = up.seconds();
    EXPECT_GT(first, 0.0);
    up.upload(src.data() + n / 2, d + n / 2, n - n / 2);
    up.upload(src.data(), d, 0);  // nothing
    up.finish();
    EXPECT_GE(up.seconds(), first);
    EXPECT_EQ(up.bytes(), n);
    std::vector<uint8_t> back(n);
    ASSERT_EQ(cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, src) << buffers << " buffer(s)";
  }
}

TEST(PinnedUploader, BadArgumentsAreClear) {
  auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  EXPECT_EQ(code_of([] { PinnedUploader u(0, 0); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { PinnedUploader u(0, 1 << 20, 0); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { PinnedUploader u(64); }), ErrorCode::kInvalidArgument);
  PinnedUploader up(0, 1 << 20, 2);
  std::vector<uint8_t> host(4096), other(4096);
  EXPECT_EQ(code_of([&] { up.upload(host.data(), other.data(), 4096); }),
            ErrorCode::kInvalidArgument);  // host destination
  EXPECT_EQ(code_of([&] { up.upload(nullptr, other.data(), 4096); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  up.finish();
}
