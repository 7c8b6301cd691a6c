// One body for FP8 KV through the offload device on any device (the CPU simulation in
// tests/engine, the CUDA device in tests/gpu_models): an executor whose FP8 KV cache lives in the
// host pool, with a GPU cache of a few blocks so that most blocks stream through the ring, gives
// the resident FP8 cache's logits at the end of every chunk of a chunked prefill (chunks that end
// inside blocks, so later rows raise a block's scales, and a block's earlier rows come back from
// the host with their scales) and at every step of a greedy decode after it (the resident
// executor's tokens fed to both), and the same greedy tokens where the resident top-1 leads by
// more than bounds.top1_margin. The two differ only in the order in which partial attention
// states are merged (offload splits each query's keys at the GPU / host boundary and per ring
// slot); on a 16-bit device that moves the rounding of the attention output, and so later
// layers' K/V, which FP8 then encodes (a code near a rounding midpoint may take the next one).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "longctx/engine/executor.h"

namespace longctx::testing {

struct Fp8OffloadBounds {
  double max_abs_logit = 0;  // |logit difference| at any compared row
  double max_kl = 0;         // KL(resident || offload) of any compared row, nats
  float top1_margin = 0;     // rows whose resident top-1 leads by more must agree on it
};

struct Fp8OffloadReport {
  double max_abs_logit = 0, max_kl = 0;
  int rows = 0, confident = 0, agree = 0;
};

// Compares one row (f32 logits of one token) and folds it into `r`.
inline void fp8_offload_compare_row(const float* a, const float* b, int64_t v, float margin,
                                    Fp8OffloadReport& r) {
  double ma = a[0], mb = b[0];
  for (int64_t i = 0; i < v; ++i) ma = std::max<double>(ma, a[i]), mb = std::max<double>(mb, b[i]);
  double sa = 0, sb = 0;
  for (int64_t i = 0; i < v; ++i) sa += std::exp(a[i] - ma), sb += std::exp(b[i] - mb);
  double kl = 0;
  int64_t top1 = 0, top2 = -1, got1 = 0;
  for (int64_t i = 0; i < v; ++i) {
    ASSERT_TRUE(std::isfinite(b[i])) << "offload logit " << i << " is not finite";
    const double la = a[i] - ma - std::log(sa), lb = b[i] - mb - std::log(sb);
    kl += std::exp(la) * (la - lb);
    r.max_abs_logit = std::max<double>(r.max_abs_logit, std::fabs(a[i] - b[i]));
    if (a[i] > a[top1]) top1 = i;
    if (b[i] > b[got1]) got1 = i;
  }
  for (int64_t i = 0; i < v; ++i)
    if (i != top1 && (top2 < 0 || a[i] > a[top2])) top2 = i;
  r.max_kl = std::max(r.max_kl, kl);
  ++r.rows;
  if (a[top1] - a[top2] > margin) {
    ++r.confident;
    r.agree += got1 == top1;
  }
}

inline int64_t fp8_offload_argmax(const Tensor& host_logits) {
  const float* x = host_logits.data<float>();
  return std::max_element(x, x + host_logits.numel()) - x;
}

// Runs executors `resident` and `offload` (one model and block size; each must hold
// tokens.size() + decode_steps tokens of one sequence) along a prefill of `tokens` in chunks and
// a greedy decode of the resident's tokens after it, comparing their logits at every chunk end
// and decode step (rows whose resident top-1 leads by more than top1_margin counted as
// confident). decode (optional) gets the decode steps' rows alone.
inline Fp8OffloadReport compare_fp8_executors(Executor& resident, Executor& offload,
                                              std::vector<int32_t> tokens, int64_t chunk,
                                              int64_t decode_steps, float top1_margin,
                                              Fp8OffloadReport* decode = nullptr) {
  Fp8OffloadReport r;
  const int64_t bs = resident.kv_layout().block_size;
  EXPECT_EQ(offload.kv_layout().block_size, bs);
  const int64_t n = static_cast<int64_t>(tokens.size()), total = n + decode_steps;
  const int64_t blocks = (total + bs - 1) / bs;
  EXPECT_LE(blocks, resident.kv_layout().num_blocks);
  EXPECT_LE(blocks, offload.kv_layout().num_blocks);
  // Blocks in descending ids: a table's runs are not the identity.
  std::vector<int32_t> table(blocks);
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(blocks - 1 - b);
  tokens.reserve(total);
  auto step = [&](Executor& x, int64_t done, int64_t count) {
    StepInput in;
    in.seq_id = 1;
    in.all_tokens = tokens;
    in.num_computed = done;
    in.num_new = count;
    in.block_table = table;
    return x.execute({&in, 1}, {}).to(Device::cpu());
  };
  const int64_t v = resident.vocab_size();
  for (int64_t done = 0; done < n; done += chunk) {
    const int64_t count = std::min(chunk, n - done);
    const Tensor a = step(resident, done, count), b = step(offload, done, count);
    EXPECT_EQ(a.numel(), v);
    EXPECT_EQ(b.numel(), v);
    fp8_offload_compare_row(a.data<float>(), b.data<float>(), v, top1_margin, r);
    if (done + count == n) tokens.push_back(static_cast<int32_t>(fp8_offload_argmax(a)));
  }
  for (int64_t k = 0; k + 1 < decode_steps; ++k) {  // the last token needs no step
    const int64_t done = n + k;
    const Tensor a = step(resident, done, 1), b = step(offload, done, 1);
    fp8_offload_compare_row(a.data<float>(), b.data<float>(), v, top1_margin, r);
    if (decode != nullptr)
      fp8_offload_compare_row(a.data<float>(), b.data<float>(), v, top1_margin, *decode);
    tokens.push_back(static_cast<int32_t>(fp8_offload_argmax(a)));
  }
  return r;
}

// `resident` and `offload`: executors of one model and block size, both with an FP8 KV cache,
// `offload` through its offload device; each must hold prompt.size() + decode_steps tokens of one
// sequence. Returns what it measured (the caller prints it).
inline Fp8OffloadReport check_fp8_offload_equals_resident(Executor& resident, Executor& offload,
                                                          std::vector<int32_t> tokens,
                                                          int64_t chunk, int64_t decode_steps,
                                                          const Fp8OffloadBounds& bounds) {
  const Fp8OffloadReport r = compare_fp8_executors(resident, offload, std::move(tokens), chunk,
                                                   decode_steps, bounds.top1_margin);
  EXPECT_GT(offload.counters().offload_host_bytes_loaded, 0)
      << "no block came from the host: the GPU cache is not small enough to test the ring";
  EXPECT_LE(r.max_abs_logit, bounds.max_abs_logit);
  EXPECT_LE(r.max_kl, bounds.max_kl);
  EXPECT_GT(r.confident, 0);
  EXPECT_EQ(r.agree, r.confident) << "greedy tokens where the resident cache is confident";
  std::printf(
      "FP8 offload vs resident FP8 over %d rows: max |logit difference| %.3e, max KL %.3e, "
      "top-1 %d of %d confident rows\n",
      r.rows, r.max_abs_logit, r.max_kl, r.agree, r.confident);
  return r;
}

}  // namespace longctx::testing
