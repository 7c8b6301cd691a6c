// Time per GpuSampler::sample call (what the engine waits for: the parameter upload, the
// kernels, the result download and the stream synchronization) for batch sizes and sampling
// settings at Qwen2/Qwen3's vocabulary, on logits N(0, sigma) f32 already on the device.
//   bench_sampling [--vocab 151936] [--rows 1,16,256] [--iters 50] [--sigma 2]
// The last two settings give every row a token mask (structured outputs).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "engine/gpu_sampler.h"
#include "longctx/core/tensor.h"
#include "longctx/engine/sampler.h"

namespace {

using longctx::SamplingParams;

struct Setting {
  const char* name;
  SamplingParams params;
  bool masked = false;  // every row carries a structured-output token mask
};

}  // namespace

int main(int argc, char** argv) {
  int64_t vocab = 151936, iters = 50;
  double sigma = 2.0;
  std::vector<int64_t> rows = {1, 16, 256};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--vocab") vocab = std::atoll(argv[i + 1]);
    if (a == "--rows") rows = longctx::bench::parse_list(argv[i + 1]);
    if (a == "--iters") iters = std::atoll(argv[i + 1]);
    if (a == "--sigma") sigma = std::atof(argv[i + 1]);
  }
  std::vector<Setting> settings(7);
  settings[0].name = "greedy";
  settings[0].params.temperature = 0.0;
  settings[1].name = "top_k=50 top_p=0.9";
  settings[1].params.top_k = 50;
  settings[1].params.top_p = 0.9;
  settings[2].name = "top_p=0.9";
  settings[2].params.top_p = 0.9;
  settings[3].name = "top_k=50";
  settings[3].params.top_k = 50;
  settings[4].name = "top_p=0.9 logprobs=5 rep=1.1";
  settings[4].params.top_p = 0.9;
  settings[4].params.logprobs = 5;
  settings[4].params.repetition_penalty = 1.1;
  // Structured outputs: a mask leaving out ~1 % of the tokens (inside a free string), the
  // greedy row without penalties and a sampled one with them.
  settings[5] = settings[0];
  settings[5].name = "greedy, masked";
  settings[5].masked = true;
  settings[6] = settings[4];
  settings[6].name = "top_p=0.9 rep=1.1, masked";
  settings[6].params.logprobs.reset();
  settings[6].masked = true;

  const int64_t max_rows = *std::max_element(rows.begin(), rows.end());
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(sigma));
  std::vector<float> host(static_cast<size_t>(max_rows * vocab));
  for (float& x : host) x = normal(rng);
  const longctx::Device gpu = longctx::Device::cuda(0);
  longctx::Tensor logits = longctx::Tensor::empty({max_rows, vocab}, longctx::DType::kF32, gpu);
  logits.copy_from(
      longctx::Tensor::from_blob(host.data(), {max_rows, vocab}, longctx::DType::kF32));
  longctx::GpuSampler sampler(max_rows, vocab, gpu);
  std::vector<uint32_t> mask(static_cast<size_t>((vocab + 31) / 32), ~0u);
  for (int64_t t = 0; t < vocab; ++t) {
    if (rng() % 100 == 0) mask[t >> 5] &= ~(1u << (t & 31));
  }
  std::printf("vocab %lld, logits N(0, %.1f), %lld calls per cell, ms per sample() call\n",
              static_cast<long long>(vocab), sigma, static_cast<long long>(iters));
  std::printf("%-30s", "setting \\ rows");
  for (int64_t b : rows) std::printf(" %9lld", static_cast<long long>(b));
  std::printf("\n");
  for (const Setting& s : settings) {
    std::printf("%-30s", s.name);
    for (int64_t b : rows) {
      std::vector<std::vector<int32_t>> prompts(b);
      std::vector<longctx::SamplerState> states;
      for (int64_t r = 0; r < b; ++r) {
        for (int j = 0; j < 200; ++j) prompts[r].push_back(static_cast<int32_t>(rng() % vocab));
        states.emplace_back(s.params, 1000 + r, prompts[r]);
        if (s.masked) states.back().token_mask() = mask;
      }
      std::vector<longctx::SamplerState*> sp;
      for (auto& st : states) sp.push_back(&st);
      std::vector<const SamplingParams*> pp(b, &s.params);
      const longctx::Tensor view = logits.slice(0, 0, b);
      for (int w = 0; w < 5; ++w) sampler.sample(view, sp, pp);
      std::vector<double> ms;
      for (int64_t it = 0; it < iters; ++it) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto out = sampler.sample(view, sp, pp);
        const auto t1 = std::chrono::steady_clock::now();
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        for (int64_t r = 0; r < b; ++r) states[r].append_output(out[r].token);
      }
      std::sort(ms.begin(), ms.end());
      std::printf(" %9.3f", ms[ms.size() / 2]);
    }
    std::printf("\n");
  }
  std::printf("(median of %lld calls; host wall clock around sample(), which synchronizes)\n",
              static_cast<long long>(iters));
  return 0;
}
