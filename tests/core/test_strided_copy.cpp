// The strided copy behind Tensor::contiguous() / copy_from(): dim merging and the CPU reference
// against a naive per-element copy, strided destinations, and the rank limit.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/strided_copy.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"

using namespace longctx;

namespace {

// Offset (in elements) of linear index i of `shape` under `strides`.
int64_t offset_of(int64_t i, const Shape& shape, const Shape& strides) {
  int64_t off = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

int64_t span_of(const Shape& shape, const Shape& strides) {
  int64_t hi = 0;
  for (size_t d = 0; d < shape.size(); ++d) hi += (shape[d] - 1) * strides[d];
  return hi + 1;
}

DType dtype_of_size(size_t es) {
  return es == 1 ? DType::kU8 : es == 2 ? DType::kBF16 : es == 4 ? DType::kF32 : DType::kI64;
}

}  // namespace

TEST(StridedCopy, MergesContiguousDims) {
  // A slice of the last dim of a contiguous [4, 5, 6]: dims 0 and 1 merge, the last stays.
  const int64_t shape[] = {4, 5, 3}, src_s[] = {30, 6, 1}, dst_s[] = {15, 3, 1};
  int32_t src[120], dst[60];
  auto p = detail::make_strided_copy_params(dst, dst_s, src, src_s, shape, 3, 4);
  ASSERT_EQ(p.rank, 2);
  EXPECT_EQ(p.shape[0], 20);
  EXPECT_EQ(p.shape[1], 3);
  EXPECT_EQ(p.src_strides[0], 6);
  // Fully contiguous on both sides and size-1 dims: one dim.
  const int64_t s2[] = {1, 4, 1, 6}, st2[] = {24, 6, 6, 1};
  p = detail::make_strided_copy_params(dst, st2, src, st2, s2, 4, 4);
  ASSERT_EQ(p.rank, 1);
  EXPECT_EQ(p.shape[0], 24);
  // Rank 0 / all ones: one element.
  p = detail::make_strided_copy_params(dst, nullptr, src, nullptr, nullptr, 0, 4);
  EXPECT_EQ(p.rank, 1);
  EXPECT_EQ(p.numel, 1);
}

TEST(StridedCopy, RankAndElementSizeLimits) {
  // Rank 7 with no mergeable pair (every dim reversed in order).
  Shape shape = {2, 2, 2, 2, 2, 2, 2};
  Shape strides = {1, 2, 4, 8, 16, 32, 64};
  std::vector<uint8_t> buf(128);
  Tensor src = Tensor::from_blob(buf.data(), shape, DType::kU8, Device::cpu(), nullptr, strides);
  try {
    src.contiguous();
    ADD_FAILURE() << "rank 7 must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("7 dims remain"), std::string::npos) << e.what();
  }
  int64_t one = 1;
  EXPECT_THROW(detail::make_strided_copy_params(buf.data(), &one, buf.data(), &one, &one, 1, 3),
               Error);
  // Misaligned pointers for the element size.
  EXPECT_THROW(detail::make_strided_copy_params(buf.data() + 1, &one, buf.data(), &one, &one, 1, 4),
               Error);
}

// Random views (permutations, slices, stride-0 broadcasts) of random buffers, every element size,
// both as a gather (contiguous()) and into a strided destination (copy_from).
TEST(StridedCopy, MatchesNaiveCopy) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t es = size_t{1} << (trial % 4);
    const int rank = 1 + int(rng() % 6);
    Shape shape(rank);
    for (auto& d : shape) d = 1 + rng() % 7;
    // Source strides: a permuted contiguous layout of a larger (padded) base, sometimes 0.
    auto random_strides = [&](bool allow_zero) {
      std::vector<int> perm(rank);
      for (int i = 0; i < rank; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      Shape st(rank);
      int64_t acc = 1;
      for (int k = rank; k-- > 0;) {
        const int d = perm[k];
        st[d] = (allow_zero && rng() % 8 == 0) ? 0 : acc;
        acc *= shape[d] + int64_t(rng() % 3);
      }
      return st;
    };
    const Shape ss = random_strides(true), ds = random_strides(false);
    const DType dt = dtype_of_size(es);
    std::vector<uint8_t> src_buf(span_of(shape, ss) * es), dst_buf(span_of(shape, ds) * es, 0xEE);
    for (auto& b : src_buf) b = uint8_t(rng());
    std::vector<uint8_t> want = dst_buf;
    const int64_t n = shape_numel(shape);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(&want[offset_of(i, shape, ds) * es], &src_buf[offset_of(i, shape, ss) * es], es);

    Tensor src = Tensor::from_blob(src_buf.data(), shape, dt, Device::cpu(), nullptr, ss);
    Tensor dst = Tensor::from_blob(dst_buf.data(), shape, dt, Device::cpu(), nullptr, ds);
    dst.copy_from(src);
    ASSERT_EQ(dst_buf, want) << "trial " << trial << " " << shape_to_string(shape) << " src "
                             << shape_to_string(ss) << " dst " << shape_to_string(ds);
    Tensor c = src.contiguous();
    ASSERT_TRUE(c.is_contiguous());
    const auto* cb = static_cast<const uint8_t*>(c.data_ptr());
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(cb + i * es, &src_buf[offset_of(i, shape, ss) * es], es), 0)
          << "trial " << trial << " element " << i;
  }
}

TEST(Tensor, CopyFromAsyncOnCpuAndChecks) {
  Tensor a = Tensor::empty({3, 5}, DType::kF32);
  for (int i = 0; i < 15; ++i) a.data<float>()[i] = float(i) * 0.5f;
  Tensor b = Tensor::empty({3, 5}, DType::kF32);
  b.copy_from_async(a, nullptr);  // CPU -> CPU: a memcpy
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0);
  EXPECT_THROW(b.slice(1, 0, 2).copy_from_async(a.slice(1, 1, 3), nullptr), Error);
  EXPECT_THROW(b.copy_from_async(Tensor::empty({15}, DType::kF32), nullptr), Error);
#ifndef LONGCTX_WITH_CUDA
  EXPECT_THROW(Tensor::empty_pinned({4}, DType::kF32), Error);
  EXPECT_THROW(Tensor::zeros({4}, DType::kF32, Device::cuda(0)), Error);
#endif
}
