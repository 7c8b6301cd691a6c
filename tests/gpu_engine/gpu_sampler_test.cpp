// The GPU sampler (src/engine/gpu_sampler.h) against the CPU sampler (sample_token), the
// reference. They share the uniform (Philox of seed and step) and the integer mass arithmetic,
// so the same token is expected on every row, not most rows:
//   - random batches over odd and real vocabulary sizes, ten kinds of logits (flat, peaked,
//     bf16-rounded with ties, all equal, mostly -inf, huge negative values, ...) and random
//     parameters (greedy, temperature, top_k, top_p, min_p, penalties with prompt and output
//     history, logprobs): tokens, ranks and top ids equal; logprobs within 2e-5 + 1e-6 |lp|
//     (the GPU sums float exps, the CPU double ones);
//   - chi-square of GPU draws against the exact distribution, on the CPU tests' 8 logits and on
//     a 151936-token row;
//   - a seeded row gives the same tokens alone, inside batches of 17 and 256 random rows, and on
//     every run;
//   - a third of the random rows carry a structured-output token mask (sparse, half, nearly
//     full): the same tokens as the CPU sampler's masked rows; masked rows with and without
//     penalties on every path, and NaN / +inf / overflow / all -inf where the mask leaves a
//     token out, checked as the CPU sampler checks them;
//   - bad logits (NaN, +inf, all -inf, overflow) and bad calls are clear errors, and no state
//     advances.
#include "engine/gpu_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "longctx/core/dtype.h"
#include "longctx/core/error.h"
#include "longctx/core/tensor.h"
#include "longctx/engine/sampler.h"

namespace longctx {
namespace {

const Device kGpu = Device::cuda(0);
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kMaxRows = 256;

Tensor to_device(const std::vector<float>& host, int64_t rows, int64_t vocab,
                 int64_t row_stride = 0) {
  if (row_stride == 0) row_stride = vocab;
  Tensor dev = Tensor::empty({rows, row_stride}, DType::kF32, kGpu);
  std::vector<float> padded(static_cast<size_t>(rows * row_stride), std::nanf(""));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(host.begin() + r * vocab, vocab, padded.begin() + r * row_stride);
  }
  dev.copy_from(Tensor::from_blob(padded.data(), {rows, row_stride}, DType::kF32));
  return row_stride == vocab ? dev : dev.slice(1, 0, vocab);
}

constexpr int kKinds = 12;

// Twelve kinds of logit rows.
std::vector<float> make_row(int kind, int64_t vocab, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (float& x : v) {
    switch (kind) {
      case 0:
        x = 2.0f * normal(rng);
        break;  // LLM-like spread
      case 1:
        x = 0.3f * normal(rng);
        break;  // flat: a huge nucleus
      case 2:
        x = normal(rng) + (uni(rng) < 0.001f ? 12.0f : 0.0f);
        break;  // a few spikes
      case 3:
        x = std::round(2.0f * normal(rng)) / 2.0f;
        break;  // many exact ties
      case 4:
        x = uni(rng) < 0.7f ? -kInf : normal(rng);
        break;  // mostly masked
      case 5:
        x = 0.05f * uni(rng);
        break;  // nearly uniform
      case 6:
        x = 1.5f;
        break;  // all equal
      case 7:
        x = -kInf;
        break;  // (3 finite, below)
      case 8:
        x = uni(rng) < 0.3f ? -1e30f : 3.0f * normal(rng);
        break;  // huge negatives
      default:
        x = bf16_to_f32(f32_to_bf16(3.0f * normal(rng)));
        break;  // bf16 logits: ties
    }
  }
  if (kind == 7) {
    for (int j = 0; j < 3; ++j) v[rng() % vocab] = normal(rng);
  }
  if (kind == 4) v[rng() % vocab] = 0.0f;   // at least one finite
  if (kind == 10) v[rng() % vocab] = 0.5f;  // the max just above the cluster
  return v;
}

SamplingParams random_params(int64_t vocab, std::mt19937_64& rng) {
  auto pick = [&](auto... xs) {
    const std::vector<std::common_type_t<decltype(xs)...>> v = {xs...};
    return v[rng() % v.size()];
  };
  SamplingParams p;
  p.temperature = rng() % 5 == 0 ? 0.0 : pick(0.25, 0.7, 1.0, 1.0, 1.3);
  p.top_k = pick(int64_t(0), int64_t(0), int64_t(1), int64_t(2), int64_t(20), int64_t(50),
                 int64_t(1000), vocab - 1, vocab, vocab + 3, int64_t(-1));
  p.top_p = pick(1.0, 1.0, 0.9, 0.5, 0.999, 0.05);
  p.min_p = pick(0.0, 0.0, 0.0, 0.05, 0.3);
  if (rng() % 3 == 0) {
    p.repetition_penalty = pick(1.0, 1.2, 0.8);
    p.frequency_penalty = pick(0.0, 0.5, -0.3);
    p.presence_penalty = pick(0.0, 0.4);
  }
  const int lp = static_cast<int>(rng() % 6);
  if (lp > 0) p.logprobs = pick(0, 1, 5, 20, 20);
  return p;
}

SamplerState random_state(const SamplingParams& p, int64_t vocab, std::mt19937_64& rng) {
  std::vector<int32_t> prompt(rng() % 50);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % vocab);
  SamplerState s(p, rng(), prompt);
  const int outputs = static_cast<int>(rng() % 30);
  for (int i = 0; i < outputs; ++i) s.append_output(static_cast<int32_t>(rng() % vocab));
  const int steps = static_cast<int>(rng() % 1000);
  for (int i = 0; i < steps; ++i) s.advance();
  return s;
}

