// rope_reference.json (tests/data/make_rope_fixtures.py, run with transformers on the GPU
// machine): transformers' own inv_freq and attention_scaling for yarn (Qwen's recipe, DeepSeek's
// mscale pairs, untruncated, explicit attention_factor), longrope (Phi-3/Phi-4-mini shapes, both
// tables), dynamic NTK (several lengths) and partial rotary configs; each config.json goes
// through longctx's loader and ops::rope_frequencies and must agree within a float32 ulp or two
// (transformers' CPU pow is vectorized Sleef, ours double pow rounded once).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_data.h"
#include "longctx/loader/model_config.h"
#include "ops/rope.h"

using namespace longctx;

namespace {

// Within 2 float32 ulp (relative 2.4e-7) of transformers' value, reporting the worst.
void expect_table(const std::vector<float>& ours, const nlohmann::json& theirs,
                  const std::string& what) {
  ASSERT_EQ(ours.size(), theirs.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const double t = theirs[i].get<double>();
    worst = std::max(worst, std::abs(ours[i] - t) / std::abs(t));
  }
  EXPECT_LE(worst, 2.4e-7) << what << ": worst relative difference";
}

}  // namespace

TEST(RopeReference, FrequenciesMatchTransformers) {
  const std::string path = longctx::testing::test_data_dir() + "/fixtures/rope_reference.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  ASSERT_FALSE(j.at("entries").empty());
  for (const auto& e : j.at("entries")) {
    const std::string name = e.at("name");
    SCOPED_TRACE(name);
    nlohmann::json config = e.at("config");
    if (name == "default-partial-0.25") {
      // Made with LlamaRotaryEmbedding's default initializer, which in transformers 5.17 ignores
      // partial_rotary_factor (Llama has none; the models that do, Phi-3 and Qwen3-Next, use their
      // own): its table is the full head_dim's, so it checks the default frequencies without the
      // factor. Partial rotary is checked by the dynamic entry and the Phi-3 fixture.
      ASSERT_EQ(e.at("inv_freq").size(), size_t(config.at("head_dim").get<int64_t>() / 2));
      config.erase("partial_rotary_factor");
      if (config.contains("rope_parameters"))
        config["rope_parameters"].erase("partial_rotary_factor");
    }
    ModelConfig c = parse_model_config(config, name);
    const ops::RopeFrequencies f = ops::rope_frequencies(c.rope, c.head_dim);
    const int64_t half = f.rotary_dim / 2;
    expect_table({f.inv_freq.begin(), f.inv_freq.begin() + half}, e.at("inv_freq"), name);
    EXPECT_NEAR(f.attention_scaling, e.at("attention_scaling").get<double>(), 1e-7) << name;
    if (e.contains("long_inv_freq")) {
      ASSERT_EQ(f.tables(), 2) << name;
      expect_table({f.inv_freq.begin() + half, f.inv_freq.end()}, e.at("long_inv_freq"),
                   name + " long");
    }
    if (e.contains("dynamic"))
      for (const auto& d : e.at("dynamic")) {
        const int64_t n = d.at("seq_len");
        expect_table(ops::rope_dynamic_inv_freq(f, n), d.at("inv_freq"),
                     name + " at " + std::to_string(n));
      }
  }
}
