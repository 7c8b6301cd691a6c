// CUDA KV store against the CPU reference, through the op-test harness: both caches must equal
// the reference's bytes exactly (a copy has no tolerance), including every slot the kernel must
// not touch (padding tokens, slots past the pool, other pages). Sources are strided views into a
// fused qkv buffer; base offsets and odd rows force each copy width (16 / 8 / 4 / 2 bytes). The
// caches live in guarded buffers, so a slot past the pool that the kernel wrote anyway would hit
// a guard region (they sit right after the last slot); out-of-range slots must raise the
// device-side flag.
#include "kernels/cuda/kv_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>

#include "gpu_kernels/harness.h"
#include "kernels/cpu/kv_store_cpu.h"
#include "longctx/core/error.h"

namespace longctx::gpu_test {
namespace {

struct StoreShape {
  int num_tokens = 1;
  int num_q_heads = 0;  // q heads in front of K in the fused source row
  int num_kv_heads = 1;
  int head_dim = 16;
  int page_size = 16;
  int num_pages = 4;
  DType dtype = DType::kBF16;
  double pad_fraction = 0;        // tokens with slot -1
  std::vector<int> out_of_range;  // tokens given a slot >= num_pages * page_size
  int source_offset = 0;  // elements between the source buffer start and the first q element
  int row_padding = 0;    // extra elements at the end of each fused source row
  bool with_flag = true;
  uint64_t seed = 1;
};

class KvStoreCase : public OpCase {
 public:
  explicit KvStoreCase(StoreShape s) : s_(std::move(s)) {}

  std::string name() const override {
    std::ostringstream os;
    os << "kv_store(T=" << s_.num_tokens << " hq+" << s_.num_q_heads << " hk=" << s_.num_kv_heads
       << " d=" << s_.head_dim << " page=" << s_.page_size << " pages=" << s_.num_pages << " "
       << dtype_name(s_.dtype) << " pad=" << s_.pad_fraction << " oob=" << s_.out_of_range.size()
       << " src+" << s_.source_offset << " row+" << s_.row_padding
       << (s_.with_flag ? "" : " no-flag") << ")";
    return os.str();
  }
  bool supported() const override { return true; }

  void prepare(cudaStream_t) override {
    const size_t es = dtype_size(s_.dtype);
    stride_ = int64_t(s_.num_q_heads + 2 * s_.num_kv_heads) * s_.head_dim + s_.row_padding;
    const int64_t src_elems = s_.source_offset + int64_t(s_.num_tokens) * stride_;
    std::mt19937_64 rng(s_.seed);
    src_.resize(src_elems * es);
    for (auto& b : src_) b = uint8_t(rng());
    const size_t cache_bytes =
        size_t(s_.num_pages) * s_.page_size * s_.num_kv_heads * s_.head_dim * es;
    k_init_.resize(cache_bytes);
    v_init_.resize(cache_bytes);
    for (auto& b : k_init_) b = uint8_t(rng());
    for (auto& b : v_init_) b = uint8_t(rng());
    // Distinct slots in random order; some padding; some past the pool.
    const int64_t capacity = int64_t(s_.num_pages) * s_.page_size;
    std::vector<int64_t> all(capacity);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::bernoulli_distribution pad(s_.pad_fraction);
    slots_.resize(s_.num_tokens);
    for (int t = 0; t < s_.num_tokens; ++t) slots_[t] = pad(rng) ? -1 : all[t];
    const int64_t past[] = {capacity, capacity + 1, capacity + 1000, int64_t(1) << 40};
    for (size_t n = 0; n < s_.out_of_range.size(); ++n) slots_[s_.out_of_range[n]] = past[n % 4];

    d_src_ = upload_vector(src_);
    d_k_ = upload_vector(k_init_);
    d_v_ = upload_vector(v_init_);
    d_slots_ = upload_vector(slots_);
    d_flag_ = GuardedBuffer(sizeof(int), 0);
    params_ = params_over(d_src_.data(), d_k_.data(), d_v_.data(),
                          static_cast<const int64_t*>(d_slots_.data()));
    params_.error_flag = s_.with_flag ? static_cast<int*>(d_flag_.data()) : nullptr;
  }

  void launch(cudaStream_t stream) override { kernels::cuda::kv_store_run(params_, stream); }