struct Batch {
  int64_t rows = 0, vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<SamplingParams> params;
  std::vector<SamplerState> states;
};

Batch random_batch(int64_t rows, int64_t vocab, std::mt19937_64& rng) {
  Batch b;
  b.rows = rows;
  b.vocab = vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = make_row(static_cast<int>(rng() % kKinds), vocab, rng);
    b.logits.insert(b.logits.end(), row.begin(), row.end());
    b.params.push_back(random_params(vocab, rng));
    b.states.push_back(random_state(b.params.back(), vocab, rng));
    // A third of the rows carry a structured-output token mask: sparse, half or nearly full,
    // always keeping the row's largest logit so something finite stays.
    if (rng() % 3 == 0) {
      const double density = std::array<double, 3>{0.01, 0.5, 0.99}[rng() % 3];
      std::vector<uint32_t>& mask = b.states.back().token_mask();
      mask.assign(static_cast<size_t>((vocab + 31) / 32), 0u);
      std::uniform_real_distribution<double> uni(0.0, 1.0);
      for (int64_t t = 0; t < vocab; ++t) {
        if (uni(rng) < density) mask[t >> 5] |= 1u << (t & 31);
      }
      const auto best = std::max_element(row.begin(), row.end()) - row.begin();
      mask[best >> 5] |= 1u << (best & 31);
    }
  }
  return b;
}

std::vector<SampleResult> run_gpu(GpuSampler& sampler, const Tensor& logits,
                                  std::vector<SamplerState>& states,
                                  const std::vector<SamplingParams>& params) {
  std::vector<SamplerState*> sp;
  std::vector<const SamplingParams*> pp;
  for (auto& s : states) sp.push_back(&s);
  for (auto& p : params) pp.push_back(&p);
  return sampler.sample(logits, sp, pp);
}

bool logprob_close(float gpu, float cpu) {
  if (std::isinf(cpu)) return gpu == cpu;
  return std::isfinite(gpu) && std::abs(gpu - cpu) <= 2e-5f + 1e-6f * std::abs(cpu);
}

struct Tally {
  int64_t rows = 0, token_mismatch = 0, logprob_mismatch = 0;
};

// GPU vs CPU on one batch, each from its own copy of the states.
void compare_batch(GpuSampler& sampler, const Batch& b, Tally& tally, int64_t row_stride = 0) {
  const Tensor dev = to_device(b.logits, b.rows, b.vocab, row_stride);
  std::vector<SamplerState> gpu_states = b.states, cpu_states = b.states;
  const auto got = run_gpu(sampler, dev, gpu_states, b.params);
  ASSERT_EQ(static_cast<int64_t>(got.size()), b.rows);
  for (int64_t r = 0; r < b.rows; ++r) {
    const std::span<const float> row(b.logits.data() + r * b.vocab, b.vocab);
    const SampleResult want = sample_token(row, b.params[r], cpu_states[r]);
    const SampleResult& g = got[r];
    ++tally.rows;
    EXPECT_EQ(gpu_states[r].step(), cpu_states[r].step());
    if (g.token != want.token) {
      if (++tally.token_mismatch <= 10) {
        ADD_FAILURE() << "vocab " << b.vocab << " row " << r << ": gpu " << g.token << " cpu "
                      << want.token << " (T " << b.params[r].temperature << " k "
                      << b.params[r].top_k << " p " << b.params[r].top_p << " min_p "
                      << b.params[r].min_p << " rep " << b.params[r].repetition_penalty << ")";
      }
      continue;
    }
    if (!b.params[r].logprobs) continue;
    const TokenLogprobs &gl = g.logprobs, &cl = want.logprobs;
    bool ok = gl.token == cl.token && gl.rank == cl.rank && logprob_close(gl.logprob, cl.logprob) &&
              gl.top.size() == cl.top.size();
    for (size_t j = 0; ok && j < cl.top.size(); ++j) {
      ok = gl.top[j].first == cl.top[j].first && logprob_close(gl.top[j].second, cl.top[j].second);
    }
    if (!ok && ++tally.logprob_mismatch <= 10) {
      ADD_FAILURE() << "vocab " << b.vocab << " row " << r << ": logprob " << gl.logprob << " vs "
                    << cl.logprob << ", rank " << gl.rank << " vs " << cl.rank << ", top "
                    << gl.top.size() << " vs " << cl.top.size();
    }
  }
}

