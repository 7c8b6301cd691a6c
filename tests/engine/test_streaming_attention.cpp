// StreamingLLM through the CPU engine on the tiny model equals dense attention over exactly the
// keys the policy's definition keeps, recomputed per (query, key) by a reference backend that
// knows nothing of pages or masks:
//   decode   key k is read iff its page (of --sparse-page keys) holds a key < sink or >= kv_len -
//            window (--sparse-page 1: the paper's sinks and window exactly);
//   prefill  key k <= t is read by query t iff k's block of 128 holds a sink key or a key in the
//            window of some query of t's block of 128 (blocks of queries from the chunk's start).
// The reference runs the model forward itself (the engine's prefill chunks, then one token per
// step) and picks
// the greedy tokens; the engine must give the same tokens with logprobs equal to fp32 rounding,
// resident and through the simulated offload, and differ from dense attention.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "engine/engine_test_util.h"
#include "kernels/attention_params.h"
#include "longctx/engine/executor.h"

namespace longctx::testing {
namespace {

constexpr int64_t kB = kernels::kSparseBlock;

// Dense fp32 attention of one sequence over the keys keep(n, kv_len, t, k) admits.
class KeptKeysBackend final : public AttentionBackend {
 public:
  KeptKeysBackend(const ModelConfig& c, float scale, int64_t sink, int64_t window, int64_t page)
      : hq_(c.num_attention_heads),
        hkv_(c.num_key_value_heads),
        d_(c.head_dim),
        scale_(scale),
        sink_(sink),
        window_(window),
        page_(page),
        k_(c.num_hidden_layers),
        v_(c.num_hidden_layers) {}

  void plan(const ForwardBatch& batch) override { b_ = &batch; }

  void store_kv(int64_t layer, const Tensor& k, const Tensor& v) override {
    const int64_t row = hkv_ * d_;
    for (int64_t t = 0; t < b_->num_tokens(); ++t) {
      const int64_t pos = b_->positions[t];
      for (auto [src, dst] : {std::pair{&k, &k_[layer]}, std::pair{&v, &v_[layer]}}) {
        dst->resize(std::max<size_t>(dst->size(), size_t((pos + 1) * row)));
        for (int64_t h = 0; h < hkv_; ++h)
          std::copy_n(src->data<float>() + t * src->strides()[0] + h * src->strides()[1], d_,
                      dst->data() + pos * row + h * d_);
      }
    }
  }

  Tensor attend(int64_t layer, const Tensor& q) override {
    const Tensor qc = q.contiguous();
    const int64_t n = b_->q_len(0), kv_len = b_->kv_lens[0], group = hq_ / hkv_;
    if (n > 1) blocks_kept(n, kv_len);
    Tensor out = Tensor::empty({n, hq_ * d_}, DType::kF32);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = b_->positions[r];
      for (int64_t g = 0; g < hq_; ++g) {
        const float* qr = qc.data<float>() + (r * hq_ + g) * d_;
        std::vector<double> w;
        std::vector<int64_t> keys;
        for (int64_t k = 0; k <= t; ++k) {
          if (!keep(n, kv_len, t, k)) continue;
          const float* kr = k_[layer].data() + (k * hkv_ + g / group) * d_;
          double s = 0;
          for (int64_t e = 0; e < d_; ++e) s += double(qr[e]) * kr[e];
          w.push_back(s * scale_);
          keys.push_back(k);
        }
        const double mx = *std::max_element(w.begin(), w.end());
        double z = 0;
        for (double& x : w) z += (x = std::exp(x - mx));
        float* o = out.data<float>() + (r * hq_ + g) * d_;
        for (int64_t e = 0; e < d_; ++e) {
          double acc = 0;
          for (size_t i = 0; i < keys.size(); ++i)
            acc += w[i] * v_[layer][(keys[i] * hkv_ + g / group) * d_ + e];
          o[e] = float(acc / z);
        }
      }
    }
    return out;
  }

 private:
  bool keep(int64_t n, int64_t kv_len, int64_t t, int64_t k) const {
    if (n == 1) {  // decode: k's page holds a sink or a window key
      if (sink_ + window_ >= kv_len) return true;
      for (int64_t i = k / page_ * page_; i < std::min(kv_len, (k / page_ + 1) * page_); ++i)
        if (i < sink_ || i >= kv_len - window_) return true;
      return false;
    }
    const int64_t p0 = kv_len - n, kb = (kv_len + kB - 1) / kB;
    return kept_[(t - p0) / kB * kb + k / kB];
  }

  // A prefill chunk (queries from key kv_len - n): key block j is kept for query block i iff it
  // holds a sink key, or a key (causally visible) in the window of some query of block i.
  void blocks_kept(int64_t n, int64_t kv_len) {
    const int64_t p0 = kv_len - n, qb = (n + kB - 1) / kB, kb = (kv_len + kB - 1) / kB;
    kept_.assign(qb * kb, 0);
    for (int64_t qi = 0; qi < qb; ++qi)
      for (int64_t j = 0; j < kb; ++j)
        for (int64_t i = j * kB; i < std::min(kv_len, (j + 1) * kB); ++i)
          for (int64_t u = p0 + qi * kB; u < std::min(kv_len, p0 + (qi + 1) * kB); ++u)
            if (i <= u && (i < sink_ || i > u - window_)) kept_[qi * kb + j] = 1;
  }

