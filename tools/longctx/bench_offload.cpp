// longctx bench offload: prefill and decode of one long random prompt on the GPU runner, with the
// KV cache resident or offloaded (--kv-offload and its flags), at each --context-len. Prints per
// length the prefill time and tok/s, decode ms/token, the GPU and host KV bytes, the host bytes
// each decode step moved, the link rate achieved and the PCIe bound of those bytes at the link's
// peak (one pinned copy timed in the same process).
#include "bench_offload.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "attention/backends/offload_backend.h"
#include "longctx/core/device_memory.h"
#include "longctx/core/error.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"
#include "model_options.h"
#include "seed_option.h"

namespace longctx::cli {
namespace {

struct Options {
  ModelOptions model;
  std::vector<int64_t> context_lens = {32768};
  int64_t decode_steps = 16;
  uint64_t seed = 0;
  bool profile_phases = false;  // the decode steps' time per attention phase (GpuRunner)
  bool cuda_graphs = false;     // decode steps replay CUDA graphs where the runner captures them
  int64_t prefill_report = 0;   // > 0: prefill in runs of this many tokens, each one timed
};

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void run(const Options& o) {
  LONGCTX_CHECK(o.decode_steps > 0 && !o.context_lens.empty(), ErrorCode::kInvalidArgument,
                "bench offload: --decode-steps and --context-len must be given and positive");
  std::shared_ptr<const Checkpoint> checkpoint = o.model.load();
  std::shared_ptr<Model> model = o.model.create(checkpoint);
  LONGCTX_CHECK(model->device().is_cuda(), ErrorCode::kUnsupported,
                "bench offload runs on a CUDA device");
  const int64_t longest = *std::max_element(o.context_lens.begin(), o.context_lens.end());
  GpuRunnerOptions r = o.model.runner_options();
  r.max_model_len = longest + o.decode_steps;
  r.max_num_seqs = std::min<int64_t>(r.max_num_seqs, 2);
  LONGCTX_CHECK(!(o.cuda_graphs && o.profile_phases), ErrorCode::kInvalidArgument,
                "bench offload: --profile-phases times eager steps; drop --cuda-graphs");
  // Eager by default (the numbers so far); --cuda-graphs: the runner's decode graphs where it
  // captures them (resident KV; offloaded KV under quest).
  r.enforce_eager = !o.cuda_graphs;
  auto runner = std::make_shared<GpuRunner>(model, r);
  ExecutorSession session = make_gpu_session(runner);
  const GpuMemoryPlan& plan = runner->memory_plan();
  const double link = r.kv_offload ? measure_host_to_device_gbps(model->device(), 1ll << 30) : 0;
  std::printf("bench offload: %s (%s), %s, sparse policy %s\n  plan: %s\n",
              r.kv_offload ? "KV offload" : "resident KV",
              std::string(dtype_name(r.kv_dtype)).c_str(), model->device().str().c_str(),
              std::string(sparse_policy_name(r.sparse.policy)).c_str(), plan.str().c_str());
  if (r.kv_offload) std::printf("  link: pinned host -> device %.1f GB/s (1 GiB copy)\n", link);
  if (runner->graph_memory_bytes() > 0)
    std::printf("  decode steps: CUDA graphs (%s)\n",
                format_bytes(runner->graph_memory_bytes()).c_str());
  else
    std::printf("  decode steps: eager%s\n",
                o.cuda_graphs ? " (no graphs captured: offloaded KV without quest, or a policy "
                                "without)"
                              : "");
  std::mt19937_64 rng(o.seed);
  const int32_t vocab = static_cast<int32_t>(model->config().vocab_size);
  uint64_t id = 1;
  for (int64_t n : o.context_lens) {
    std::vector<int32_t> ids(n + o.decode_steps);
    for (auto& t : ids) t = static_cast<int32_t>(rng() % vocab);
    const auto c0 = runner->offload_counters();
    const double t0 = now_seconds();
    // A prefill of a million tokens runs for minutes: in runs of --prefill-report tokens it says
    // how far it is (each run still chunks by --max-num-batched-tokens inside).
    const int64_t slice = o.prefill_report > 0 ? o.prefill_report : n;
    for (int64_t done = 0; done < n;) {
      const SessionInput in{id, ids, std::min(slice, n - done)};
      session.run({&in, 1});
      done += in.num_new;
      if (o.prefill_report > 0) {
        const double s = now_seconds() - t0;
        std::printf("  prefill %lld / %lld tokens at %.1f s (%.0f tok/s so far)\n",
                    static_cast<long long>(done), static_cast<long long>(n), s, double(done) / s);
        std::fflush(stdout);
      }
    }
    const double prefill = now_seconds() - t0;
    const auto c1 = runner->offload_counters();
    if (o.profile_phases) {
      runner->profile_phases();
      runner->phase_profile();  // from the first decode step on
    }
    std::vector<double> steps;
    for (int64_t k = 0; k < o.decode_steps; ++k) {
      const SessionInput d{id, ids, 1};
      const double s0 = now_seconds();
      session.run({&d, 1});
      steps.push_back(now_seconds() - s0);
    }
    const auto c2 = runner->offload_counters();
    session.release(id++);
    std::vector<double> sorted = steps;
    std::sort(sorted.begin(), sorted.end());
    // `later`: the mean of the steps after the first (the first decode step launches kernels the
    // prefill did not, and a kernel's first launch loads its module).
    double mean = 0, later = 0;
    for (double s : steps) mean += s / static_cast<double>(steps.size());
    for (size_t k = 1; k < steps.size(); ++k) later += steps[k] / double(steps.size() - 1);
    // Through the ring, or read in place by a sparse policy.
    const double per_step_bytes = double(c2.host_bytes_loaded - c1.host_bytes_loaded +
                                         c2.sparse_host_bytes_read - c1.sparse_host_bytes_read) /
                                  double(o.decode_steps);
    std::printf(
        "  context %lld: prefill %.3f s (%.0f tok/s, %.2f GB from the host, %.2f GB written "
        "back), decode %.3f ms/token mean, %.3f median, %.3f min, %.3f max (step 1: %.3f; mean "
        "after it %.3f)",
        static_cast<long long>(n), prefill, double(n) / prefill,
        double(c1.host_bytes_loaded - c0.host_bytes_loaded + c1.sparse_host_bytes_read -
               c0.sparse_host_bytes_read) /
            1e9,
        double(c1.host_bytes_written - c0.host_bytes_written) / 1e9, 1e3 * mean,
        1e3 * sorted[sorted.size() / 2], 1e3 * sorted.front(), 1e3 * sorted.back(),
        1e3 * steps.front(), steps.size() > 1 ? 1e3 * later : 1e3 * mean);
    if (r.kv_offload) {
      const double bound_ms = per_step_bytes / (link * 1e9) * 1e3;
      std::printf(
          "; KV %.2f GB (GPU cache %.2f GB, host pool %.2f GB); per decode step %.3f GB from "
          "the host at %.1f GB/s, PCIe bound %.2f ms (decode / bound %.3f)",
          double(n) * double(plan.kv_block_bytes) / double(plan.block_size) / 1e9,
          double(plan.kv_bytes()) / 1e9, double(plan.host_kv_bytes()) / 1e9, per_step_bytes / 1e9,
          per_step_bytes / mean / 1e9, bound_ms, bound_ms > 0 ? 1e3 * mean / bound_ms : 0.0);
    }
    if (r.sparse.quest_reuse && r.kv_offload)
      std::printf("; quest reuse: %.0f (page, KV head) pairs reused per decode step",
                  double(c2.sparse_pages_reused - c1.sparse_pages_reused) / double(o.decode_steps));
    // A prefill policy that counts its kept blocks (xattention) reports its density.
    if (const auto sc = runner->sparse_counters(); sc.prefill_blocks_causal > 0) {
      std::printf("; prefill density %.3f (key blocks kept of causal, all prompts so far)",
                  sc.prefill_blocks_causal > 0
                      ? double(sc.prefill_blocks_kept) / double(sc.prefill_blocks_causal)
                      : 0.0);
    }
    std::printf("\n");
    if (o.profile_phases) std::printf("%s", runner->phase_profile().c_str());
    std::fflush(stdout);
  }
  const DeviceMemoryStats st = device_memory_stats(model->device().index);
  std::printf("  device pool: budget %s, peak %s\n", format_bytes(st.budget).c_str(),
              format_bytes(st.peak_in_use).c_str());
}

}  // namespace

void add_bench_offload(CLI::App* bench) {
  auto o = std::make_shared<Options>();
  auto* cmd = bench->add_subcommand(
      "offload", "prefill tok/s and decode ms/token of one long prompt, KV resident or offloaded");
  o->model.add_to(cmd);
  cmd->add_option("--context-len", o->context_lens, "prompt lengths, e.g. 32768 131072")
      ->capture_default_str();
  cmd->add_option("--decode-steps", o->decode_steps, "decode steps after each prefill")
      ->capture_default_str();
  add_seed_option(*cmd, "--seed", o->seed, "prompt seed (default 0)");
  cmd->add_option("--prefill-report", o->prefill_report,
                  "prefill in runs of this many tokens and print the time after each (0: one run)")
      ->capture_default_str();
  cmd->add_flag("--cuda-graphs", o->cuda_graphs,
                "decode steps replay CUDA graphs where the runner captures them (resident KV "
                "under full or quest attention, offloaded KV under quest)");
  cmd->add_flag("--profile-phases", o->profile_phases,
                "print the decode steps' host and GPU time per attention phase (adds a few us "
                "of host time per mark)");
  cmd->callback([o] { run(*o); });
}

}  // namespace longctx::cli