TEST(GpuSampler, SameTokensAsTheCpuSamplerOnRandomBatches) {
  std::mt19937_64 rng(2024);
  GpuSampler sampler(kMaxRows, 151936, kGpu);
  Tally tally;
  struct Shape {
    int64_t vocab, rows, batches;
  };
  const Shape shapes[] = {{1, 16, 2},     {2, 64, 4},     {3, 64, 4},     {17, 256, 4},
                          {1000, 256, 3}, {1023, 128, 2}, {1025, 128, 2}, {4097, 128, 2},
                          {32000, 64, 2}, {151936, 48, 2}};
  for (const Shape& s : shapes) {
    GpuSampler local(kMaxRows, s.vocab, kGpu);
    GpuSampler& use = s.vocab == 151936 ? sampler : local;
    for (int64_t i = 0; i < s.batches; ++i)
      compare_batch(use, random_batch(s.rows, s.vocab, rng), tally);
  }
  // Strided rows (a view of wider logits).
  GpuSampler strided(kMaxRows, 5000, kGpu);
  compare_batch(strided, random_batch(32, 5000, rng), tally, 5000 + 37);
  std::printf("GPU vs CPU sampler: %lld rows, %lld token mismatches, %lld logprob mismatches\n",
              static_cast<long long>(tally.rows), static_cast<long long>(tally.token_mismatch),
              static_cast<long long>(tally.logprob_mismatch));
  EXPECT_EQ(tally.token_mismatch, 0);
  EXPECT_EQ(tally.logprob_mismatch, 0);
}

TEST(GpuSampler, EveryPathOnASmallVocabulary) {
  // Every kind of row under each filter, one batch of 3000-token rows: boundary bins that fit
  // shared memory, that must be re-binned (kind 10's cluster) and that are all ties (kinds 6,
  // 11). Small enough for compute-sanitizer.
  constexpr int64_t kVocab = 3000;
  std::mt19937_64 rng(31);
  std::vector<SamplingParams> settings(7);
  settings[0].top_k = 50;
  settings[1].top_p = 0.5;
  settings[2].top_k = 2500;
  settings[2].top_p = 0.9;
  settings[3].min_p = 0.3;
  settings[3].temperature = 0.7;
  settings[4].top_p = 0.97;
  settings[4].logprobs = 5;
  settings[4].repetition_penalty = 1.3;
  settings[4].frequency_penalty = 0.5;
  settings[5].temperature = 0.0;
  settings[5].logprobs = 20;
  settings[6].top_k = 2100;
  Batch b;
  b.rows = 0;
  b.vocab = kVocab;
  for (int kind = 0; kind < kKinds; ++kind) {
    for (const SamplingParams& p : settings) {
      const auto row = make_row(kind, kVocab, rng);
      b.logits.insert(b.logits.end(), row.begin(), row.end());
      b.params.push_back(p);
      b.states.push_back(random_state(p, kVocab, rng));
      ++b.rows;
    }
  }
  GpuSampler sampler(b.rows, kVocab, kGpu);
  Tally tally;
  for (int i = 0; i < 3; ++i) {
    compare_batch(sampler, b, tally);
    for (auto& s : b.states) s.advance();
  }
  EXPECT_EQ(tally.rows, 3 * b.rows);
  EXPECT_EQ(tally.token_mismatch, 0);
  EXPECT_EQ(tally.logprob_mismatch, 0);
}

// A mask of `vocab` tokens keeping each with probability `density`, and always `keep`.
std::vector<uint32_t> random_mask(int64_t vocab, double density, int64_t keep,
                                  std::mt19937_64& rng) {
  std::vector<uint32_t> mask(static_cast<size_t>((vocab + 31) / 32), 0u);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  for (int64_t t = 0; t < vocab; ++t) {
    if (uni(rng) < density) mask[t >> 5] |= 1u << (t & 31);
  }
  mask[keep >> 5] |= 1u << (keep & 31);
  return mask;
}

