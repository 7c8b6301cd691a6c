// Tensor copies on CUDA: the strided gather/scatter kernel against the CPU reference (odd shapes,
// element sizes 1/2/4/8, guard bytes around the output, exact-size inputs for memcheck),
// host <-> device copies of strided views, and copy_from_async round trips through pinned memory.
#include "longctx/core/tensor.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_kernels/harness.h"
#include "longctx/core/cuda_check.h"
#include "longctx/core/error.h"
#include "longctx/core/stream.h"

using namespace longctx;
using gpu_test::GuardedBuffer;

namespace {
const Device kGpu = Device::cuda(0);

DType dtype_of_size(size_t es) {
  return es == 1 ? DType::kU8 : es == 2 ? DType::kBF16 : es == 4 ? DType::kF32 : DType::kI64;
}

int64_t span_of(const Shape& shape, const Shape& strides) {
  int64_t hi = 0;
  for (size_t d = 0; d < shape.size(); ++d) hi += (shape[d] - 1) * strides[d];
  return hi + 1;
}

// Strides of a contiguous layout of `shape` permuted by `perm` (perm[0] outermost), each dim
// padded by pad elements: a transposed / sliced view of a bigger buffer.
Shape permuted_strides(const Shape& shape, const std::vector<int>& perm, int64_t pad) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t k = perm.size(); k-- > 0;) {
    st[perm[k]] = acc;
    acc *= shape[perm[k]] + pad;
  }
  return st;
}

struct ViewCase {
  std::string name;
  Shape shape;
  Shape strides;
};

std::vector<ViewCase> view_cases() {
  return {
      {"transpose 37x129", {37, 129}, {1, 37}},
      {"slice [5,7,33][...,3:30]", {5, 7, 27}, {231, 33, 1}},
      {"permute 0213 [3,5,7,9]", {3, 5, 7, 9}, permuted_strides({3, 5, 7, 9}, {0, 2, 1, 3}, 0)},
      {"rank6 reversed + pad [2,3,5,1,7,3]",
       {2, 3, 5, 1, 7, 3},
       permuted_strides({2, 3, 5, 1, 7, 3}, {5, 4, 3, 2, 1, 0}, 1)},
      {"broadcast stride 0 [4,1000]", {4, 1000}, {0, 1}},
      {"select-like [1,1,13] odd strides", {1, 1, 13}, {999, 17, 3}},
      {"big transpose 2053x1031", {2053, 1031}, {1, 2053}},
      {"kv-like [8 heads, 1000 tok, 128] of [1000, 8, 128]", {8, 1000, 128}, {128, 1024, 1}},
  };
}
}  // namespace