  CaseResult check() override {
    CaseResult r;
    // Reference: out-of-range tokens are expected to be skipped, so the reference sees them as
    // padding (it would throw on them: tests/kernels checks that).
    std::vector<int64_t> ref_slots = slots_;
    for (int t : s_.out_of_range) ref_slots[t] = -1;
    std::vector<uint8_t> k_ref = k_init_, v_ref = v_init_;
    kernels::cpu::kv_store(params_over(src_.data(), k_ref.data(), v_ref.data(), ref_slots.data()));
    const std::vector<uint8_t> k = d_k_.download<uint8_t>(), v = d_v_.download<uint8_t>();
    int64_t bad = 0;
    for (size_t i = 0; i < k_ref.size(); ++i) bad += (k[i] != k_ref[i]) + (v[i] != v_ref[i]);
    std::ostringstream why;
    bool ok = true;
    if (bad) ok = false, why << bad << " cache bytes differ from the reference; ";
    if (!d_k_.guards_intact()) ok = false, why << "k_cache guard bytes overwritten; ";
    if (!d_v_.guards_intact()) ok = false, why << "v_cache guard bytes overwritten; ";
    if (!d_src_.guards_intact()) ok = false, why << "source guard bytes overwritten; ";
    const int flag = d_flag_.download<int>()[0];
    const int want_flag = (s_.with_flag && !s_.out_of_range.empty()) ? 1 : 0;
    if (flag != want_flag)
      ok = false, why << "error flag " << flag << ", want " << want_flag << "; ";
    r.max_abs_out = double(bad);
    r.status = ok ? Status::kOk : Status::kFailed;
    r.detail = why.str();
    return r;
  }
  double flops() const override { return 0; }  // a copy

 private:
  kernels::KvStoreParams params_over(const void* src, void* k_cache, void* v_cache,
                                     const int64_t* slots) const {
    const size_t es = dtype_size(s_.dtype);
    const char* base = static_cast<const char*>(src) + size_t(s_.source_offset) * es;
    kernels::KvStoreParams p;
    p.k = base + size_t(s_.num_q_heads) * s_.head_dim * es;
    p.v = base + size_t(s_.num_q_heads + s_.num_kv_heads) * s_.head_dim * es;
    p.k_token_stride = stride_;
    p.v_token_stride = stride_;
    p.k_cache = k_cache;
    p.v_cache = v_cache;
    p.slot_mapping = slots;
    p.num_tokens = s_.num_tokens;
    p.num_kv_heads = s_.num_kv_heads;
    p.head_dim = s_.head_dim;
    p.page_size = s_.page_size;
    p.num_pages = s_.num_pages;
    p.dtype = s_.dtype;
    return p;
  }

  StoreShape s_;
  int64_t stride_ = 0;
  std::vector<uint8_t> src_, k_init_, v_init_;
  std::vector<int64_t> slots_;
  GuardedBuffer d_src_, d_k_, d_v_, d_slots_, d_flag_;
  kernels::KvStoreParams params_;
};

StoreShape sshape(int t, int hq, int hk, int d, int page, int pages, DType dt, double pad = 0,
                  std::vector<int> oob = {}, int src_off = 0, int row_pad = 0, uint64_t seed = 1) {
  StoreShape s;
  s.num_tokens = t;
  s.num_q_heads = hq;
  s.num_kv_heads = hk;
  s.head_dim = d;
  s.page_size = page;
  s.num_pages = pages;
  s.dtype = dt;
  s.pad_fraction = pad;
  s.out_of_range = std::move(oob);
  s.source_offset = src_off;
  s.row_padding = row_pad;
  s.seed = seed;
  return s;
}

// The model shapes (fused qkv sources, 16-byte path), odd shapes, each copy width, padding.
TEST(KvStoreGpu, ShapesWidthsAndPadding) {
  std::vector<std::unique_ptr<OpCase>> cases;
  const DType bf = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  uint64_t seed = 100;
  // Llama-3.1-8B (32 q / 8 kv x 128): an 8K prefill chunk and a decode batch.
  cases.push_back(std::make_unique<KvStoreCase>(sshape(8192, 32, 8, 128, 16, 600, bf, 0.01)));
  cases.push_back(std::make_unique<KvStoreCase>(sshape(37, 32, 8, 128, 256, 3, bf, 0.1)));
  // Test models: tiny-llama3 (8/2 x 16), tiny-qwen2 (4/2 x 32), needle (4/2 x 64).
  for (int page : {1, 16, 64}) {
    cases.push_back(std::make_unique<KvStoreCase>(
        sshape(300, 8, 2, 16, page, 600 / page + 3, bf, 0.2, {}, 0, 0, seed++)));
    cases.push_back(std::make_unique<KvStoreCase>(
        sshape(129, 4, 2, 32, page, 300 / page + 2, f16, 0.0, {}, 0, 0, seed++)));
    cases.push_back(std::make_unique<KvStoreCase>(
        sshape(7, 4, 2, 64, page, 40 / page + 1, f32, 0.3, {}, 0, 0, seed++)));
  }
  // Widths: 8 bytes (bf16, row of 12 elements), 4 (f32 d=3; bf16 offset by 2 elements), 2 (bf16
  // offset by one element; f16 with an odd row stride and no q heads), 16 with a padded stride.
  cases.push_back(std::make_unique<KvStoreCase>(sshape(50, 1, 1, 12, 7, 9, bf, 0.1)));
  cases.push_back(std::make_unique<KvStoreCase>(sshape(50, 2, 1, 3, 5, 11, f32, 0.1)));
  cases.push_back(std::make_unique<KvStoreCase>(sshape(50, 2, 2, 16, 16, 4, bf, 0, {}, 2)));
  cases.push_back(std::make_unique<KvStoreCase>(sshape(50, 2, 2, 16, 16, 4, bf, 0, {}, 1)));
  cases.push_back(std::make_unique<KvStoreCase>(sshape(50, 0, 3, 8, 3, 20, f16, 0, {}, 0, 1)));
  cases.push_back(std::make_unique<KvStoreCase>(sshape(50, 4, 2, 64, 16, 4, bf, 0, {}, 0, 8)));
  cases.push_back(std::make_unique<KvStoreCase>(sshape(1, 0, 1, 8, 1, 1, bf)));
  // Every token padding.
  cases.push_back(std::make_unique<KvStoreCase>(sshape(20, 1, 1, 32, 16, 2, bf, 1.0)));
  // Rows wider than a CTA (40 heads x 128 x f32 = 1280 16-byte vectors).
  cases.push_back(std::make_unique<KvStoreCase>(sshape(9, 0, 40, 128, 4, 3, f32, 0.1)));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, int(cases.size()));
}

// Slots past the pool: skipped (guards and other slots intact) and flagged; without a flag
// pointer still skipped, no fault. The first such slot is exactly one past the last slot, so a
// kernel that wrote it would overwrite the guard region after the cache.
TEST(KvStoreGpu, OutOfRangeSlotsAreSkippedAndFlagged) {
  std::vector<std::unique_ptr<OpCase>> cases;
  const DType bf = DType::kBF16;
  cases.push_back(std::make_unique<KvStoreCase>(sshape(40, 4, 2, 16, 16, 3, bf, 0.1, {5})));
  cases.push_back(
      std::make_unique<KvStoreCase>(sshape(40, 4, 2, 32, 1, 64, bf, 0.1, {0, 13, 39, 20})));
  cases.push_back(std::make_unique<KvStoreCase>(
      sshape(33, 32, 8, 128, 16, 3, DType::kF16, 0.0, {32, 1, 2, 3}, 1)));  // 2-byte path
  StoreShape no_flag = sshape(40, 4, 2, 16, 16, 3, bf, 0.1, {7, 8});
  no_flag.with_flag = false;
  cases.push_back(std::make_unique<KvStoreCase>(no_flag));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 4);
}

