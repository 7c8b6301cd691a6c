// longctx bench throughput | latency | offload: the serving engine's own benchmarks.
//   throughput: nano-vllm's bench.py shape (256 requests, random token prompts of 100-1024
//     tokens, outputs of 100-1024 tokens, temperature 0.6, EOS ignored), all submitted at once;
//     prints requests/s, output tok/s and total tok/s.
//   latency: a batch of fixed-length random prompts; prints TTFT, TPOT and end-to-end time.
//     --json-schema / --json-object / --regex constrain every output (structured outputs): the
//     grammar masks' cost against the same run without them.
//   offload: bench_offload.cpp.
// bench/engine/hf_peer.py runs transformers on the same workloads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "bench_offload.h"
#include "command.h"
#include "generate_common.h"
#include "longctx/core/error.h"
#include "longctx/loader/model_config.h"
#include "seed_option.h"

namespace longctx::cli {
namespace {

struct ThroughputOptions {
  GenerateOptions gen;
  int64_t num_seqs = 256;
  int64_t min_input_len = 100, max_input_len = 1024;
  int64_t min_output_len = 100, max_output_len = 1024;
  int32_t max_token_id = 10000;  // prompt ids drawn from [0, max_token_id] as nano-vllm
  uint64_t seed = 0;
  double temperature = 0.6;
};

struct LatencyOptions {
  GenerateOptions gen;
  int64_t input_len = 32768, output_len = 128, batch_size = 1;
  double temperature = 0;  // greedy by default
  int num_iters = 3, num_warmup = 1;
  uint64_t seed = 0;
  std::string json_schema;  // a schema's JSON text or a file holding it
  bool json_object = false;
  std::string regex;
};

// The structured output the options ask for (at most one of them).
StructuredOutput latency_constraint(const LatencyOptions& o) {
  StructuredOutput c;
  LONGCTX_CHECK(int{!o.json_schema.empty()} + int{o.json_object} + int{!o.regex.empty()} <= 1,
                ErrorCode::kInvalidArgument,
                "bench latency: --json-schema, --json-object and --regex are exclusive");
  if (!o.json_schema.empty()) {
    c.kind = StructuredOutput::Kind::kJsonSchema;
    c.json_schema = o.json_schema;
    if (o.json_schema.front() != '{') {  // a file
      std::ifstream in{std::filesystem::path(o.json_schema)};
      LONGCTX_CHECK(in.good(), ErrorCode::kInvalidArgument,
                    "bench latency: --json-schema {} is neither a JSON object nor a readable file",
                    o.json_schema);
      std::ostringstream text;
      text << in.rdbuf();
      c.json_schema = text.str();
    }
  } else if (o.json_object) {
    c.kind = StructuredOutput::Kind::kJsonObject;
  } else if (!o.regex.empty()) {
    c.kind = StructuredOutput::Kind::kRegex;
    c.regex = o.regex;
  }
  return c;
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::vector<int32_t> random_ids(std::mt19937_64& rng, int64_t n, int32_t max_id) {
  std::uniform_int_distribution<int32_t> tok(0, max_id);
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = tok(rng);
  return ids;
}

int32_t max_id_for(const LLM& llm, int32_t wanted) {
  const ModelConfig* c = llm.model_config();
  return c == nullptr ? wanted : static_cast<int32_t>(std::min<int64_t>(wanted, c->vocab_size - 1));
}

void warm_up(LLM& llm, std::mt19937_64& rng) {
  SamplingParams sp;
  sp.max_tokens = 8;
  sp.ignore_eos = true;
  llm.generate({Prompt(random_ids(rng, 64, max_id_for(llm, 1000)))}, sp, false);
}

void run_throughput(ThroughputOptions& o) {
  LONGCTX_CHECK(o.num_seqs > 0 && 0 < o.min_input_len && o.min_input_len <= o.max_input_len &&
                    0 < o.min_output_len && o.min_output_len <= o.max_output_len,
                ErrorCode::kInvalidArgument,
                "bench throughput: need num_seqs > 0 and 0 < min <= max lengths");
  auto llm = make_llm(o.gen);
  std::mt19937_64 rng(o.seed);
  const int32_t max_id = max_id_for(*llm, o.max_token_id);
  std::uniform_int_distribution<int64_t> in_len(o.min_input_len, o.max_input_len);
  std::uniform_int_distribution<int64_t> out_len(o.min_output_len, o.max_output_len);
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  int64_t prompt_tokens = 0, output_tokens = 0;
  for (int64_t i = 0; i < o.num_seqs; ++i) {
    prompts.emplace_back(random_ids(rng, in_len(rng), max_id));
    prompt_tokens += static_cast<int64_t>(prompts.back().token_ids.size());
    SamplingParams sp;
    sp.temperature = o.temperature;
    sp.ignore_eos = true;
    sp.max_tokens = out_len(rng);
    sp.seed = o.seed + static_cast<uint64_t>(i);
    output_tokens += sp.max_tokens;
    params.push_back(sp);
  }
  warm_up(*llm, rng);
  const double t0 = now_seconds();
  auto outs = llm->generate(prompts, params, /*use_progress_bar=*/false);
  const double dt = now_seconds() - t0;
  int64_t generated = 0;
  for (const auto& out : outs) generated += static_cast<int64_t>(out.token_ids.size());
  LONGCTX_CHECK(generated == output_tokens, ErrorCode::kInternal,
                "bench throughput: {} tokens generated, {} asked for", generated, output_tokens);
  std::printf("throughput: %lld requests (%lld prompt + %lld output tokens) in %.2f s on %s\n",
              static_cast<long long>(o.num_seqs), static_cast<long long>(prompt_tokens),
              static_cast<long long>(output_tokens), dt, llm->device().str().c_str());
  std::printf("  %.2f requests/s, %.0f output tok/s, %.0f total tok/s\n", o.num_seqs / dt,
              output_tokens / dt, (prompt_tokens + output_tokens) / dt);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void run_latency(LatencyOptions& o) {
  LONGCTX_CHECK(o.input_len > 0 && o.output_len > 0 && o.batch_size > 0 && o.num_iters > 0,
                ErrorCode::kInvalidArgument,
                "bench latency: input and output lengths, batch size and iterations must be > 0");
  auto llm = make_llm(o.gen);
  std::mt19937_64 rng(o.seed);
  const int32_t max_id = max_id_for(*llm, 1 << 30);
  SamplingParams sp;
  sp.temperature = o.temperature;
  sp.seed = o.seed;
  sp.ignore_eos = true;
  sp.max_tokens = o.output_len;
  sp.structured = latency_constraint(o);
  std::vector<double> ttft, tpot, e2e;
  int64_t generated = 0, requests = 0;
  RequestMetrics spec;  // the speculative counters summed over the measured requests
  for (int it = 0; it < o.num_warmup + o.num_iters; ++it) {
    // Fresh random prompts every iteration: no prefix-cache hits between iterations.
    std::vector<Prompt> prompts;
    for (int64_t b = 0; b < o.batch_size; ++b)
      prompts.emplace_back(random_ids(rng, o.input_len, max_id));
    const double t0 = now_seconds();
    auto outs = llm->generate(prompts, sp, /*use_progress_bar=*/false);
    const double dt = now_seconds() - t0;
    if (it < o.num_warmup) continue;
    double first = 0, per_token = 0;
    for (const auto& out : outs) {
      // A constrained output may end before output_len (its document complete).
      const auto n = static_cast<int64_t>(out.token_ids.size());
      first = std::max(first, out.metrics.first_token - t0);
      per_token += n > 1 ? out.metrics.decode_seconds() / double(n - 1) : 0;
      generated += n;
      ++requests;
      spec.add_speculative(out.metrics);
    }
    ttft.push_back(first);
    tpot.push_back(per_token / static_cast<double>(outs.size()));
    e2e.push_back(dt);
  }
  std::printf("latency: batch %lld, %lld prompt + %lld output tokens, %d iterations on %s\n",
              static_cast<long long>(o.batch_size), static_cast<long long>(o.input_len),
              static_cast<long long>(o.output_len), o.num_iters, llm->device().str().c_str());
  std::printf("  TTFT %.2f ms, TPOT %.3f ms, end-to-end %.3f s (medians)\n", 1e3 * median(ttft),
              1e3 * median(tpot), median(e2e));
  if (o.gen.model.speculative.enabled())
    std::printf(
        "  speculative: %lld verifying steps, %lld draft tokens, %lld accepted, mean acceptance "
        "length %.2f\n",
        static_cast<long long>(spec.num_drafts), static_cast<long long>(spec.num_draft_tokens),
        static_cast<long long>(spec.num_accepted_tokens), spec.mean_acceptance_length());
  if (sp.structured.enabled())
    std::printf("  structured output: %.1f tokens per request on average\n",
                requests > 0 ? double(generated) / double(requests) : 0.0);
}

CommandRegistration reg("bench", [](CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmark the serving engine");
  bench->require_subcommand(1);

  auto t = std::make_shared<ThroughputOptions>();
  auto* tc = bench->add_subcommand("throughput", "nano-vllm's throughput workload");
  add_engine_options(*tc, t->gen);
  tc->add_option("--num-seqs", t->num_seqs, "requests")->capture_default_str();
  tc->add_option("--min-input-len", t->min_input_len)->capture_default_str();
  tc->add_option("--max-input-len", t->max_input_len)->capture_default_str();
  tc->add_option("--min-output-len", t->min_output_len)->capture_default_str();
  tc->add_option("--max-output-len", t->max_output_len)->capture_default_str();
  tc->add_option("--temperature", t->temperature)->capture_default_str();
  add_seed_option(*tc, "--seed", t->seed, "workload seed (default 0)");
  tc->callback([t] { run_throughput(*t); });

  auto l = std::make_shared<LatencyOptions>();
  auto* lc = bench->add_subcommand("latency", "TTFT and TPOT of one batch");
  add_engine_options(*lc, l->gen);
  lc->add_option("--input-len", l->input_len)->capture_default_str();
  lc->add_option("--output-len", l->output_len)->capture_default_str();
  lc->add_option("--batch-size", l->batch_size)->capture_default_str();
  lc->add_option("--temperature", l->temperature, "sampling temperature (0: greedy)")
      ->capture_default_str();
  lc->add_option("--num-iters", l->num_iters)->capture_default_str();
  lc->add_option("--num-warmup", l->num_warmup)->capture_default_str();
  add_seed_option(*lc, "--seed", l->seed, "workload seed (default 0)");
  lc->add_option("--json-schema", l->json_schema,
                 "constrain every output to this JSON schema (its text or a file)");
  lc->add_flag("--json-object", l->json_object, "constrain every output to a JSON object");
  lc->add_option("--regex", l->regex, "constrain every output to match this regex");
  lc->callback([l] { run_latency(*l); });

  add_bench_offload(bench);
});

}  // namespace
}  // namespace longctx::cli