TEST(GpuSampler, MaskedRowsWithAndWithoutPenaltiesMatchTheCpu) {
  // The kernels read a masked row's mask with its logits (no work copy unless penalized): every
  // kind of row under each filter, masked sparse / half / nearly full, each setting with and
  // without penalties, between unmasked rows (a row depends on itself alone); logprobs stay the
  // raw distribution's (a masked row's max is not the raw max).
  std::mt19937_64 rng(77);
  std::vector<SamplingParams> settings(6);
  settings[0].temperature = 0.0;
  settings[0].logprobs = 5;
  settings[1].logprobs = 3;  // T = 1, no filter: the draw over the whole row
  settings[2].top_k = 50;
  settings[3].top_p = 0.5;
  settings[3].logprobs = 1;
  settings[4].min_p = 0.3;
  settings[4].temperature = 0.7;
  settings[5].top_k = 2100;
  settings[5].top_p = 0.9;
  for (const int64_t vocab : {3000, 151936}) {
    Batch b;
    b.vocab = vocab;
    int64_t masked = 0, masked_penalized = 0;
    for (int kind = 0; kind < kKinds; ++kind) {
      for (const SamplingParams& base : settings) {
        for (const bool penalties : {false, true}) {
          if (vocab > 3000 && rng() % 4 != 0) continue;  // a sample of the large rows
          SamplingParams p = base;
          if (penalties) {
            p.repetition_penalty = 1.3;
            p.frequency_penalty = 0.5;
            p.presence_penalty = 0.2;
          }
          for (const bool mask : {true, false}) {
            const auto row = make_row(kind, vocab, rng);
            b.logits.insert(b.logits.end(), row.begin(), row.end());
            b.params.push_back(p);
            // A history, so the penalties touch tokens (some masked out, some allowed).
            std::vector<int32_t> prompt(40);
            for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % vocab);
            SamplerState st(p, rng(), prompt);
            for (int i = 0; i < 10; ++i) st.append_output(static_cast<int32_t>(rng() % vocab));
            if (mask) {
              const double density = std::array<double, 3>{0.01, 0.5, 0.99}[rng() % 3];
              const int64_t best = std::max_element(row.begin(), row.end()) - row.begin();
              st.token_mask() = random_mask(vocab, density, best, rng);
              ++masked;
              masked_penalized += penalties ? 1 : 0;
            }
            b.states.push_back(std::move(st));
            ++b.rows;
          }
        }
      }
    }
    ASSERT_GT(masked_penalized, 0);
    ASSERT_GT(masked - masked_penalized, 0);
    GpuSampler sampler(b.rows, vocab, kGpu);
    Tally tally;
    for (int i = 0; i < 2; ++i) {
      compare_batch(sampler, b, tally);
      for (auto& st : b.states) st.advance();
    }
    EXPECT_EQ(tally.rows, 2 * b.rows);
    EXPECT_EQ(tally.token_mismatch, 0) << "vocab " << vocab;
    EXPECT_EQ(tally.logprob_mismatch, 0) << "vocab " << vocab;
  }
}

// The masks of a call go up on a stream of their own, which the sampling waits for: a sampler
// reused call after call samples each call under that call's masks (sparse, different every
// call, so a stale mask would pick other tokens), and a call without masks between them too.
TEST(GpuSampler, EachCallSamplesUnderItsOwnMasks) {
  std::mt19937_64 rng(91);
  const int64_t vocab = 151936, rows = 64;
  Batch b = random_batch(rows, vocab, rng);
  GpuSampler sampler(rows, vocab, kGpu);
  Tally tally;
  for (int call = 0; call < 8; ++call) {
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<uint32_t>& mask = b.states[r].token_mask();
      mask.clear();
      if (call == 3) continue;
      // Always one finite logit allowed, a different one each call.
      const float* row = b.logits.data() + r * vocab;
      int64_t keep = std::max_element(row, row + vocab) - row;
      for (int tries = 0; tries < 100; ++tries) {
        const auto t = static_cast<int64_t>(rng() % vocab);
        if (std::isfinite(row[t])) {
          keep = t;
          break;
        }
      }
      mask = random_mask(vocab, 0.01, keep, rng);
    }
    compare_batch(sampler, b, tally);
    for (SamplerState& st : b.states) st.advance();
  }
  EXPECT_EQ(tally.rows, 8 * rows);
  EXPECT_EQ(tally.token_mismatch, 0);
  EXPECT_EQ(tally.logprob_mismatch, 0);
}

