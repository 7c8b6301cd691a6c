// RaggedBlockCausalAttention on CUDA (the paged prefill kernel with one-token pages) against
// dense attention with the block-causal mask built from the definition (double precision, all
// rows of small layouts, a sample of block/span edges and a stride for large ones), and graph
// mode: several layouts of one bucket replayed through ONE captured CUDA graph equal eager runs
// bit for bit. Tolerance: output max-abs <= 2e-2 (bf16) / 4e-3 (f16), as the prefill kernel's.
#include "longctx/attention/block_causal.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <set>
#include <sstream>

#include "gpu_kernels/harness.h"
#include "kernels/block_causal_test_util.h"
#include "longctx/core/tensor.h"

namespace longctx::gpu_test {
namespace {

struct BcShape {
  std::vector<int64_t> seg;
  int64_t block;
  int hq, hk, d;
  DType dt;
  int64_t extra_rows = 0;  // rows past the total in q/k/v/out (must stay untouched garbage)
  uint32_t seed = 1;
};

Tensor device_tensor(const std::vector<uint16_t>& h, const Shape& shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt, Device::cuda());
  LONGCTX_CUDA_CHECK(cudaMemcpy(t.data_ptr(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return t;
}

BlockCausalOptions bc_options(const BcShape& s) {
  BlockCausalOptions o;
  o.num_qo_heads = s.hq;
  o.num_kv_heads = s.hk;
  o.head_dim = s.d;
  o.block_size = s.block;
  o.q_dtype = s.dt;
  o.device = Device::cuda();
  return o;
}

int64_t total_of(const std::vector<int64_t>& seg) {
  return std::accumulate(seg.begin(), seg.end(), int64_t(0));
}

class BlockCausalCase : public OpCase {
 public:
  explicit BlockCausalCase(BcShape s) : s_(std::move(s)) {}
  std::string name() const override {
    std::ostringstream os;
    os << "block_causal(spans=" << s_.seg.size() << " total=" << total_of(s_.seg)
       << " B=" << s_.block << " h=" << s_.hq << "/" << s_.hk << " d=" << s_.d << " "
       << dtype_name(s_.dt) << ")";
    return os.str();
  }
  bool supported() const override { return true; }
  void prepare(cudaStream_t stream) override {
    const int64_t n = total_of(s_.seg) + s_.extra_rows;
    qh_ = testing::random_half(n * s_.hq * s_.d, s_.dt, s_.seed);
    kh_ = testing::random_half(n * s_.hk * s_.d, s_.dt, s_.seed + 1);
    vh_ = testing::random_half(n * s_.hk * s_.d, s_.dt, s_.seed + 2);
    q_ = device_tensor(qh_, {n, s_.hq, s_.d}, s_.dt);
    k_ = device_tensor(kh_, {n, s_.hk, s_.d}, s_.dt);
    v_ = device_tensor(vh_, {n, s_.hk, s_.d}, s_.dt);
    d_o_ = GuardedBuffer(qh_.size() * 2, 0xFF);
    out_ = Tensor::from_blob(d_o_.data(), {n, s_.hq, s_.d}, s_.dt, Device::cuda());
    const int64_t total = total_of(s_.seg);
    const int64_t nb = max_blocks(int64_t(s_.seg.size()), total, s_.block);
    d_ws_ = GuardedBuffer(
        RaggedBlockCausalAttention::workspace_bytes(s_.hq, s_.hk, total, s_.block, nb), 0);
    ws_ = Tensor::from_blob(d_ws_.data(), {int64_t(d_ws_.bytes())}, DType::kU8, Device::cuda());
    attn_ = std::make_unique<RaggedBlockCausalAttention>(ws_, bc_options(s_));
    attn_->plan(s_.seg, stream);
  }
  void launch(cudaStream_t stream) override { attn_->run(q_, k_, v_, out_, stream); }
  CaseResult check() override {
    const int64_t total = total_of(s_.seg);
    std::vector<int64_t> rows = rows_to_check(total);
    auto ref = testing::dense_block_causal(qh_, kh_, vh_, s_.seg, s_.block, s_.hq, s_.hk, s_.d,
                                           s_.dt, 1.0 / std::sqrt(double(s_.d)), rows);
    std::vector<uint16_t> o = d_o_.download<uint16_t>();
    CaseResult r;
    std::ostringstream why;
    if (rows.size() < size_t(total)) why << "[sampled " << rows.size() << " rows] ";
    bool ok = true;
    int64_t non_finite = 0;
    const int64_t row = int64_t(s_.hq) * s_.d;
    for (int64_t i = 0; i < total * row; ++i)
      non_finite += !std::isfinite(half_bits_to_f32(o[i], s_.dt));
    for (size_t k = 0; k < rows.size(); ++k)
      for (int64_t e = 0; e < row; ++e)
        r.max_abs_out =
            std::max(r.max_abs_out,
                     std::abs(half_bits_to_f32(o[rows[k] * row + e], s_.dt) - ref[k * row + e]));
    const double tol = s_.dt == DType::kBF16 ? 2e-2 : 4e-3;
    if (non_finite) ok = false, why << non_finite << " non-finite outputs in the planned rows; ";
    if (r.max_abs_out > tol) ok = false, why << "out max-abs " << r.max_abs_out << "; ";
    if (!d_o_.guards_intact()) ok = false, why << "output guard bytes overwritten; ";
    if (!d_ws_.guards_intact()) ok = false, why << "workspace guard bytes overwritten; ";
    r.status = ok ? Status::kOk : Status::kFailed;
    r.detail = why.str();
    return r;
  }
  // Useful work: 4 * D per (q head, query, visible key).
  double flops() const override {
    const BlockCausalLayout l = block_causal_layout(s_.seg, s_.block);
    double pairs = 0;
    for (size_t b = 0; b + 1 < l.qo_indptr.size(); ++b)
      pairs += double(l.qo_indptr[b + 1] - l.qo_indptr[b]) * (l.kv_indptr[b + 1] - l.kv_indptr[b]);
    return 4.0 * s_.d * s_.hq * pairs;
  }

 private:
  std::vector<int64_t> rows_to_check(int64_t total) const {
    if (total * s_.hq <= 20000) {
      std::vector<int64_t> all(total);
      std::iota(all.begin(), all.end(), 0);
      return all;
    }
    std::set<int64_t> picked;
    int64_t off = 0;
    for (int64_t len : s_.seg) {  // span edges and block edges of the first blocks
      for (int64_t i : {int64_t(0), int64_t(1), s_.block - 1, s_.block, len - 1})
        if (i >= 0 && i < len) picked.insert(off + i);
      off += len;
    }
    for (int64_t i = 7; i < total; i += std::max<int64_t>(1, total / 64)) picked.insert(i);
    return {picked.begin(), picked.end()};
  }

  BcShape s_;
  std::vector<uint16_t> qh_, kh_, vh_;
  Tensor q_, k_, v_, out_, ws_;
  GuardedBuffer d_o_, d_ws_;
  std::unique_ptr<RaggedBlockCausalAttention> attn_;
};

std::vector<int64_t> spans_of(int64_t total, int64_t len) {
  std::vector<int64_t> seg(total / len, len);
  if (total % len) seg.push_back(total % len);
  return seg;
}

TEST(BlockCausalGpu, MatchesDenseBlockCausalMask) {
  std::vector<std::unique_ptr<OpCase>> cases;
  uint32_t seed = 1;
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t B : {1, 16, 64, 128}) {
      cases.push_back(std::make_unique<BlockCausalCase>(
          BcShape{{37, 5, 200, 1, 129}, B, 8, 2, 128, dt, 3, seed++}));
      cases.push_back(
          std::make_unique<BlockCausalCase>(BcShape{{300, 64}, B, 4, 4, 64, dt, 0, seed++}));
    }
  // The benchmark's shape: 32K tokens in spans of 1,500, blocks of 64 and 128, 32/8 heads.
  for (int64_t B : {64, 128})
    cases.push_back(std::make_unique<BlockCausalCase>(
        BcShape{spans_of(32768, 1500), B, 32, 8, 128, DType::kBF16, 0, seed++}));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 18);
}

TEST(BlockCausalGpu, Small) {
  std::vector<std::unique_ptr<OpCase>> cases;
  cases.push_back(
      std::make_unique<BlockCausalCase>(BcShape{{37, 5, 70}, 16, 4, 2, 128, DType::kBF16, 2, 1}));
  cases.push_back(
      std::make_unique<BlockCausalCase>(BcShape{{9, 1}, 4, 3, 1, 64, DType::kF16, 0, 2}));
  const RunSummary s = run_cases(cases);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.ok, 2);
}

// One bucket (<= 6 spans, <= 3000 tokens), one captured graph, several layouts replayed through
// it after plan(): every replay equals an eager run of the same layout, bit for bit.
TEST(BlockCausalGpu, GraphReplayOfManyLayoutsEqualsEager) {
  const int hq = 8, hk = 2, d = 128;
  const int64_t B = 64, max_tokens = 3000, max_segs = 6;
  const DType dt = DType::kBF16;
  auto qh = testing::random_half(max_tokens * hq * d, dt, 11);
  auto kh = testing::random_half(max_tokens * hk * d, dt, 12);
  auto vh = testing::random_half(max_tokens * hk * d, dt, 13);
  Tensor q = device_tensor(qh, {max_tokens, hq, d}, dt);
  Tensor k = device_tensor(kh, {max_tokens, hk, d}, dt);
  Tensor v = device_tensor(vh, {max_tokens, hk, d}, dt);

  BcShape s{{max_tokens}, B, hq, hk, d, dt};
  BlockCausalOptions gopt = bc_options(s);
  gopt.graph_mode = true;
  gopt.max_num_segments = max_segs;
  gopt.max_total_tokens = max_tokens;
  const int64_t nb = max_blocks(max_segs, max_tokens, B);
  Tensor gws = Tensor::zeros(
      {int64_t(RaggedBlockCausalAttention::workspace_bytes(hq, hk, max_tokens, B, nb))}, DType::kU8,
      Device::cuda());
  RaggedBlockCausalAttention graph_attn(gws, gopt);
  Tensor ews = Tensor::zeros({int64_t(gws.nbytes())}, DType::kU8, Device::cuda());
  RaggedBlockCausalAttention eager_attn(ews, bc_options(s));

  cudaStream_t stream;
  LONGCTX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<std::vector<int64_t>> layouts = {
      {1000, 1000}, {3000}, {1, 1, 1, 1, 1, 2995}, {64, 128, 1, 900, 63, 65}, {5}, {1500, 1499}};
  graph_attn.plan(layouts[0], stream);
  graph_attn.run(q, k, v, stream);  // warm-up outside the capture (one-time kernel attributes)
  LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  Tensor g_out;
  LONGCTX_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  g_out = graph_attn.run(q, k, v, stream);
  LONGCTX_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  LONGCTX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const int64_t row = int64_t(hq) * d;
  for (const auto& seg : layouts) {
    const int64_t total = total_of(seg);
    graph_attn.plan(seg, stream);
    EXPECT_EQ(graph_attn.num_segments(), int64_t(seg.size()));
    EXPECT_EQ(graph_attn.padded_num_blocks(), nb + 1);
    LONGCTX_CUDA_CHECK(cudaMemsetAsync(g_out.data_ptr(), 0xFF, g_out.nbytes(), stream));
    LONGCTX_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    eager_attn.plan(seg, stream);
    Tensor e_out = eager_attn.run(q, k, v, stream);
    LONGCTX_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<uint16_t> g(total * row), e(total * row);
    LONGCTX_CUDA_CHECK(
        cudaMemcpy(g.data(), g_out.data_ptr(), g.size() * 2, cudaMemcpyDeviceToHost));
    LONGCTX_CUDA_CHECK(
        cudaMemcpy(e.data(), e_out.data_ptr(), e.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT_EQ(g, e) << "layout with " << seg.size() << " spans, " << total << " tokens";
    // And both against the definition on a few rows (first/last of each span).
    std::vector<int64_t> rows;
    int64_t off = 0;
    for (int64_t len : seg) {
      rows.push_back(off);
      rows.push_back(off + len - 1);
      off += len;
    }
    auto ref = testing::dense_block_causal(qh, kh, vh, seg, B, hq, hk, d, dt,
                                           1.0 / std::sqrt(double(d)), rows);
    double max_err = 0;
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t x = 0; x < row; ++x)
        max_err = std::max(max_err, std::abs(double(half_bits_to_f32(g[rows[r] * row + x], dt)) -
                                             ref[r * row + x]));
    EXPECT_LE(max_err, 2e-2);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(BlockCausalGpu, GraphModeRejectsLayoutsOutsideTheBucket) {
  BcShape s{{10}, 16, 4, 2, 64, DType::kBF16};
  BlockCausalOptions opt = bc_options(s);
  opt.graph_mode = true;
  opt.max_num_segments = 2;
  opt.max_total_tokens = 100;
  EXPECT_THROW(RaggedBlockCausalAttention(Tensor(), opt), Error);  // no workspace
  Tensor ws = Tensor::zeros({1 << 16}, DType::kU8, Device::cuda());
  RaggedBlockCausalAttention attn(ws, opt);
  EXPECT_THROW(attn.plan({50, 50, 1}), Error);
  EXPECT_THROW(attn.plan({101}), Error);
  attn.plan({100});
  Tensor big = Tensor::zeros({101, 4, 64}, DType::kBF16, Device::cuda());
  Tensor kv = Tensor::zeros({101, 2, 64}, DType::kBF16, Device::cuda());
  EXPECT_THROW(attn.run(big, kv, kv), Error);  // more rows than the bucket's buffer
}

}  // namespace
}  // namespace longctx::gpu_test
