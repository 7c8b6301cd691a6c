// bench_model's per-op decode profile (bench/common/op_profile.h) on the CPU: the hybrid model's
// marks (tiny-qwen3-next: Gated DeltaNet layers, a gated attention layer, the MoE block with its
// shared expert) name every op of a decode step with the bytes it must read, through the same
// ExecutorSession the GPU runner's profile drives; the host timer turns the marks into the
// table's rows; and the table's arithmetic (medians over steps, bounds, order) on set numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/op_profile.h"
#include "longctx/core/error.h"
#include "longctx/engine/executor.h"
#include "longctx/engine/executor_session.h"
#include "models/model_test_util.h"

namespace longctx::testing {
namespace {

// tiny-qwen3-next's shapes with f32 dummy weights (so every weight's bytes are 4 a parameter)
// through a CPU executor session: a prompt, then one decode step per step().
std::shared_ptr<Model> hybrid_model() {
  ModelConfig c = load_model_config(fixture_dir("tiny-qwen3-next") + "/config.json");
  c.dtype = DType::kF32;
  return create_model(std::make_shared<Checkpoint>(make_dummy_checkpoint(c, 21)));
}

struct HybridSession {
  std::shared_ptr<Model> model = hybrid_model();
  ExecutorSession session;
  std::vector<int32_t> ids = {3, 17, 99, 4, 250, 31, 7, 88, 5, 120, 64};

  HybridSession() : session(make(model)) {
    const SessionInput in{1, ids};
    session.run({&in, 1});
  }
  static ExecutorSession make(std::shared_ptr<Model> m) {
    CpuExecutorOptions o;
    o.num_blocks = 32;
    o.max_state_seqs = 2;
    o.max_state_snapshots = 0;
    ExecutorSessionOptions s;
    s.max_num_seqs = 2;
    return ExecutorSession(make_cpu_executor(std::move(m), o), s);
  }
  Tensor step() {
    ids.push_back(static_cast<int32_t>(ids.size() * 13 % 500));
    const SessionInput in{1, ids, 1};
    return session.run({&in, 1});
  }
};

TEST(OpProfile, HybridDecodeStepMarksEveryOpWithTheBytesItReads) {
  HybridSession h;
  const ModelConfig& c = h.model->config();
  RecordingTimer timer;
  h.model->set_op_timer(&timer);
  h.step();
  h.model->set_op_timer(nullptr);

  const std::vector<std::string> moe = {"post_norm",          "router",      "shared_gate_up",
                                        "shared_act_and_mul", "shared_down", "shared_expert_gate",
                                        "moe_experts"};
  std::vector<std::string> want = {"plan_and_inputs", "embed"};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    want.emplace_back("input_norm");
    if (c.layer_type(l) == LayerAttention::kLinear) {
      for (const char* op : {"in_proj_qkvz", "in_proj_ba", "conv1d", "delta_rule_gates",
                             "delta_rule", "gated_norm", "out_proj"})
        want.emplace_back(op);
    } else {
      for (const char* op :
           {"qkv_proj", "qk_norm_rope", "kv_store", "attention", "attn_gate", "o_proj"})
        want.emplace_back(op);
    }
    want.insert(want.end(), moe.begin(), moe.end());
  }
  want.emplace_back("final_norm");
  want.emplace_back("lm_head");
  EXPECT_EQ(timer.names, want);