// The last of `rows` rows is sampled with `p` and `mask`; GPU and CPU agree: both refuse it
// with `what` (empty: neither does, and both give the same token).
void expect_masked_row(const std::vector<float>& logits, int64_t rows, int64_t vocab,
                       const SamplingParams& p, const std::vector<uint32_t>& mask,
                       const std::string& what) {
  GpuSampler sampler(rows, vocab, kGpu);
  std::vector<SamplingParams> params(rows, SamplingParams{});
  params[rows - 1] = p;
  std::vector<SamplerState> states(rows, SamplerState(SamplingParams{}, 3, {}));
  const std::vector<int32_t> history = {0, 1, 2, 5};  // penalized tokens, all masked out
  states[rows - 1] = SamplerState(p, 3, history);
  states[rows - 1].token_mask() = mask;
  std::vector<SamplerState> cpu_states = states;
  const std::span<const float> row(logits.data() + (rows - 1) * vocab, vocab);
  if (what.empty()) {
    const auto got = run_gpu(sampler, to_device(logits, rows, vocab), states, params);
    EXPECT_EQ(got.back().token, sample_token(row, p, cpu_states.back()).token);
    EXPECT_TRUE((mask[got.back().token >> 5] >> (got.back().token & 31)) & 1u);
    return;
  }
  try {
    run_gpu(sampler, to_device(logits, rows, vocab), states, params);
    ADD_FAILURE() << "no error for " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
  for (const auto& st : states) EXPECT_EQ(st.step(), 0u) << what;
  // sample_token sees one row: its message names the token, not the batch row.
  const std::string cpu_what = what.substr(0, what.find(", batch row"));
  try {
    sample_token(row, p, cpu_states.back());
    ADD_FAILURE() << "the CPU sampler takes what the GPU refused: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(cpu_what), std::string::npos) << e.what();
  }
}

TEST(GpuSampler, MaskedOutLogitsAreCheckedAsTheCpuSamplerChecksThem) {
  // NaN / +inf anywhere in the raw row are errors, masked out or not; a logit that overflows
  // only after the mask left it out is not; every allowed logit -inf is.
  constexpr int64_t kVocab = 1000, kRows = 4;
  std::vector<float> logits(kRows * kVocab);
  for (int64_t i = 0; i < kRows * kVocab; ++i) logits[i] = 0.001f * static_cast<float>(i % 997);
  std::vector<uint32_t> mask((kVocab + 31) / 32, 0u);
  for (int t : {3, 40, 41, 500, 999}) mask[t >> 5] |= 1u << (t & 31);
  const int64_t last = (kRows - 1) * kVocab;
  SamplingParams greedy, sampled, penalized_greedy, penalized_sampled;
  greedy.temperature = 0.0;
  sampled.top_p = 0.9;
  penalized_greedy = greedy;
  penalized_sampled = sampled;
  for (SamplingParams* p : {&penalized_greedy, &penalized_sampled}) {
    p->repetition_penalty = 1.5;
    p->presence_penalty = 0.5;
  }
  for (const SamplingParams* p : {&greedy, &sampled, &penalized_greedy, &penalized_sampled}) {
    auto bad = logits;
    bad[last + 7] = std::nanf("");  // masked out
    expect_masked_row(bad, kRows, kVocab, *p, mask, "NaN logit (token 7, batch row 3)");
    bad = logits;
    bad[last + 9] = kInf;  // masked out
    expect_masked_row(bad, kRows, kVocab, *p, mask, "+inf logit (token 9, batch row 3)");
    bad = logits;
    for (int t : {3, 40, 41, 500, 999}) bad[last + t] = -kInf;
    expect_masked_row(bad, kRows, kVocab, *p, mask, "every logit is -inf after");
    // The row's best logit masked out: the best allowed one (greedy) or one allowed (sampled).
    bad = logits;
    bad[last + 2] = 50.0f;
    expect_masked_row(bad, kRows, kVocab, *p, mask, "");
  }
  // 1e35 / 1e-4 overflows, but only where the mask allows the token.
  SamplingParams cold;
  cold.temperature = 1e-4;
  auto big = logits;
  big[last + 11] = 1e35f;
  expect_masked_row(big, kRows, kVocab, cold, mask, "");
  mask[11 >> 5] |= 1u << (11 & 31);
  expect_masked_row(big, kRows, kVocab, cold, mask, "token 11 overflows");
}

TEST(GpuSampler, GreedyTiesGoToTheLowestId) {
  GpuSampler sampler(4, 6, kGpu);
  SamplingParams greedy;
  greedy.temperature = 0.0;
  std::vector<SamplingParams> params(2, greedy);
  std::vector<SamplerState> states(2, SamplerState(greedy, 1, {}));
  const std::vector<float> logits = {0.0f,  3.0f,  3.0f, 1.0f,  3.0f, -kInf,
                                     -kInf, -kInf, 2.0f, -kInf, 2.0f, -kInf};
  const auto got = run_gpu(sampler, to_device(logits, 2, 6), states, params);
  EXPECT_EQ(got[0].token, 1);
  EXPECT_EQ(got[1].token, 2);
}

// The CPU tests' expectation, over any vocabulary: probabilities, then each filter on the kept
// set in vLLM's order, renormalized.
std::vector<double> expected_distribution(const std::vector<float>& logits, double t, int k,
                                          double top_p, double min_p) {
  const size_t n = logits.size();
  std::vector<double> p(n);
  const double mx = *std::max_element(logits.begin(), logits.end()) / t;
  double z = 0;
  for (size_t i = 0; i < n; ++i) z += p[i] = std::exp(logits[i] / t - mx);
  for (double& x : p) x /= z;
  std::vector<bool> keep(n, true);
  const double pmax = *std::max_element(p.begin(), p.end());
  for (size_t i = 0; i < n; ++i) keep[i] = p[i] >= min_p * pmax;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  if (k > 0) {
    int seen = 0;
    for (size_t i : order) {
      if (keep[i] && ++seen > k) keep[i] = false;
    }
  }
  double kept_mass = 0;
  for (size_t i = 0; i < n; ++i) kept_mass += keep[i] ? p[i] : 0;
  double cum = 0;
  for (size_t i : order) {
    if (!keep[i]) continue;
    if (cum >= top_p) {
      keep[i] = false;
    } else {
      cum += p[i] / kept_mass;
    }
  }
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += keep[i] ? p[i] : 0;
  std::vector<double> q(n);
  for (size_t i = 0; i < n; ++i) q[i] = keep[i] ? p[i] / s : 0;
  return q;
}

// Upper 0.1% points of chi-square, 1..9 degrees of freedom (NIST/SEMATECH e-Handbook 1.3.6.7.4).
double chi2_critical_p001(int df) {
  static const double kTable[] = {10.828, 13.816, 16.266, 18.467, 20.515,
                                  22.458, 24.322, 26.124, 27.877};
  EXPECT_GE(df, 1);
  EXPECT_LE(df, 9);
  return kTable[std::clamp(df, 1, 9) - 1];
}

struct DistCase {
  const char* name;
  double temperature;
  int top_k;
  double top_p;
  double min_p;
};

const DistCase kDistCases[] = {
    {"t=1", 1.0, 0, 1.0, 0.0},
    {"t=0.5", 0.5, 0, 1.0, 0.0},
    {"t=2", 2.0, 0, 1.0, 0.0},
    {"top_k=3", 1.0, 3, 1.0, 0.0},
    {"top_p=0.75", 1.0, 0, 0.75, 0.0},
    {"min_p=0.2", 1.0, 0, 1.0, 0.2},
    {"t=0.7,top_k=5,top_p=0.9,min_p=0.05", 0.7, 5, 0.9, 0.05},
    {"t=1.3,top_k=6,top_p=0.7", 1.3, 6, 0.7, 0.0},
};

// Draws `draws` tokens as kMaxRows rows per call (every row its own seed) and returns the
// counts per cell: cell_of[token] (the last cell gathers every other token).
std::vector<int64_t> gpu_counts(const std::vector<float>& row, const SamplingParams& params,
                                int draws, const std::vector<int>& cell_of, int cells,
                                uint64_t seed) {
  const int64_t vocab = static_cast<int64_t>(row.size());
  std::vector<float> logits;
  for (int r = 0; r < kMaxRows; ++r) logits.insert(logits.end(), row.begin(), row.end());
  const Tensor dev = to_device(logits, kMaxRows, vocab);
  GpuSampler sampler(kMaxRows, vocab, kGpu);
  std::vector<SamplerState> states;
  for (int r = 0; r < kMaxRows; ++r)
    states.emplace_back(params, seed * 1000 + r, std::vector<int32_t>{});
  std::vector<SamplingParams> ps(kMaxRows, params);
  std::vector<int64_t> counts(cells, 0);
  for (int done = 0; done < draws; done += kMaxRows) {
    for (const SampleResult& s : run_gpu(sampler, dev, states, ps)) ++counts[cell_of[s.token]];
  }
  return counts;
}

std::pair<double, int> chi_square(const std::vector<int64_t>& counts,
                                  const std::vector<double>& expected) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  double stat = 0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "cell " << i << " was filtered out but sampled";
      continue;
    }
    const double e = expected[i] * n;
    stat += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  return {stat, cells - 1};
}

