// One body for what an ExecutorSession gives on any device (tests/models over the CPU executor,
// tests/gpu_models over the GPU runner): a standalone session over an executor keeps its blocks
// in the engine's BlockManager, so models of several KV groups run standalone as one-group ones:
//   - prompt_logits of a fixture prompt, cut into chunks that end mid-block and past a sliding
//     window, equal the CPU's dense fp32 reference (and, where the device says, transformers);
//   - run() of a batch of prompts of mixed lengths, then batched decode steps, gives each
//     sequence's last-token logits as prompt_logits of that sequence alone gives them, and
//     release() hands every block back;
//   - bad calls are clear errors (tokens past max_model_len, blocks exhausted, a sequence named
//     twice, tokens it does not have), and the session runs on afterwards.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "longctx/core/error.h"
#include "longctx/engine/executor_session.h"
#include "models/model_test_util.h"

namespace longctx::testing {

// Tokens per KV block of every session here: prompts of the cases below end mid-block.
inline constexpr int64_t kSessionBlockSize = 16;

struct SessionDevice {
  // An executor of fixture model `name` (its transformers reference's RoPE numerics) holding
  // `num_blocks` KV blocks of kSessionBlockSize tokens, taking steps of `limits`.
  std::function<std::unique_ptr<Executor>(const std::string& name, int64_t num_blocks,
                                          const ExecutorSessionOptions& limits)>
      make;
  double max_kl = 0;    // per position KL(dense fp32 reference || session)
  double min_top1 = 1;  // top-1 agreement where the reference's top-1/top-2 margin > 0.05
  // |run() - prompt_logits()| per row, relative to max(1, the row's largest |logit|).
  double row_tolerance = 0;
  // Bound on |session - transformers| over the fixture's stored rows; none: not checked (the
  // device's activations are not fp32).
  std::optional<double> max_transformers_error;
};

inline ExecutorSessionOptions session_limits(int64_t max_model_len) {
  ExecutorSessionOptions o;
  o.max_num_batched_tokens = 100;  // chunks end mid-block, past tiny-gemma3's 48-token window
  // The run() case holds four sequences while prompt_logits runs a fifth: a state model's
  // executor holds max_num_seqs states (the GPU runner's slots), so room for more.
  o.max_num_seqs = 8;
  o.max_model_len = max_model_len;
  return o;
}

// Largest |a - b| over a row, relative to max(1, max |a|).
inline double relative_row_diff(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 1;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(a[i])));
  }
  return diff / scale;
}

inline void expect_session_prompt_logits_match_reference(const SessionDevice& d,
                                                         const std::string& name) {
  const ReferenceCase ref = reference_case(name, 515);
  const int64_t n = static_cast<int64_t>(ref.input_ids.size());
  ASSERT_EQ(n, 515);
  const Tensor want = full_forward(*load_fixture_model(name), ref.input_ids);
  ExecutorSession session(d.make(name, 256, session_limits(1024)), session_limits(1024));
  const Tensor got = session.prompt_logits(ref.input_ids);
  ASSERT_EQ(got.shape(), want.shape()) << name;
  const int64_t v = want.size(1);
  double max_kl = 0;
  int64_t compared = 0, agree = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* p = want.data<float>() + r * v;
    const float* q = got.data<float>() + r * v;
    for (int64_t i = 0; i < v; ++i) ASSERT_TRUE(std::isfinite(q[i])) << name << " row " << r;
    max_kl = std::max(max_kl, kl_logits(p, q, v));
    const int32_t top1 = argmax_row(want, r);
    float second = -INFINITY;
    for (int64_t i = 0; i < v; ++i)
      if (i != top1) second = std::max(second, p[i]);
    if (p[top1] - second > 0.05) {
      ++compared;
      agree += argmax_row(got, r) == top1;
    }
  }
  std::printf("%s[515] session: KL max %.2e, top-1 %lld/%lld\n", name.c_str(), max_kl,
              static_cast<long long>(agree), static_cast<long long>(compared));
  EXPECT_LE(max_kl, d.max_kl) << name;
  ASSERT_GT(compared, 0) << name;
  EXPECT_GE(double(agree) / double(compared), d.min_top1) << name;
  if (d.max_transformers_error)
    EXPECT_LE(max_logit_error(got, ref), *d.max_transformers_error) << name;
}

