// Loading the tiny fixture models and their transformers reference (reference.json + logits).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
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

inline int32_t argmax_row(const Tensor& logits, int64_t row) {
  const int64_t v = logits.size(1);
  const float* p = logits.data<float>() + row * v;
  return static_cast<int32_t>(std::max_element(p, p + v) - p);
}

}  // namespace longctx::testing