void check_distributions(const std::vector<float>& row, const std::vector<int>& cell_of,
                         int cells) {
  constexpr int kDraws = 20480;
  for (const DistCase& c : kDistCases) {
    SCOPED_TRACE(c.name);
    SamplingParams params;
    params.temperature = c.temperature;
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    const auto per_token = expected_distribution(row, c.temperature, c.top_k, c.top_p, c.min_p);
    std::vector<double> expected(cells, 0.0);
    for (size_t i = 0; i < row.size(); ++i) expected[cell_of[i]] += per_token[i];
    const auto counts = gpu_counts(row, params, kDraws, cell_of, cells, 1234);
    const auto [stat, df] = chi_square(counts, expected);
    std::printf("chi-square %-36s vocab %6zu: %7.3f (df %d, 0.1%% point %.3f)\n", c.name,
                row.size(), stat, df, chi2_critical_p001(df));
    EXPECT_LT(stat, chi2_critical_p001(df)) << "df " << df;
  }
  // Power: draws at t=0.7 do not pass as t=1.
  SamplingParams hot;
  hot.temperature = 0.7;
  const auto counts = gpu_counts(row, hot, kDraws, cell_of, cells, 99);
  const auto per_token = expected_distribution(row, 1.0, 0, 1.0, 0.0);
  std::vector<double> expected(cells, 0.0);
  for (size_t i = 0; i < row.size(); ++i) expected[cell_of[i]] += per_token[i];
  EXPECT_GT(chi_square(counts, expected).first, chi2_critical_p001(cells - 1));
}

