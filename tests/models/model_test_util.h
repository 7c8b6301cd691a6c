// Loading the tiny fixture models and their transformers reference (reference.json + logits).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "longctx/core/npy.h"
#include "longctx/engine/reference_forward.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

namespace longctx::testing {

inline std::string fixture_dir(const std::string& model) {
  return test_data_dir() + "/fixtures/" + model;
}

// The fixtures' reference was made from a model cast to bf16 with .to(), which rounds RoPE's
// inv_freq buffer: unless the caller chooses, the model reproduces that (see ModelBuildOptions).
inline std::unique_ptr<Model> load_fixture_model(const std::string& model,
                                                 ModelBuildOptions options = {}) {
  auto ckpt = std::make_shared<Checkpoint>(load_checkpoint(fixture_dir(model)));
  // Fixtures made by tests/data/make_*_fixtures.py load the reference at float32 and say so.
  std::ifstream ref(fixture_dir(model) + "/reference.json");
  const bool f32 = ref && nlohmann::json::parse(ref).value("rope_inv_freq_dtype", "") == "float32";
  if (!options.rope_inv_freq_dtype)
    options.rope_inv_freq_dtype = f32 ? DType::kF32 : ckpt->config.dtype;
  return create_model(std::move(ckpt), options);
}

struct ReferenceCase {
  std::vector<int32_t> input_ids;
  std::vector<int64_t> logits_positions;
  Tensor logits;  // [logits_positions.size(), vocab] f32
  std::vector<int32_t> greedy_new_tokens;
  std::vector<double> greedy_margins;
};

// The case of `reference.json` with prompt_len == len.
inline ReferenceCase reference_case(const std::string& model, int64_t len) {
  std::ifstream f(fixture_dir(model) + "/reference.json");
  nlohmann::json j = nlohmann::json::parse(f);
  for (const auto& c : j.at("cases")) {
    if (c.at("prompt_len").get<int64_t>() != len) continue;
    ReferenceCase r;
    r.input_ids = c.at("input_ids").get<std::vector<int32_t>>();
    r.logits_positions = c.at("logits_positions").get<std::vector<int64_t>>();
    r.logits = read_npy(fixture_dir(model) + "/" + c.at("logits_file").get<std::string>());
    if (c.contains("greedy_new_tokens")) {
      r.greedy_new_tokens = c.at("greedy_new_tokens").get<std::vector<int32_t>>();
      r.greedy_margins = c.at("greedy_margins").get<std::vector<double>>();
    }
    return r;
  }
  ADD_FAILURE() << model << ": no reference case of length " << len;
  return {};
}

inline std::vector<int64_t> iota_positions(int64_t from, int64_t n) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), from);
  return p;
}

// Logits [n, vocab] of one forward over all of ids in a fresh cache.
inline Tensor full_forward(Model& model, const std::vector<int32_t>& ids) {
  auto cache = std::make_unique<KVCache>(model.config(), static_cast<int64_t>(ids.size()));
  std::vector<int64_t> pos = iota_positions(0, static_cast<int64_t>(ids.size()));
  return reference_forward(model, ids, pos, *cache);
}

// n deterministic token ids below `vocab` (different `salt`s give different sequences).
inline std::vector<int32_t> make_ids(int64_t n, int64_t salt, int64_t vocab) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 37 + salt * 101) % vocab);
  return ids;
}

inline double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

// KL(softmax(p) || softmax(q)) of two logit rows of v entries, in double.
inline double kl_logits(const float* p, const float* q, int64_t v) {
  double mp = -INFINITY, mq = -INFINITY;
  for (int64_t i = 0; i < v; ++i) mp = std::max<double>(mp, p[i]), mq = std::max<double>(mq, q[i]);
  double zp = 0, zq = 0;
  for (int64_t i = 0; i < v; ++i) zp += std::exp(p[i] - mp), zq += std::exp(q[i] - mq);
  double kl = 0;
  for (int64_t i = 0; i < v; ++i) {
    const double lp = p[i] - mp - std::log(zp), lq = q[i] - mq - std::log(zq);
    kl += std::exp(lp) * (lp - lq);
  }
  return kl;
}

inline int32_t argmax_row(const Tensor& logits, int64_t row) {
  const int64_t v = logits.size(1);
  const float* p = logits.data<float>() + row * v;
  return static_cast<int32_t>(std::max_element(p, p + v) - p);
}

// max |ours - reference| over the stored rows of a case, ours being [n, vocab] logits (NaN kept).
inline double max_logit_error(const Tensor& ours, const ReferenceCase& ref) {
  const int64_t vocab = ours.size(1);
  EXPECT_EQ(ref.logits.size(0), int64_t(ref.logits_positions.size()));
  EXPECT_EQ(ref.logits.size(1), vocab);
  double m = 0;
  for (size_t r = 0; r < ref.logits_positions.size(); ++r) {
    const float* a = ours.data<float>() + ref.logits_positions[r] * vocab;
    const float* b = ref.logits.data<float>() + r * vocab;
    for (int64_t i = 0; i < vocab; ++i) {
      const double d = std::abs(double(a[i]) - double(b[i]));
      if (!(d <= m)) m = d;
    }
  }
  return m;
}

// transformers' 24 greedy tokens after the `len`-token prompt of `name`'s reference: one forward
// for the prompt, then a token per forward over the cache, compared up to a near tie (margin
// < 1e-3, where either token is right); at least 8 steps must be comparable.
inline void expect_greedy_matches(Model& model, const std::string& name, int64_t len) {
  ReferenceCase ref = reference_case(name, len);
  ASSERT_EQ(ref.greedy_new_tokens.size(), 24u);
  auto cache = std::make_unique<KVCache>(model.config(), len + 24);
  Tensor logits = reference_forward(model, ref.input_ids, iota_positions(0, len), *cache, true);
  ASSERT_EQ(logits.size(0), 1);
  size_t compared = 0;
  for (size_t step = 0; step < ref.greedy_new_tokens.size(); ++step) {
    if (ref.greedy_margins[step] < 1e-3) break;
    const int32_t token = argmax_row(logits, 0);
    ASSERT_EQ(token, ref.greedy_new_tokens[step]) << name << " len " << len << " step " << step;
    ++compared;
    std::vector<int32_t> one = {token};
    std::vector<int64_t> pos = {len + int64_t(step)};
    logits = reference_forward(model, one, pos, *cache, true);
  }
  EXPECT_GE(compared, 8u) << name << " len " << len << ": too few comparable steps";
}

// An OpTimer that records the models' marks: the op names in order, the bytes per op.
struct RecordingTimer : OpTimer {
  std::vector<std::string> names;
  std::map<std::string, double> bytes;
  void mark(const char* op, double b) override {
    names.emplace_back(op);
    bytes[op] += b;
  }
};

}  // namespace longctx::testing