// contiguous() and copy_from() into a guarded contiguous buffer, against the CPU reference.
TEST(TensorGpu, StridedGatherMatchesCpu) {
  std::mt19937 rng(11);
  int checked = 0;
  for (size_t es : {size_t(1), size_t(2), size_t(4), size_t(8)}) {
    for (const ViewCase& c : view_cases()) {
      const DType dt = dtype_of_size(es);
      const int64_t span = span_of(c.shape, c.strides);
      std::vector<uint8_t> host(span * es);
      for (auto& b : host) b = uint8_t(rng());
      // The input has exactly the bytes of its span (cudaMalloc, so memcheck sees over-reads).
      void* dsrc = nullptr;
      ASSERT_EQ(cudaMalloc(&dsrc, host.size()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dsrc, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
      Tensor gsrc = Tensor::from_blob(dsrc, c.shape, dt, kGpu, nullptr, c.strides);
      Tensor csrc = Tensor::from_blob(host.data(), c.shape, dt, Device::cpu(), nullptr, c.strides);
      Tensor want = csrc.contiguous();

      Tensor got = gsrc.contiguous();
      ASSERT_TRUE(got.is_contiguous());
      ASSERT_EQ(got.device(), kGpu);
      Tensor back = got.to(Device::cpu());
      ASSERT_EQ(std::memcmp(back.data_ptr(), want.data_ptr(), want.nbytes()), 0)
          << c.name << " es " << es;

      GuardedBuffer out(want.nbytes());  // NaN-ish 0xFF prefill, guard pattern around
      Tensor gout = Tensor::from_blob(out.data(), c.shape, dt, kGpu);
      gout.copy_from(gsrc);
      std::vector<uint8_t> bytes(want.nbytes());
      out.download(bytes.data());
      EXPECT_EQ(std::memcmp(bytes.data(), want.data_ptr(), want.nbytes()), 0)
          << c.name << " es " << es;
      EXPECT_TRUE(out.guards_intact()) << c.name << " es " << es;
      // Strided CUDA source straight to the host.
      Tensor h = Tensor::empty(c.shape, dt);
      h.copy_from(gsrc);
      EXPECT_EQ(std::memcmp(h.data_ptr(), want.data_ptr(), want.nbytes()), 0) << c.name;
      cudaFree(dsrc);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 32);
}

// A strided CUDA destination (a KV-cache-like slice): only its elements change; everything else
// in the buffer keeps its bytes. Sources: contiguous GPU, strided GPU, host.
TEST(TensorGpu, StridedDestinationMatchesCpu) {
  std::mt19937 rng(5);
  for (size_t es : {size_t(1), size_t(2), size_t(4), size_t(8)}) {
    const DType dt = dtype_of_size(es);
    // Destination: rows [3, 3+17) of dim 1 of a [6, 40, 5, 24] cache, dims 2 and 3 swapped.
    const Shape base = {6, 40, 5, 24};
    const Shape base_st = contiguous_strides(base);
    const Shape shape = {6, 17, 24, 5};
    const Shape dst_st = {base_st[0], base_st[1], base_st[3], base_st[2]};
    const int64_t offset = 3 * base_st[1];
    const int64_t total = shape_numel(base);
    std::vector<uint8_t> init(total * es), src_host(shape_numel(shape) * es);
    for (auto& b : init) b = uint8_t(rng());
    for (auto& b : src_host) b = uint8_t(rng());
    // CPU reference.
    std::vector<uint8_t> want = init;
    Tensor cdst =
        Tensor::from_blob(want.data() + offset * es, shape, dt, Device::cpu(), nullptr, dst_st);
    Tensor csrc = Tensor::from_blob(src_host.data(), shape, dt);
    cdst.copy_from(csrc);

    for (int source = 0; source < 3; ++source) {
      GuardedBuffer buf(init.size());
      buf.upload(init.data());
      Tensor gdst = Tensor::from_blob(static_cast<uint8_t*>(buf.data()) + offset * es, shape, dt,
                                      kGpu, nullptr, dst_st);
      if (source == 0) {
        gdst.copy_from(csrc.to(kGpu));
      } else if (source == 1) {
        // The same values through a transposed GPU view.
        Tensor t = Tensor::empty({shape[0], shape[1], shape[3], shape[2]}, dt, kGpu);
        Tensor ct = Tensor::empty({shape[0], shape[1], shape[3], shape[2]}, dt);
        Tensor ctv = Tensor::from_blob(ct.data_ptr(), shape, dt, Device::cpu(), nullptr,
                                       {shape[1] * 120, 120, 1, 24});
        ctv.copy_from(csrc);
        t.copy_from(ct);
        gdst.copy_from(Tensor::from_blob(t.data_ptr(), shape, dt, kGpu, nullptr,
                                         {shape[1] * 120, 120, 1, 24}));
      } else {
        gdst.copy_from(csrc);  // host -> strided device
      }
      std::vector<uint8_t> got(init.size());
      buf.download(got.data());
      EXPECT_EQ(got, want) << "es " << es << " source " << source;
      EXPECT_TRUE(buf.guards_intact());
    }
  }
}

TEST(TensorGpu, RankAndAlignmentErrorsAreClear) {
  Tensor g = Tensor::empty({128}, DType::kU8, kGpu);
  Tensor v = Tensor::from_blob(g.data_ptr(), {2, 2, 2, 2, 2, 2, 2}, DType::kU8, kGpu, nullptr,
                               {1, 2, 4, 8, 16, 32, 64});
  try {
    v.contiguous();
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
  }
  Tensor mis = Tensor::from_blob(static_cast<char*>(g.data_ptr()) + 2, {3, 4}, DType::kF32, kGpu,
                                 nullptr, {1, 3});
  EXPECT_THROW(mis.contiguous(), Error);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(TensorGpu, CopyFromAsyncRoundTripThroughPinned) {
  Stream s(kGpu);
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(3 << 20) + 7}) {
    Tensor a = Tensor::empty_pinned({n}, DType::kF32);
    Tensor b = Tensor::empty_pinned({n}, DType::kF32);
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, a.data_ptr()), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeHost);  // page-locked
    for (int64_t i = 0; i < n; ++i) a.data<float>()[i] = float(i) * 0.25f - 7.0f;
    std::memset(b.data_ptr(), 0xFF, b.nbytes());
    Tensor d = Tensor::empty({n}, DType::kF32, kGpu);
    Tensor d2 = Tensor::empty({n}, DType::kF32, kGpu);
    Event e0(kGpu, true), e1(kGpu, true);
    e0.record(s);
    d.copy_from_async(a, s.handle());
    d2.copy_from_async(d, s.handle());  // device -> device on the same stream
    b.copy_from_async(d2, s.handle());
    e1.record(s);
    s.synchronize();
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << n;
    if (n > 1000)
      std::printf("  pinned round trip of %.1f MiB (H2D + D2D + D2H): %.3f ms\n",
                  double(a.nbytes()) / (1 << 20), e1.elapsed_ms_since(e0));
  }
  // Contiguity is required (and named).
  Tensor d = Tensor::empty({4, 6}, DType::kF32, kGpu);
  Tensor h = Tensor::empty_pinned({4, 3}, DType::kF32);
  try {
    h.copy_from_async(d.slice(1, 0, 3), s.handle());
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("contiguous"), std::string::npos) << e.what();
  }
}

// Under a StreamGuard every synchronous Tensor copy is ordered on that stream: an upload, a
// gather and a download of data the stream is still producing.
TEST(TensorGpu, CopiesFollowTheCurrentStream) {
  Stream s(kGpu);
  StreamGuard guard(s);
  const int64_t n = 1 << 22;
  Tensor host = Tensor::empty({n}, DType::kI32);
  for (int64_t i = 0; i < n; ++i) host.data<int32_t>()[i] = int32_t(i * 2654435761u);
  Tensor d = host.to(kGpu);
  Tensor view = d.view({1024, 4096}).slice(1, 7, 4000);
  Tensor back = view.contiguous().to(Device::cpu());
  Tensor want = host.view({1024, 4096}).slice(1, 7, 4000).contiguous();
  EXPECT_EQ(std::memcmp(back.data_ptr(), want.data_ptr(), want.nbytes()), 0);
}
