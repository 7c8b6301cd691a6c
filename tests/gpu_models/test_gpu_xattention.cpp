// XAttention's GPU prefill (attention/backends/xattention_cuda.h) through the resident paged
// backend, on K / V / q written by the backend's own store_kv over prefill chunks:
//   - each chunk's output equals a CPU reference: the CPU engine's policy (attention/sparse/
//     xattention.cpp) picks the mask from the pool's keys and the chunk's queries, then causal
//     attention over the kept blocks in fp32; the mask is sparse (the counters say so) and the
//     output differs from the dense backend's;
//   - threshold 1 keeps every block: the dense output;
//   - through the CUDA offload device (a GPU cache much smaller than the context, three layers:
//     both staging buffers), every step with a prefill equals the resident backend's bit for bit,
//     decode rows mixed in included; the host reads are the keys of every host block and the
//     values of the kept ones only;
//   - the engine generates with xattention (chunked prefill, decodes mixed into prefill steps)
//     and reports a density below 1.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "attention/backends/offload_backend.h"
#include "attention/backends/paged_backend.h"
#include "attention/sparse/sparse_policy.h"
#include "common/test_data.h"
#include "engine/step_batch.h"
#include "kv/paged_kv_pool.h"
#include "longctx/engine/sampling_params.h"
#include "longctx/llm.h"