  int64_t hq_, hkv_, d_;
  float scale_;
  int64_t sink_, window_, page_;
  std::vector<std::vector<float>> k_, v_;  // [layers][pos][Hkv][d]
  std::vector<uint8_t> kept_;              // [q blocks][k blocks] of this prefill chunk
  const ForwardBatch* b_ = nullptr;
};

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

constexpr int64_t kChunk = 128;  // the engine's prefill chunks, the reference's too

Generated reference(const std::vector<int32_t>& prompt, int64_t steps, int64_t sink, int64_t window,
                    int64_t page) {
  auto model = tiny_model();
  KeptKeysBackend backend(model->config(), model->attention_scale(), sink, window, page);
  Generated g;
  std::vector<int32_t> ids = prompt;
  const int64_t plen = static_cast<int64_t>(prompt.size());
  for (int64_t c = 0; c + kChunk < plen; c += kChunk) {  // every chunk but the last
    ForwardBatch b;
    b.add_sequence(0, ids.data() + c, kChunk, c, false);
    model->forward(b, backend);
  }
  for (int64_t s = 0; s < steps; ++s) {
    ForwardBatch b;
    const int64_t cached = s == 0 ? (plen - 1) / kChunk * kChunk : int64_t(ids.size()) - 1;
    b.add_sequence(0, ids.data() + cached, int64_t(ids.size()) - cached, cached, true);
    const Tensor logits = model->forward(b, backend).contiguous();
    const float* x = logits.data<float>();
    const int64_t vocab = logits.numel();
    const int64_t best = std::max_element(x, x + vocab) - x;
    double z = 0;
    for (int64_t i = 0; i < vocab; ++i) z += std::exp(double(x[i]) - x[best]);
    g.tokens.push_back(int32_t(best));
    g.logprobs.push_back(float(-std::log(z)));
    ids.push_back(int32_t(best));
  }
  return g;
}

Generated engine(const SparseOptions& sparse, const std::vector<int32_t>& prompt, int64_t steps,
                 int64_t offload_gpu_blocks = 0) {
  CpuExecutorOptions o;
  o.sparse = sparse;
  if (offload_gpu_blocks > 0) {  // most blocks on the simulated host, write-backs landing late
    o.num_blocks = 128;
    o.offload_gpu_blocks = offload_gpu_blocks;
    o.offload_slots = 2;
    o.offload_slot_blocks = 3;
    o.offload_write_back_lag = 2;
  }
  // One sequence, the prompt in chunks of kChunk: the reference's steps.
  EngineCore core(make_cpu_executor(tiny_model(), o), nullptr, core_options(kChunk, 1));
  SamplingParams sp = greedy(steps);
  sp.logprobs = 1;
  core.add_request(0, prompt, sp, 0);
  Generated g;
  while (core.has_unfinished()) {
    core.step();
    for (RequestOutput& out : core.take_finished()) {
      g.tokens = out.token_ids;
      for (const auto& l : out.logprobs) g.logprobs.push_back(l.logprob);
    }
  }
  return g;
}

TEST(StreamingAttention, TheEngineEqualsDenseAttentionOverTheKeptKeys) {
  std::mt19937 rng(5);
  std::vector<int32_t> prompt(460);  // 4 chunks, 29 blocks of 16
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % 500);
  constexpr int64_t kSteps = 12;
  const Generated dense = engine({}, prompt, kSteps);
  for (int64_t page : {1, 8}) {
    SCOPED_TRACE("page " + std::to_string(page));
    SparseOptions o;
    o.policy = parse_sparse_policy("streaming");
    o.sink_tokens = 8;
    o.window_tokens = 40;
    o.page_tokens = page;
    const Generated want = reference(prompt, kSteps, o.sink_tokens, o.window_tokens, page);
    for (int64_t offload : {0, 12}) {  // 12 GPU blocks: most of the context on the host
      SCOPED_TRACE(offload ? "through the simulated offload" : "resident");
      const Generated got = engine(o, prompt, kSteps, offload);
      ASSERT_EQ(got.tokens.size(), size_t(kSteps));
      EXPECT_EQ(got.tokens, want.tokens);
      ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
      for (size_t i = 0; i < got.logprobs.size(); ++i)
        EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 2e-4) << "token " << i;
    }
    double diff = 0;  // the sinks and the window are not all the keys: not dense attention
    for (size_t i = 0; i < want.logprobs.size(); ++i)
      diff = std::max(diff, double(std::fabs(want.logprobs[i] - dense.logprobs[i])));
    EXPECT_GT(diff, 1e-3);
  }
}

}  // namespace
}  // namespace longctx::testing
