// Prefill throughput and decode latency of a model on the GPU runner (paged KV, bf16):
//   bench_model --preset llama-3.1-8b --contexts 32768,131072 --decode-steps 64
//   bench_model --model DIR ...
// For each context length N: a random prompt of N tokens is prefilled (chunks of
// --max-num-batched-tokens) and timed; after the first context only, batch-1 decode steps are
// timed (each step = one forward of one token, logits copied to the host, as the engine does).
// The runner is driven through an ExecutorSession (longctx/engine/executor_session.h: the
// engine's BlockManager keeps the blocks); its decode steps run eagerly unless --runner-graphs
// (the runner's CUDA graphs, as the engine replays them).
// Prints one line per measurement; the peer is hf_peer.py.
// --op-profile-steps N (common/op_profile.h): after the timed decode, N eager decode steps of the
//   runner timed op by op (the model's OpTimer marks: each op's ms per step against the bytes it
//   must read at the HBM's peak), for any model the runner runs (linear-attention state, MoE,
//   quantized weights, FP8 KV); --op-profile-batch B decodes B sequences of the first context
//   (B - 1 more prefills), e.g. the hybrid at batch 32:
//   bench_model --preset qwen3-next-80b-a3b --dummy-layers 4 --contexts 4096 --decode-steps 8
//     --op-profile-steps 8 --op-profile-batch 32
// --cuda-graphs (graph_bench.h): decode with CUDA graphs against eager after the first context,
//   bench_model --preset llama-3.1-8b --contexts 32768 --cuda-graphs --graph-batches 1,16
//   It first times one batch-1 eager step op by op over its own bf16 pool (--op-profile-steps,
//   default 8 there).
// Kernel tuning flags (longctx/kernels/kernel_tuning.h: --prefill-kernel fa2, --decode-loader 0,
// --pdl 0, ...) pin the attention kernels' choices (GpuRunnerOptions::tuning); --help lists them.
// --kv-cache-dtype bf16|fp8 picks the paged cache's format (docs/fp8_kv.md), e.g. decode at 128K
// with an FP8 cache against bf16:
//   bench_model --preset llama-3.1-8b --contexts 131072 --decode-steps 64 --kv-cache-dtype fp8
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "common/op_profile.h"
#include "decode_profile.h"
#include "graph_bench.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/core/stream.h"
#include "longctx/engine/executor_session.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/kernels/kernel_tuning.h"
#include "longctx/kv/kv_cache_dtype.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"

using namespace longctx;

namespace {

// Sequence `seq` (holding `ids`) and batch - 1 more with prompts of its length, prefilled here
// through the runner's session (release() hands the extra ones back).
struct DecodeBatch {
  std::vector<uint64_t> seq_ids;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<SessionInput> inputs;
  double keys = 0;  // the last step's keys over its sequences