inline void expect_session_run_equals_prompt_logits(const SessionDevice& d,
                                                    const std::string& name) {
  ExecutorSession session(d.make(name, 512, session_limits(1024)), session_limits(1024));
  const int64_t free_before = session.num_free_blocks();
  const int64_t vocab = session.vocab_size();
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t len : {1, 17, 130, 300})  // 300: three steps of chunks, other prompts beside
    seqs.push_back(make_ids(len, len, vocab));
  auto expect_rows_match = [&](const Tensor& rows, const char* what) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      const Tensor alone = session.prompt_logits(seqs[i]);
      const float* want = alone.data<float>() + (alone.size(0) - 1) * vocab;
      const float* got = rows.data<float>() + i * vocab;
      EXPECT_LE(relative_row_diff(want, got, vocab), d.row_tolerance)
          << name << " " << what << ", sequence of " << seqs[i].size() << " tokens";
      const Tensor row = rows.slice(0, i, i + 1).contiguous();
      EXPECT_EQ(argmax_row(row, 0), argmax_row(alone, alone.size(0) - 1))
          << name << " " << what << ", sequence of " << seqs[i].size() << " tokens";
    }
  };
  std::vector<SessionInput> batch;
  for (size_t i = 0; i < seqs.size(); ++i) batch.push_back({10 + i, seqs[i]});
  const Tensor prefill = session.run(batch);
  ASSERT_EQ(prefill.size(0), 4);
  expect_rows_match(prefill, "prefill");
  for (int step = 0; step < 3; ++step) {  // every sequence decodes in one step
    batch.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].push_back(static_cast<int32_t>((step * 13 + i * 7) % vocab));
      batch.push_back({10 + i, seqs[i], 1});
    }
    expect_rows_match(session.run(batch), "decode");
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(session.num_tokens(10 + i), static_cast<int64_t>(seqs[i].size()));
    session.release(10 + i);
    EXPECT_EQ(session.num_tokens(10 + i), 0);
  }
  EXPECT_EQ(session.num_free_blocks(), free_before) << name;
}

inline void expect_error_code(const std::function<void()>& f, ErrorCode code, const char* what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << what << ": " << e.what();
  }
}

inline void expect_session_errors_are_clear(const SessionDevice& d, const std::string& name) {
  // 30 blocks (one may be the device's own) of a one-full-group model: a 300-token sequence
  // (19 blocks) fits, a second one runs its first chunks and then finds no blocks.
  ExecutorSession session(d.make(name, 30, session_limits(400)), session_limits(400));
  const int64_t free_before = session.num_free_blocks();
  const int64_t vocab = session.vocab_size();
  const std::vector<int32_t> a = make_ids(300, 1, vocab), b = make_ids(300, 2, vocab);
  expect_error_code([&] { session.prompt_logits(make_ids(401, 3, vocab)); }, ErrorCode::kOutOfRange,
                    "past max_model_len");
  const SessionInput first{1, a};
  const Tensor want = session.run({&first, 1});
  const SessionInput twice[] = {{2, b, 10}, {2, b, 10}};
  expect_error_code([&] { session.run(twice); }, ErrorCode::kInvalidArgument, "named twice");
  const SessionInput past{1, a, 1};  // it holds all of `a` already
  expect_error_code(
      [&] {
        session.run({&past, 1});
      },
      ErrorCode::kInvalidArgument, "tokens it does not have");
  const SessionInput second{2, b};
  expect_error_code(
      [&] {
        session.run({&second, 1});
      },
      ErrorCode::kOutOfMemory, "blocks exhausted");
  EXPECT_EQ(session.num_tokens(2), 0);  // the failed step dropped it
  EXPECT_EQ(session.num_tokens(1), 300);
  session.release(1);
  EXPECT_EQ(session.num_free_blocks(), free_before) << name;
  // The session runs on: `a` again gives its logits again.
  const Tensor again = session.run({&first, 1});
  EXPECT_LE(relative_row_diff(want.data<float>(), again.data<float>(), vocab), d.row_tolerance);
  session.release(1);
}

}  // namespace longctx::testing