TEST(GpuSampler, ChiSquareOnTheCpuTestsLogits) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -3.0f, 1.0f, -0.5f};
  check_distributions(logits, {0, 1, 2, 3, 4, 5, 6, 7}, 8);
}

TEST(GpuSampler, ChiSquareOnAFullVocabulary) {
  // The same 8 logits, raised by 9, at scattered ids of a 151936-token row whose other tokens
  // are N(0, 1): those carry ~60% of the mass at t=1 (top_p reaches into them) and form one
  // cell.
  constexpr int64_t kVocab = 151936;
  std::mt19937_64 rng(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(kVocab);
  for (float& x : row) x = normal(rng);
  const std::vector<float> special = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -3.0f, 1.0f, -0.5f};
  std::vector<int> cell_of(kVocab, 8);
  for (int j = 0; j < 8; ++j) {
    const int64_t at = 7919 * (j + 1) * 2 + 3;
    row[at] = special[j] + 9.0f;
    cell_of[at] = j;
  }
  check_distributions(row, cell_of, 9);
}

TEST(GpuSampler, ASeededRowIgnoresItsBatchAndReproduces) {
  constexpr int64_t kVocab = 151936;
  std::mt19937_64 rng(77);
  const std::vector<float> mine = make_row(0, kVocab, rng);
  SamplingParams p;
  p.temperature = 0.8;
  p.top_k = 50;
  p.top_p = 0.9;
  p.repetition_penalty = 1.1;
  p.frequency_penalty = 0.2;
  GpuSampler sampler(kMaxRows, kVocab, kGpu);
  const std::vector<int32_t> prompt = {5, 77, 1000};
  // 24 tokens of one request with the row at `pos` of `rows` (the others random rows).
  auto run = [&](int64_t rows, int64_t pos, uint64_t others_seed) {
    std::mt19937_64 orng(others_seed);
    Batch b = random_batch(rows, kVocab, orng);
    std::copy(mine.begin(), mine.end(), b.logits.begin() + pos * kVocab);
    b.params[pos] = p;
    b.states[pos] = SamplerState(p, 4242, prompt);
    const Tensor dev = to_device(b.logits, rows, kVocab);
    std::vector<int32_t> tokens;
    for (int step = 0; step < 24; ++step) {
      const auto got = run_gpu(sampler, dev, b.states, b.params);
      tokens.push_back(got[pos].token);
      for (int64_t r = 0; r < rows; ++r) b.states[r].append_output(got[r].token);
    }
    return tokens;
  };
  const auto alone = run(1, 0, 1);
  EXPECT_EQ(run(1, 0, 1), alone);   // every run
  EXPECT_EQ(run(17, 5, 2), alone);  // other batch compositions
  EXPECT_EQ(run(256, 255, 3), alone);
  EXPECT_EQ(run(256, 0, 4), alone);
  // And the CPU sampler gives the same request the same tokens.
  SamplerState cpu(p, 4242, prompt);
  std::vector<int32_t> want;
  for (int step = 0; step < 24; ++step) {
    want.push_back(sample_token(mine, p, cpu).token);
    cpu.append_output(want.back());
  }
  EXPECT_EQ(alone, want);
  EXPECT_GT(std::set<int32_t>(alone.begin(), alone.end()).size(), 1u);  // really sampled
}