  DecodeBatch(ExecutorSession& session, uint64_t seq, const std::vector<int32_t>& ids,
              int64_t batch, int32_t vocab, std::mt19937& rng)
      : seq_ids{seq}, tokens{ids}, inputs(static_cast<size_t>(batch)) {
    std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
    const double t0 = bench::now_seconds();
    for (int64_t b = 1; b < batch; ++b) {
      seq_ids.push_back(1000000 + uint64_t(b));
      tokens.emplace_back(ids.size());
      for (auto& t : tokens.back()) t = tok(rng);
      const SessionInput in{seq_ids.back(), tokens.back()};
      session.run({&in, 1});
    }
    if (batch > 1)
      std::printf("%lld more prompts of %zu tokens prefilled in %.2f s\n",
                  static_cast<long long>(batch - 1), ids.size(), bench::now_seconds() - t0);
  }
  // One decode step of every sequence (a random next token each).
  void step(ExecutorSession& session, std::mt19937& rng, int32_t vocab) {
    std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
    keys = 0;
    for (size_t b = 0; b < tokens.size(); ++b) {
      tokens[b].push_back(tok(rng));
      inputs[b] = {seq_ids[b], tokens[b], 1};
      keys += double(tokens[b].size());
    }
    session.run(inputs);
  }
  void release(ExecutorSession& session) {
    for (size_t b = 1; b < seq_ids.size(); ++b) session.release(seq_ids[b]);
  }
};

// `steps` decode steps of a batch of `batch` sequences after the first context (the runner's
// CUDA graphs with --runner-graphs), wall time per step.
void time_decode(ExecutorSession& session, uint64_t seq, std::vector<int32_t>& ids, int64_t batch,
                 int steps, int32_t vocab, std::mt19937& rng, bool graphs) {
  DecodeBatch b(session, seq, ids, batch, vocab, rng);
  std::vector<double> times;
  for (int s = 0; s < steps; ++s) {
    const double t1 = bench::now_seconds();
    b.step(session, rng, vocab);
    times.push_back(bench::now_seconds() - t1);
  }
  ids = b.tokens[0];
  b.release(session);
  std::sort(times.begin(), times.end());
  double sum = 0;
  for (double t : times) sum += t;
  std::printf(
      "decode after %zu tokens, batch %lld: %.3f ms/step mean, %.3f median, %.3f min "
      "(%d steps, %s)\n",
      ids.size() - steps, static_cast<long long>(batch), 1e3 * sum / times.size(),
      1e3 * times[times.size() / 2], 1e3 * times.front(), steps,
      graphs ? "the runner's CUDA graphs" : "no CUDA graphs");
  std::fflush(stdout);
}

// `steps` eager decode steps of a batch of `batch` sequences after the first context, op by op.
void profile_runner_steps(Model& model, ExecutorSession& session, DType kv_dtype, uint64_t seq,
                          std::vector<int32_t>& ids, int64_t batch, int steps, std::mt19937& rng) {
  const ModelConfig& c = model.config();
  const auto vocab = static_cast<int32_t>(c.vocab_size);
  DecodeBatch b(session, seq, ids, batch, vocab, rng);
  bench::EventOpTimer timer(model.device());
  const bench::OpProfile profile = bench::profile_steps(
      model, timer, steps, [&] { b.step(session, rng, vocab); },
      [&](bench::StepOps& ops) {
        bench::add_attention_kv_bytes(ops, b.keys, c.num_key_value_heads, c.head_dim,
                                      double(dtype_size(kv_dtype)));
      });
  ids = b.tokens[0];
  b.release(session);
  bench::print_op_profile(
      profile,
      fmt::format("a batch-{} eager decode step of the runner after {} tokens ({} KV)", batch,
                  ids.size() - 1, dtype_name(kv_dtype)),
      model.device().index);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("longctx model benchmark (GPU)");
  std::string model_dir, preset = "llama-3.1-8b";
  std::vector<int64_t> contexts = {32768};
  int decode_steps = 32;
  GpuRunnerOptions opts;
  double util = 0.92;
  app.add_option("--model", model_dir, "checkpoint folder (else dummy weights of --preset)");
  app.add_option("--preset", preset, "dummy preset")->capture_default_str();
  int64_t dummy_layers = 0;
  app.add_option("--dummy-layers", dummy_layers,
                 "dummy weights of the preset's first N layers only (models larger than the GPU)");
  app.add_option("--contexts", contexts, "prompt lengths")->delimiter(',');
  app.add_option("--decode-steps", decode_steps, "decode steps timed after the first context");
  app.add_option("--max-num-batched-tokens", opts.max_num_batched_tokens, "prefill chunk")
      ->capture_default_str();
  app.add_option("--block-size", opts.block_size, "KV block size");
  app.add_option("--gpu-memory-utilization", util)->capture_default_str();
  std::string kv_cache_dtype = "bf16";
  app.add_option("--kv-cache-dtype", kv_cache_dtype, "paged KV cache: bf16 or fp8 (E4M3)")
      ->capture_default_str();
  bool cuda_graphs = false;
  std::vector<int64_t> graph_batches = {1};
  int op_profile_steps = -1;  // -1: 8 with --cuda-graphs, else none
  int64_t op_profile_batch = 1;
  int64_t decode_batch = 1;
  app.add_flag("--cuda-graphs", cuda_graphs,
               "decode with CUDA graphs against eager, step by step, after the first context "
               "(engine/cuda_graphs.h driven directly; no GpuRunner)");
  app.add_option("--op-profile-steps", op_profile_steps,
                 "eager decode steps timed op by op (default: 8 with --cuda-graphs, before its "
                 "graph rows; else none; through the runner after the timed decode)");
  app.add_option("--op-profile-batch", op_profile_batch,
                 "sequences of the runner's op-profiled decode steps (each its own prefill of "
                 "the first context)")
      ->capture_default_str();
  app.add_option("--decode-batch", decode_batch,
                 "sequences of the timed decode steps after the first context (each its own "
                 "prefill of it; --runner-graphs for the runner's CUDA graphs)")
      ->capture_default_str();
  app.add_option("--graph-batches", graph_batches, "decode batch sizes for --cuda-graphs")
      ->delimiter(',');
  bool runner_graphs = false;
  app.add_flag("--runner-graphs", runner_graphs,
               "the runner's decode steps replay its CUDA graphs (as the engine's); default: "
               "eager decode steps");
  std::map<std::string, std::string> tuning_values;  // flag name -> value given
  for (const kernels::KernelTuningFlag& f : kernels::kernel_tuning_flags()) {
    const std::string name(f.name);
    app.add_option("--" + name, tuning_values[name],
                   std::string(f.help) + " (" + std::string(f.values) + ")");
  }
  CLI11_PARSE(app, argc, argv);
  for (const auto& [name, value] : tuning_values) {
    std::string error;
    if (!value.empty() && !kernels::parse_kernel_tuning_flag(name, value, &opts.tuning, &error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return 2;
    }
  }
  const int profile_steps = std::max(op_profile_steps, 0);  // the runner's
  try {
    // Before the model is built: the flags' mistakes cost no upload.
    LONGCTX_CHECK(cuda_graphs || profile_steps == 0 || !runner_graphs, ErrorCode::kInvalidArgument,
                  "--op-profile-steps times eager steps: drop --runner-graphs");
    LONGCTX_CHECK(op_profile_batch >= 1 && op_profile_batch <= opts.max_num_seqs,
                  ErrorCode::kInvalidArgument, "--op-profile-batch {} outside [1, {}]",
                  op_profile_batch, opts.max_num_seqs);
    LONGCTX_CHECK(decode_batch >= 1 && decode_batch <= opts.max_num_seqs,
                  ErrorCode::kInvalidArgument, "--decode-batch {} outside [1, {}]", decode_batch,
                  opts.max_num_seqs);
    LONGCTX_CHECK(!cuda_graphs || op_profile_batch == 1, ErrorCode::kInvalidArgument,
                  "--cuda-graphs profiles batch 1: --op-profile-batch is the runner's");
    opts.kv_dtype =
        resolve_kv_cache_dtype(parse_kv_cache_dtype(kv_cache_dtype), false, DType::kBF16);
    const double t_load = bench::now_seconds();
    auto ckpt = std::make_shared<const Checkpoint>(
        model_dir.empty()
            ? make_dummy_checkpoint(dummy_layers > 0
                                        ? first_layers(dummy_preset_config(preset), dummy_layers)
                                        : dummy_preset_config(preset),
                                    1)
            : load_checkpoint(model_dir));
    const double t_host = bench::now_seconds() - t_load;
    configure_device_memory(0, 0, util);
    ModelBuildOptions mo;
    mo.device = Device::cuda(0);
    const double t_up = bench::now_seconds();
    std::shared_ptr<Model> model = create_model(ckpt, mo);
    const double t_upload = bench::now_seconds() - t_up;
    if (cuda_graphs) {
      LONGCTX_CHECK(opts.kv_dtype != DType::kFP8E4M3, ErrorCode::kUnsupported,
                    "--cuda-graphs builds its own bf16 pool: time FP8 decode without it");
      std::printf("model %s on %s; host build %.1f s, upload %.2f s\n",
                  model_dir.empty() ? ("dummy:" + preset).c_str() : model_dir.c_str(),
                  device_properties(0).name, t_host, t_upload);
      bench::GraphBenchArgs g;
      g.context = contexts[0];
      g.batches = graph_batches;
      g.decode_steps = decode_steps;
      g.block_size = opts.block_size > 0 ? opts.block_size : kDefaultBlockSize;
      g.max_num_batched_tokens = opts.max_num_batched_tokens;
      g.tuning = opts.tuning;
      g.op_profile_steps = op_profile_steps < 0 ? 8 : op_profile_steps;
      return bench::run_graph_bench(model, g);
    }
    const ModelConfig& c = model->config();
    int64_t max_ctx = 0;
    for (int64_t n : contexts) max_ctx = std::max(max_ctx, n);
    opts.max_model_len = max_ctx + decode_steps + profile_steps + 2;
    opts.enforce_eager = !runner_graphs;
    // The runner through a session: its steps over the BlockManager's blocks, as the engine's.
    auto runner = std::make_shared<GpuRunner>(model, opts);
    ExecutorSession session = make_gpu_session(runner);
    const int64_t weight_bytes = runner->memory_plan().weights;
    std::printf("model %s: %s weights on %s; host build %.1f s, upload %.2f s (%.1f GB/s)\n",
                model_dir.empty() ? ("dummy:" + preset).c_str() : model_dir.c_str(),
                format_bytes(weight_bytes).c_str(), device_properties(0).name, t_host, t_upload,
                weight_bytes / t_upload / 1e9);
    std::printf("memory plan: %s\n", runner->memory_plan().str().c_str());
    std::printf("KV cache: %s\n", std::string(dtype_name(opts.kv_dtype)).c_str());
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
    // Warm-up (kernels' first launch, cuBLASLt heuristics, pool growth).
    {
      std::vector<int32_t> ids(std::min<int64_t>(4096, contexts[0]));
      for (auto& t : ids) t = tok(rng);
      const SessionInput in{999, ids};
      session.run({&in, 1});
      session.release(999);
    }
    uint64_t seq = 1;
    for (size_t ci = 0; ci < contexts.size(); ++ci) {
      const int64_t n = contexts[ci];
      std::vector<int32_t> ids(n);
      for (auto& t : ids) t = tok(rng);
      ids.reserve(n + decode_steps + 1);
      const SessionInput in{seq, ids};
      device_synchronize(0);
      const double t0 = bench::now_seconds();
      session.run({&in, 1});
      const double dt = bench::now_seconds() - t0;
      std::printf("prefill %7lld tokens: %.3f s  %.0f tok/s  (chunk %lld, block %lld)\n",
                  static_cast<long long>(n), dt, n / dt,
                  static_cast<long long>(opts.max_num_batched_tokens),
                  static_cast<long long>(runner->memory_plan().block_size));
      std::fflush(stdout);
      if (ci == 0 && decode_steps > 0)
        time_decode(session, seq, ids, decode_batch, decode_steps,
                    static_cast<int32_t>(c.vocab_size), rng, runner->graph_memory_bytes() > 0);
      if (ci == 0 && profile_steps > 0)
        profile_runner_steps(*model, session, opts.kv_dtype, seq, ids, op_profile_batch,
                             profile_steps, rng);
      session.release(seq++);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
