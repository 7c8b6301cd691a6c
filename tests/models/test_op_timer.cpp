// DecoderModel's op marks (OpTimer), which bench_model's per-op decode profile times: every op of
// a layer marked once per layer in the forward's order, under the names the bench reports, with
// the bytes of the weights it reads (the Linears' and the lm_head's); q/k-norm models mark one
// qk_norm_rope where the others mark rope. And the marks change nothing: logits are the same with
// a timer set.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "models/model_test_util.h"

namespace longctx::testing {
namespace {

ModelConfig tiny(bool qk_norm) {
  ModelConfig c = dummy_preset_config("tiny-llama");
  c.dtype = DType::kF32;
  if (qk_norm) {
    c.architecture = "Qwen3ForCausalLM";
    c.model_type = "qwen3";
    c.qk_norm = true;
  }
  return c;
}

TEST(OpTimer, MarksEveryOpOfEachLayerInOrderWithItsWeightBytes) {
  for (const bool qk_norm : {false, true}) {
    SCOPED_TRACE(qk_norm ? "qwen3-like" : "llama-like");
    const ModelConfig c = tiny(qk_norm);
    auto model = create_model(std::make_shared<Checkpoint>(make_dummy_checkpoint(c, 21)));
    const std::vector<int32_t> ids = {3, 17, 99, 4, 250};
    const Tensor plain = full_forward(*model, ids);
    RecordingTimer timer;
    model->set_op_timer(&timer);
    const Tensor timed = full_forward(*model, ids);
    model->set_op_timer(nullptr);
    ASSERT_EQ(plain.numel(), timed.numel());
    EXPECT_EQ(std::memcmp(plain.data_ptr(), timed.data_ptr(), plain.nbytes()), 0);

    std::vector<std::string> want = {"plan_and_inputs", "embed"};
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      for (const char* op :
           {"input_norm", "qkv_proj", qk_norm ? "qk_norm_rope" : "rope", "kv_store", "attention",
            "o_proj", "post_norm", "gate_up_proj", "act_and_mul", "down_proj"})
        want.emplace_back(op);
    want.emplace_back("final_norm");
    want.emplace_back("lm_head");
    EXPECT_EQ(timer.names, want);

    const double h = double(c.hidden_size), d = double(c.head_dim), layers = c.num_hidden_layers;
    const double qkv_rows = double(c.num_attention_heads + 2 * c.num_key_value_heads) * d;
    EXPECT_EQ(timer.bytes["qkv_proj"], layers * qkv_rows * h * 4);
    EXPECT_EQ(timer.bytes["o_proj"], layers * h * c.num_attention_heads * d * 4);
    EXPECT_EQ(timer.bytes["gate_up_proj"], layers * 2 * c.intermediate_size * h * 4);
    EXPECT_EQ(timer.bytes["down_proj"], layers * h * c.intermediate_size * 4);
    EXPECT_EQ(timer.bytes["lm_head"], double(c.vocab_size) * h * 4);
    EXPECT_EQ(timer.bytes["attention"], 0.0);  // the caller adds the KV's
  }
}

}  // namespace
}  // namespace longctx::testing