namespace longctx::testing {
namespace {

struct Geometry {
  int64_t block_size = 64, hq = 8, hkv = 2, d = 128;
  int64_t len = 1700, chunk = 512;
  SparseOptions xattn;
  Geometry() {
    xattn.policy = SparsePolicyKind::kXAttention;
    xattn.xattn_min_len = 0;  // sequences of 1,700 keys
  }
};

// Keys with a few directions the queries share, in some key blocks only, so attention mass is
// uneven across blocks.
struct Data {
  std::vector<float> dirs;
  std::mt19937 rng;
  explicit Data(int64_t d, uint32_t seed) : dirs(4 * d), rng(seed) {
    std::normal_distribution<float> n01(0.f, 1.f);
    for (float& x : dirs) x = n01(rng);
  }
  Tensor make(int64_t t0, int64_t t, int64_t h, int64_t d, bool query) {
    Tensor x = Tensor::empty({t, h, d}, DType::kF32);
    std::normal_distribution<float> n01(0.f, 1.f);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t tok = t0 + i / (h * d), e = i % d;
      // A quarter of the key blocks hold the keys the queries look for.
      const bool hot = query || ((tok / 128) * 2654435761u >> 5) % 4 == 0;
      x.data<float>()[i] = 0.5f * n01(rng) + (hot ? 1.5f * dirs[(tok % 4) * d + e] : 0.f);
    }
    return x.to_dtype(DType::kBF16);  // host, rounded as the GPU sees it
  }
};

// Causal attention of the chunk's queries over keys [0, kv_len) of `k` / `v` (host f32, token
// rows), only where the mask keeps the block (an empty mask: dense).
std::vector<float> reference(const Geometry& g, const std::vector<float>& k,
                             const std::vector<float>& v, const Tensor& q, int64_t kv_len,
                             const sparse::PrefillMask& m) {
  const int64_t n = q.size(0), p0 = kv_len - n, row = g.hkv * g.d, group = g.hq / g.hkv;
  const float scale = 1.f / std::sqrt(float(g.d));
  std::vector<float> out(n * g.hq * g.d);
  std::vector<double> logit(kv_len);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t hq = 0; hq < g.hq; ++hq) {
      const int64_t h = hq / group;
      const float* qr = q.data<float>() + (t * g.hq + hq) * g.d;
      double mx = -INFINITY;
      for (int64_t j = 0; j <= p0 + t; ++j) {
        const bool keep =
            m.all() || m.mask[(hq * m.q_blocks + t / 128) * m.k_blocks + j / 128] != 0;
        double dot = 0;
        for (int64_t e = 0; e < g.d && keep; ++e) dot += double(qr[e]) * k[j * row + h * g.d + e];
        logit[j] = keep ? dot * scale : -INFINITY;
        mx = std::max(mx, logit[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= p0 + t; ++j) sum += (logit[j] = std::exp(logit[j] - mx));
      for (int64_t e = 0; e < g.d; ++e) {
        double o = 0;
        for (int64_t j = 0; j <= p0 + t; ++j) o += logit[j] * v[j * row + h * g.d + e];
        out[(t * g.hq + hq) * g.d + e] = float(o / sum);
      }
    }
  return out;
}

void check_prefill(const Geometry& g, bool expect_sparse) {
  SCOPED_TRACE(::testing::Message() << "d " << g.d << " threshold " << g.xattn.threshold
                                    << " stride " << g.xattn.stride);
  const int64_t bs = g.block_size, blocks = (g.len + bs - 1) / bs;
  PagedKVPoolConfig kv{1, g.hkv, g.d, bs, blocks + 1, DType::kBF16, Device::cuda(0)};
  PagedKVPool pool(kv), dense_pool(kv);
  PagedBackendLimits limits{g.chunk, 4, 4 * blocks, g.len};
  const float scale = 1.f / std::sqrt(float(g.d));
  auto xattn = make_paged_attention_backend(pool, g.hq, scale, limits, g.xattn);
  auto dense = make_paged_attention_backend(dense_pool, g.hq, scale, limits);
  sparse::KvShape shape{1, blocks + 1, bs, g.hq, g.hkv, g.d, scale};
  auto policy = sparse::make_sparse_policy(g.xattn, shape);

  std::vector<int32_t> table(blocks + 1), tokens(g.len, 1);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  table.resize(blocks);
  std::vector<float> kf, vf;  // token rows [t][hkv][d], as stored
  Data data(g.d, 11);
  double worst = 0, worst_vs_dense = 0, worst_vs_dense_tol = 0;
  for (int64_t done = 0; done < g.len; done += g.chunk) {
    const int64_t n = std::min(g.chunk, g.len - done), kv_len = done + n;
    const std::vector<StepInput> in = {StepInput{0, tokens, done, n, table, true}};
    ForwardBatch batch = make_forward_batch(in, bs);
    Tensor k = data.make(done, n, g.hkv, g.d, false), v = data.make(done + 7, n, g.hkv, g.d, false);
    Tensor q = data.make(done, n, g.hq, g.d, true);
    Tensor k32 = k.to_dtype(DType::kF32), v32 = v.to_dtype(DType::kF32),
           q32 = q.to_dtype(DType::kF32);
    kf.insert(kf.end(), k32.data<float>(), k32.data<float>() + k32.numel());
    vf.insert(vf.end(), v32.data<float>(), v32.data<float>() + v32.numel());
    Tensor outs[2];
    AttentionBackend* backends[2] = {xattn.get(), dense.get()};
    for (int i = 0; i < 2; ++i) {
      backends[i]->plan(batch);
      backends[i]->store_kv(0, k.to(Device::cuda(0)), v.to(Device::cuda(0)));
      outs[i] =
          backends[i]->attend(0, q.to(Device::cuda(0))).to(Device::cpu()).to_dtype(DType::kF32);
    }
    // The policy reads the keys from a pool laid out by the block table.
    std::vector<float> pool_k((blocks + 1) * bs * g.hkv * g.d, 0.f);
    for (int64_t t = 0; t < kv_len; ++t)
      std::copy_n(kf.data() + t * g.hkv * g.d, g.hkv * g.d,
                  pool_k.data() + (table[t / bs] * bs + t % bs) * g.hkv * g.d);
    const sparse::PrefillMask m = policy->select_prefill(
        0, q32.data<float>(), g.hq * g.d, n, sparse::SeqKeys{table.data(), kv_len, pool_k.data()});
    const std::vector<float> ref = reference(g, kf, vf, q32, kv_len, m);
    // diff, vs_dense_tol: in units of the tolerance, ~2 bf16 ulps (the dense prefill may split
    // its units and sum in another order, so the same mask agrees to rounding, not to the bit)
    double diff = 0, vs_dense = 0, vs_dense_tol = 0;
    for (int64_t i = 0; i < outs[0].numel(); ++i) {
      const float x = outs[0].data<float>()[i], dense_x = outs[1].data<float>()[i];
      diff = std::max(diff, std::fabs(x - ref[i]) / (1e-2 + 8e-3 * std::fabs(ref[i])));
      vs_dense = std::max(vs_dense, double(std::fabs(x - dense_x)));
      vs_dense_tol =
          std::max(vs_dense_tol, std::fabs(x - dense_x) / (1e-2 + 8e-3 * std::fabs(dense_x)));
    }
    worst = std::max(worst, diff);
    worst_vs_dense = std::max(worst_vs_dense, vs_dense);
    worst_vs_dense_tol = std::max(worst_vs_dense_tol, vs_dense_tol);
  }
  const SparsePrefillCounters c = xattn->sparse_prefill_counters();
  std::printf(
      "  xattention d %lld threshold %.2f: max |gpu - reference| / tolerance %.3g, |gpu - dense| "
      "%.3g, density %.3f (%lld of %lld blocks)\n",
      static_cast<long long>(g.d), g.xattn.threshold, worst, worst_vs_dense,
      double(c.kept) / double(c.causal), static_cast<long long>(c.kept),
      static_cast<long long>(c.causal));
  EXPECT_LE(worst, 1.0);
  ASSERT_GT(c.causal, 0);
  if (expect_sparse) {
    EXPECT_LT(c.kept, c.causal);
    EXPECT_GT(worst_vs_dense, 5e-2) << "the mask changed nothing";
  } else {
    EXPECT_EQ(c.kept, c.causal);
    EXPECT_LE(worst_vs_dense_tol, 1.0);
  }
}

TEST(GpuXAttention, PrefillMatchesTheCpuPolicy) {
  Geometry g;
  check_prefill(g, true);
  g.d = 64;
  g.hq = 4;
  g.hkv = 4;
  g.block_size = 16;
  g.xattn.stride = 16;
  g.xattn.threshold = 0.9;
  g.xattn.xattn_per_kv_head = false;
  check_prefill(g, true);
  g = Geometry();  // one chunk, its last 200 queries dense: the kernel's rule is the policy's
  g.chunk = g.len;
  g.xattn.threshold = 0.8;
  g.xattn.xattn_dense_tail = 200;
  check_prefill(g, true);
}

TEST(GpuXAttention, ThresholdOneIsDense) {
  Geometry g;
  g.xattn.threshold = 1.0;
  check_prefill(g, false);
}

// Two sequences over three layers: A prefills in chunks, then B prefills in chunks with A's
// decode rows in the same steps, then decode-only steps (those run dense through the ring).
TEST(GpuXAttention, OffloadedPrefillIsTheResidentOne) {
  Geometry g;
  g.xattn.threshold = 0.6;  // sparse enough that some values stay on the host
  g.xattn.xattn_dense_tail = 0;
  const int64_t bs = g.block_size, layers = 3, lens[2] = {1700, 1300}, decodes = 6;
  int64_t blocks = 0;
  for (int64_t len : lens) blocks += (len + 2 * decodes + bs - 1) / bs;
  PagedKVPoolConfig kv{layers, g.hkv, g.d, bs, blocks + 1, DType::kBF16, Device::cuda(0)};
  PagedKVPool pool(kv);
  PagedBackendLimits limits{g.chunk + 8, 4, 4 * blocks, 4096};
  const float scale = 1.f / std::sqrt(float(g.d));
  auto resident = make_paged_attention_backend(pool, g.hq, scale, limits, g.xattn);
  OffloadDeviceConfig d;
  const int64_t gpu_blocks = g.chunk / bs + 2 * 4 + 2;  // what a step writes, and little more
  d.geometry = {layers, bs, blocks + 1, gpu_blocks, 2, 4};
  d.num_qo_heads = g.hq;
  d.num_kv_heads = g.hkv;
  d.head_dim = g.d;
  d.sm_scale = scale;
  d.device = Device::cuda(0);
  d.max_tokens = g.chunk + 8;
  d.max_seqs = 4;
  d.sparse = g.xattn;
  d.max_model_len = 4096;
  OffloadAttentionBackend offload(d.geometry, make_cuda_offload_device(d));

  std::vector<std::vector<int32_t>> tables(2), tokens(2);
  int32_t next = 0;
  for (int s = 0; s < 2; ++s) {
    for (int64_t b = 0; b < (lens[s] + 2 * decodes + bs - 1) / bs; ++b) tables[s].push_back(next++);
    tokens[s].assign(lens[s] + 2 * decodes, 1);
  }
  Data data(g.d, 13);
  int64_t done[2] = {0, 0}, prefill_steps = 0, host_k_blocks = 0;
  double worst_decode = 0;
  auto step = [&](const std::vector<StepInput>& in) {
    ForwardBatch batch = make_forward_batch(in, bs);
    bool prefill = false;
    for (int64_t s = 0; s < batch.num_seqs(); ++s) prefill = prefill || batch.q_len(s) > 1;
    resident->plan(batch);
    offload.plan(batch);
    for (int64_t l = 0; l < layers; ++l) {
      const int64_t t = batch.num_tokens(), t0 = batch.kv_lens[0] + 31 * l;
      Tensor k = data.make(t0, t, g.hkv, g.d, false).to(Device::cuda(0));
      Tensor v = data.make(t0 + 7, t, g.hkv, g.d, false).to(Device::cuda(0));
      Tensor q = data.make(t0, t, g.hq, g.d, true).to(Device::cuda(0));
      AttentionBackend* backends[2] = {resident.get(), &offload};
      Tensor o[2];
      for (int i = 0; i < 2; ++i) {
        backends[i]->store_kv(l, k, v);
        o[i] = backends[i]->attend(l, q).to(Device::cpu()).to_dtype(DType::kF32);
      }
      double diff = 0;
      for (int64_t i = 0; i < o[0].numel(); ++i)
        diff = std::max(diff, double(std::fabs(o[0].data<float>()[i] - o[1].data<float>()[i])));
      if (prefill)
        ASSERT_EQ(diff, 0.0) << "layer " << l << " of a prefill step at kv " << batch.kv_lens[0];
      else
        worst_decode = std::max(worst_decode, diff);
    }
    if (prefill) {
      ++prefill_steps;
      for (int64_t s = 0; s < batch.num_seqs(); ++s)  // the staged blocks: host ones < kv_len
        for (int64_t j = 0; j * bs < batch.kv_lens[s]; ++j)
          host_k_blocks +=
              offload.planner().gpu_block(batch.block_tables[batch.block_table_indptr[s] + j]) < 0;
    }
  };
  for (int s = 0; s < 2; ++s)
    while (done[s] < lens[s]) {
      const int64_t n = std::min(g.chunk, lens[s] - done[s]);
      std::vector<StepInput> in;
      if (s == 1) in.push_back({0, tokens[0], done[0]++, 1, tables[0], true});
      in.push_back({uint64_t(s), tokens[s], done[s], n, tables[s], true});
      step(in);
      done[s] += n;
    }
  for (int k = 0; k < decodes; ++k)
    step({{0, tokens[0], done[0]++, 1, tables[0], true},
          {1, tokens[1], done[1]++, 1, tables[1], true}});
  const SparsePrefillCounters c = offload.sparse_prefill_counters();
  const SparsePrefillCounters cr = resident->sparse_prefill_counters();
  const int64_t page_bytes = bs * g.hkv * g.d * 2, read = offload.sparse_host_bytes_read();
  std::printf(
      "  offloaded xattention: %lld prefill steps equal the resident ones, density %.3f, host "
      "reads %.2f MB (keys of every host block %.2f MB), decode steps within %.2e\n",
      static_cast<long long>(prefill_steps), double(c.kept) / double(c.causal), read / 1e6,
      host_k_blocks * layers * page_bytes / 1e6, worst_decode);
  EXPECT_EQ(c.kept, cr.kept);
  EXPECT_EQ(c.causal, cr.causal);
  EXPECT_LT(c.kept, c.causal);
  // The keys of every staged block, and the values of fewer (the dense ring reads both of all).
  EXPECT_GT(read, host_k_blocks * layers * page_bytes);
  EXPECT_LT(read, 2 * host_k_blocks * layers * page_bytes);
  EXPECT_LT(worst_decode, 2e-2);
  EXPECT_GT(prefill_steps, 4);
}

TEST(GpuXAttention, EngineGeneratesAndReportsItsDensity) {
  auto config = [](const char* policy) {
    EngineConfig c;
    c.model = longctx::testing::needle_v1_dir();
    c.device = "cuda";
    c.max_model_len = 4096;
    c.block_size = 32;
    c.max_num_batched_tokens = 1024;
    c.max_num_seqs = 6;
    c.num_gpu_blocks = 1024;
    c.sparse.policy = parse_sparse_policy(policy);
    c.sparse.xattn_min_len = 0;  // prompts of 600 to 3,100 tokens
    return c;
  };
  std::mt19937 rng(5);
  std::vector<Prompt> ps;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p(600 + 500 * i);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 2000);
    ps.emplace_back(p);
  }
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 24;
  sp.ignore_eos = true;
  LLM full(config("full"));
  const auto ref = full.generate(ps, sp, false);
  LLM xattn(config("xattention"));
  const auto got = xattn.generate(ps, sp, false);
  size_t same = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(got[i].token_ids.size(), 24u);
    size_t k = 0;
    while (k < 24 && ref[i].token_ids[k] == got[i].token_ids[k]) ++k;
    same += k;
  }
  const LLM::SparseStats s = xattn.sparse_stats();
  std::printf("xattention engine: %zu of %zu tokens equal full attention's, density %.3f\n", same,
              ps.size() * 24, double(s.prefill_blocks_kept) / double(s.prefill_blocks_causal));
  EXPECT_GT(s.prefill_blocks_causal, 0);
  EXPECT_LT(s.prefill_blocks_kept, s.prefill_blocks_causal);
  EXPECT_EQ(full.sparse_stats().prefill_blocks_causal, 0);
}

}  // namespace
}  // namespace longctx::testing