  // f32 weights and states; one sequence.
  const LinearAttentionConfig& l = c.linear;
  const double linear_layers = 3, h_size = double(c.hidden_size);
  const double key_dim = double(l.num_key_heads * l.key_head_dim);
  const double value_dim = double(l.num_value_heads * l.value_head_dim);
  const double conv_dim = 2 * key_dim + value_dim;
  EXPECT_EQ(timer.bytes["in_proj_qkvz"], linear_layers * (conv_dim + value_dim) * h_size * 4);
  EXPECT_EQ(timer.bytes["in_proj_ba"], linear_layers * 2 * double(l.num_value_heads) * h_size * 4);
  EXPECT_EQ(timer.bytes["out_proj"], linear_layers * h_size * value_dim * 4);
  const double state =
      double(l.num_value_heads) * double(l.key_head_dim) * double(l.value_head_dim) * 4;
  EXPECT_EQ(timer.bytes["delta_rule"], linear_layers * 2 * state);
  const double conv_weight = conv_dim * double(l.conv_kernel_dim) * 4;
  const double conv_state = double(l.conv_kernel_dim - 1) * conv_dim * 4;
  EXPECT_EQ(timer.bytes["conv1d"], linear_layers * (conv_weight + 2 * conv_state));
  const MoeConfig& m = c.moe;
  const double layers = double(c.num_hidden_layers);
  const double inter = double(m.shared_expert_intermediate_size);
  EXPECT_EQ(timer.bytes["shared_gate_up"], layers * 2 * inter * h_size * 4);
  EXPECT_EQ(timer.bytes["shared_down"], layers * h_size * inter * 4);
  EXPECT_EQ(timer.bytes["router"], layers * double(m.num_experts) * h_size * 4);
  // One token reads k of E experts' rows.
  const double experts = double(m.num_experts) * 3 * double(m.moe_intermediate_size) * h_size * 4;
  EXPECT_NEAR(timer.bytes["moe_experts"],
              layers * double(m.num_experts_per_tok) / double(m.num_experts) * experts, 1e-6);
  for (const char* row_op : {"delta_rule_gates", "gated_norm", "attention", "input_norm"})
    EXPECT_EQ(timer.bytes[row_op], 0.0) << row_op;
}

TEST(OpProfile, MarksChangeNoLogitsOfTheHybrid) {
  HybridSession plain, timed;
  RecordingTimer timer;
  timed.model->set_op_timer(&timer);
  for (int s = 0; s < 3; ++s) {
    const Tensor a = plain.step(), b = timed.step();
    ASSERT_EQ(a.numel(), b.numel());
    for (int64_t i = 0; i < a.numel(); ++i)
      ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << "step " << s << " logit " << i;
  }
  timed.model->set_op_timer(nullptr);
}

TEST(OpProfile, HostTimerProfilesTheSessionsDecodeSteps) {
  HybridSession h;
  const ModelConfig& c = h.model->config();
  bench::HostOpTimer timer;
  int runs = 0;
  const int64_t keys_before = static_cast<int64_t>(h.ids.size());
  const bench::OpProfile p = bench::profile_steps(
      *h.model, timer, 4,
      [&] {
        h.step();
        ++runs;
      },
      [&](bench::StepOps& ops) {
        bench::add_attention_kv_bytes(ops, double(h.ids.size()), c.num_key_value_heads, c.head_dim,
                                      4.0);
      });
  EXPECT_EQ(runs, 5);  // one warm-up step left out
  EXPECT_EQ(p.steps(), 4);
  EXPECT_EQ(static_cast<int64_t>(h.ids.size()), keys_before + 5);
  const std::vector<bench::OpProfile::Row> rows = p.rows(100.0);
  std::map<std::string, bench::OpProfile::Row> by_name;
  double sum = 0;
  for (const auto& r : rows) {
    by_name[r.op] = r;
    EXPECT_GE(r.ms, 0.0) << r.op;
    sum += r.ms;
  }
  EXPECT_EQ(rows.front().op, "plan_and_inputs");
  EXPECT_EQ(rows.back().op, "lm_head");
  EXPECT_EQ(by_name["delta_rule"].calls, 3);
  EXPECT_EQ(by_name["attention"].calls, 1);
  EXPECT_EQ(by_name["moe_experts"].calls, c.num_hidden_layers);
  // The last step attended every key of the sequence in the one attention layer.
  const double kv = 2.0 * double(h.ids.size()) * double(c.num_key_value_heads * c.head_dim) * 4;
  EXPECT_EQ(by_name["attention"].bytes, kv);
  EXPECT_DOUBLE_EQ(by_name["attention"].bound_ms, kv / 100e6);
  EXPECT_GT(sum, 0.0);
  const std::string table = p.table(100.0);
  for (const auto& r : rows) EXPECT_NE(table.find("  " + r.op + " "), std::string::npos) << r.op;
  EXPECT_NE(table.find("step (sum of ops)"), std::string::npos);
}

TEST(OpProfile, RowsAreMediansPerStepInFirstRunOrderWithBounds) {
  auto step = [](double a_ms, double b_ms, int b_calls) {
    bench::StepOps s;
    s.order = {"b", "a"};
    s.ops["b"] = {b_calls, b_ms, 2e6};
    s.ops["a"] = {1, a_ms, 0};
    return s;
  };
  bench::OpProfile p;
  p.add(step(1.0, 4.0, 2));
  p.add(step(3.0, 2.0, 2));
  p.add(step(2.0, 9.0, 3));  // b's bytes and calls: the last step's
  EXPECT_EQ(p.steps(), 3);
  const auto rows = p.rows(1000.0);  // 1000 GB/s: 2 MB in 0.002 ms
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].op, "b");
  EXPECT_EQ(rows[0].ms, 4.0);
  EXPECT_EQ(rows[0].calls, 3);
  EXPECT_DOUBLE_EQ(rows[0].bound_ms, 0.002);
  EXPECT_EQ(rows[1].op, "a");
  EXPECT_EQ(rows[1].ms, 2.0);
  EXPECT_EQ(rows[1].bound_ms, 0.0);
  EXPECT_EQ(p.median_step_ms(), 5.0);  // totals 5, 5, 11
  EXPECT_EQ(p.rows(0)[0].bound_ms, 0.0);
  const std::string t = p.table(1000.0);
  EXPECT_NE(t.find("2000.00"), std::string::npos) << t;  // b: x bound 4 / 0.002
  EXPECT_NE(t.find("step (sum of ops) 6.000 ms (median of the step totals 5.000)"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("ops that read no weights or KV: 1 calls, 2.000 ms"), std::string::npos) << t;
}

TEST(OpProfile, FinishWithoutStartIsAnError) {
  bench::HostOpTimer timer;
  EXPECT_THROW(timer.finish(), Error);
  timer.start();
  timer.mark("x", 5);
  timer.mark("y", 0);
  timer.mark("x", 5);
  const bench::StepOps s = timer.finish();
  EXPECT_EQ(s.order, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(s.ops.at("x").calls, 2);
  EXPECT_EQ(s.ops.at("x").bytes, 10.0);
  EXPECT_THROW(timer.finish(), Error);  // a finished step is gone
}

}  // namespace
}  // namespace longctx::testing