void expect_row_error(GpuSampler& sampler, const std::vector<float>& logits, int64_t rows,
                      int64_t vocab, const SamplingParams& p, const std::string& what) {
  std::vector<SamplingParams> params(rows, SamplingParams{});
  params[rows - 1] = p;
  std::vector<SamplerState> states(rows, SamplerState(SamplingParams{}, 3, {}));
  try {
    run_gpu(sampler, to_device(logits, rows, vocab), states, params);
    ADD_FAILURE() << "no error for " << what;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
  for (const auto& s : states) EXPECT_EQ(s.step(), 0u) << what;
  // The CPU sampler refuses the same row.
  SamplerState cpu(p, 3, {});
  EXPECT_THROW(
      sample_token(std::span<const float>(logits.data() + (rows - 1) * vocab, vocab), p, cpu),
      Error);
}

TEST(GpuSampler, BadLogitsAreClearErrors) {
  constexpr int64_t kVocab = 1000;
  GpuSampler sampler(8, kVocab, kGpu);
  std::vector<float> logits(4 * kVocab, 0.5f);
  SamplingParams p;
  auto bad = logits;
  bad[3 * kVocab + 7] = std::nanf("");
  bad[3 * kVocab + 9] = kInf;
  expect_row_error(sampler, bad, 4, kVocab, p, "NaN logit (token 7, batch row 3)");
  bad = logits;
  bad[3 * kVocab + 9] = kInf;
  expect_row_error(sampler, bad, 4, kVocab, p, "+inf logit (token 9, batch row 3)");
  bad = logits;
  std::fill(bad.begin() + 3 * kVocab, bad.end(), -kInf);
  expect_row_error(sampler, bad, 4, kVocab, p, "every logit is -inf");
  SamplingParams greedy;
  greedy.temperature = 0;
  expect_row_error(sampler, bad, 4, kVocab, greedy, "every logit is -inf");
  bad = logits;
  bad[3 * kVocab + 11] = 1e35f;
  SamplingParams cold;
  cold.temperature = 1e-4;
  expect_row_error(sampler, bad, 4, kVocab, cold, "token 11 overflows");
}

TEST(GpuSampler, BadCallsAreClearErrors) {
  GpuSampler sampler(4, 100, kGpu);
  std::vector<SamplingParams> params(4);
  std::vector<SamplerState> states(4, SamplerState(SamplingParams{}, 1, {}));
  std::vector<float> host(5 * 100, 0.0f);
  auto expect_bad = [&](const Tensor& t, size_t n, const std::string& what) {
    std::vector<SamplerState> st(states.begin(), states.begin() + std::min<size_t>(n, 4));
    std::vector<SamplingParams> ps(params.begin(), params.begin() + std::min<size_t>(n, 4));
    try {
      run_gpu(sampler, t, st, ps);
      ADD_FAILURE() << "no error: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_bad(to_device(host, 5, 100), 4, "5 rows, at most 4");
  expect_bad(to_device(host, 5, 100).slice(0, 0, 4).view({4, 100}), 3, "3 states");
  expect_bad(Tensor::from_blob(host.data(), {4, 100}, DType::kF32), 4, "must be on cuda:0");
  expect_bad(to_device(host, 2, 250), 2, "f32 [B, 100]");
  expect_bad(Tensor::empty({2, 100}, DType::kBF16, kGpu), 2, "f32 [B, 100]");
  std::vector<SamplingParams> bad_params(2);
  bad_params[1].top_p = 0.0;
  std::vector<SamplerState> st(2, SamplerState(SamplingParams{}, 1, {}));
  EXPECT_THROW(run_gpu(sampler, to_device(host, 2, 100), st, bad_params), Error);
  EXPECT_THROW(GpuSampler(0, 100, kGpu), Error);
  EXPECT_THROW(GpuSampler(4, 0, kGpu), Error);
  EXPECT_THROW(GpuSampler(4, (int64_t(1) << 20) + 1, kGpu), Error);
  EXPECT_THROW(GpuSampler(4, 100, Device::cpu()), Error);
  std::vector<SamplerState> no_states;
  EXPECT_TRUE(run_gpu(sampler, Tensor::empty({0, 100}, DType::kF32, kGpu), no_states, {}).empty());
}

}  // namespace
}  // namespace longctx
