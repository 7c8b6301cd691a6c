// Checkpoint spellings of the 2025 families through the model: Phi-3's fused qkv_proj /
// gate_up_proj give the logits of the same weights stored apart, bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include "loader/weight_spec.h"
#include "model_test_util.h"

using namespace longctx;
using namespace longctx::testing;

namespace {

// The rows of `parts` concatenated into a new tensor (as a fused checkpoint stores them).
Tensor concat_rows(std::initializer_list<Tensor> parts) {
  int64_t rows = 0;
  for (const Tensor& p : parts) rows += p.size(0);
  const Tensor& first = *parts.begin();
  Tensor out = Tensor::empty({rows, first.size(1)}, first.dtype());
  int64_t r = 0;
  for (const Tensor& p : parts) {
    out.slice(0, r, r + p.size(0)).copy_from(p);
    r += p.size(0);
  }
  return out;
}

}  // namespace

TEST(Phi3, FusedCheckpointEqualsSeparateWeights) {
  ModelConfig c = dummy_preset_config("tiny-llama");
  c.architecture = "Phi3ForCausalLM";
  c.dtype = DType::kF32;
  auto apart = std::make_shared<Checkpoint>(make_dummy_checkpoint(c, 5));
  WeightStore fused;
  for (const auto& [name, t] : apart->weights.all()) {
    const auto p = name.find("self_attn.q_proj.weight"), g = name.find("mlp.gate_proj.weight");
    if (p != std::string::npos) {
      const std::string l = name.substr(0, p) + "self_attn.";
      fused.add(l + "qkv_proj.weight", concat_rows({t, apart->weights.get(l + "k_proj.weight"),
                                                    apart->weights.get(l + "v_proj.weight")}));
    } else if (g != std::string::npos) {
      const std::string l = name.substr(0, g) + "mlp.";
      fused.add(l + "gate_up_proj.weight",
                concat_rows({t, apart->weights.get(l + "up_proj.weight")}));
    } else if (name.find("k_proj.weight") == std::string::npos &&
               name.find("v_proj.weight") == std::string::npos &&
               name.find("up_proj.weight") == std::string::npos) {
      fused.add(name, t);
    }
  }
  auto joined = std::make_shared<Checkpoint>();
  joined->config = c;
  joined->weights = canonical_weights(fused, c);
  EXPECT_EQ(joined->weights.names(), apart->weights.names());
  auto a = create_model(apart), b = create_model(joined);
  const std::vector<int32_t> ids = {3, 17, 99, 4, 250, 7, 1};
  auto ca = std::make_unique<KVCache>(c, 8), cb = std::make_unique<KVCache>(c, 8);
  const Tensor la = reference_forward(*a, ids, iota_positions(0, 7), *ca);
  const Tensor lb = reference_forward(*b, ids, iota_positions(0, 7), *cb);
  ASSERT_EQ(la.numel(), lb.numel());
  EXPECT_EQ(std::memcmp(la.data_ptr(), lb.data_ptr(), la.nbytes()), 0);
}