TEST(KvStoreGpu, BadParamsThrowBeforeLaunch) {
  GuardedBuffer src(1024), kc(1024), vc(1024), slots(64, 0);
  kernels::KvStoreParams p;
  p.k = src.data();
  p.v = static_cast<char*>(src.data()) + 128;
  p.k_token_stride = p.v_token_stride = 16;
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.slot_mapping = static_cast<const int64_t*>(slots.data());
  p.num_tokens = 4;
  p.num_kv_heads = 1;
  p.head_dim = 16;
  p.page_size = 4;
  p.num_pages = 8;
  p.dtype = DType::kBF16;
  kernels::KvStoreParams q = p;
  q.k_token_stride = 8;
  EXPECT_THROW(kernels::cuda::kv_store_run(q, nullptr), Error);
  q = p;
  q.k = static_cast<const char*>(src.data()) + 1;  // not aligned to a bf16 element
  try {
    kernels::cuda::kv_store_run(q, nullptr);
    ADD_FAILURE() << "misaligned source accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  q = p;
  q.dtype = DType::kU8;
  try {
    kernels::cuda::kv_store_run(q, nullptr);
    ADD_FAILURE() << "u8 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  LONGCTX_CUDA_CHECK(cudaDeviceSynchronize());
}

// The launch can be captured in a CUDA graph and replays to the same bytes.
TEST(KvStoreGpu, CudaGraphReplay) {
  KvStoreCase c(sshape(300, 8, 2, 16, 16, 40, DType::kBF16, 0.1, {3}));
  cudaStream_t stream;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  c.prepare(stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  c.launch(stream);
  LONGCTX_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  LONGCTX_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  const CaseResult r = c.check();
  EXPECT_EQ(r.status, Status::kOk) << r.detail;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A reduced set for compute-sanitizer.
TEST(KvStoreGpu, Small) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(
      std::make_unique<KvStoreCase>(sshape(40, 4, 2, 16, 16, 3, DType::kBF16, 0.1, {5, 6})));
  cases.push_back(std::make_unique<KvStoreCase>(sshape(9, 1, 1, 12, 7, 2, DType::kF16, 0, {}, 1)));
  cases.push_back(std::make_unique<KvStoreCase>(sshape(5, 0, 40, 128, 4, 2, DType::kF32)));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 3);
}

}  // namespace
}  // namespace longctx::gpu_test
