// longctx info: what a checkpoint is and what it costs to run.
#include <cstdio>
#include <map>

#include "command.h"
#include "loader/quantize_checkpoint.h"
#include "loader/quantized_weights.h"
#include "loader/weight_spec.h"
#include "longctx/attention/kv_groups.h"
#include "longctx/core/device_memory.h"
#include "longctx/engine/gpu_runner.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"
#include "model_options.h"

namespace longctx::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", b, units[u]);
}

void run_info(const ModelOptions& opts) {
  // A dummy model is described from its shapes alone: allocating 16 GB of random weights just
  // to count them would be absurd.
  std::shared_ptr<const Checkpoint> ck;
  ModelConfig c;
  std::map<std::string, int64_t> by_dtype;
  int64_t params = 0;
  size_t bytes = 0;
  if (opts.load_format == "dummy") {
    c = opts.dummy_config();
    for (const auto& [name, shape] : expected_weights(c, quantized_expert_layout(c.quantization))) {
      const bool packed =
          c.quantization.quantized() && quantizes_tensor(name, shape, c.quantization);
      by_dtype[packed ? std::string(quant_method_name(c.quantization.method))
                      : std::string(dtype_name(c.dtype))] += shape_numel(shape);
      params += shape_numel(shape);
      bytes += packed ? quantized_bytes(shape[0], shape[1], c.quantization)
                      : shape_numel(shape) * dtype_size(c.dtype);
    }
  } else {
    ck = opts.load();
    c = ck->config;
    for (const auto& [name, t] : ck->weights.all())
      by_dtype[std::string(dtype_name(t.dtype()))] += t.numel();
    params = ck->weights.num_parameters();
    bytes = ck->weights.num_bytes();
    // The quantized Linears as the checkpoint holds them: packed (not dequantized to count them).
    for (const auto& [name, w] : ck->quantized) {
      by_dtype[quant_method_name(w.method)] += w.out_features * w.in_features;
      params += w.out_features * w.in_features;
      bytes += static_cast<size_t>(quantized_bytes(w));
    }
  }
  std::string dtypes;
  for (const auto& [d, n] : by_dtype)
    dtypes += fmt::format("{}{} ({} params)", dtypes.empty() ? "" : ", ", d, n);
  const char* rope = rope_type_name(c.rope.type);
  const GpuRunnerOptions runner = opts.runner_options(&c);  // --kv-cache-dtype resolved
  std::printf("model:              %s\n", ck ? ck->dir.c_str() : ("dummy:" + opts.preset).c_str());
  std::printf("architecture:       %s\n", c.architecture.c_str());
  std::printf("layers:             %lld\n", (long long)c.num_hidden_layers);
  std::printf("hidden / ffn:       %lld / %lld\n", (long long)c.hidden_size,
              (long long)c.intermediate_size);
  if (const MoeConfig& m = c.moe; m.num_experts > 0) {
    int64_t sparse = 0, expert_params = 0;
    double eb = 0;  // packed where the checkpoint's format keeps experts packed
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) sparse += c.is_moe_layer(i);
    const QuantConfig& q = c.quantization;
    for (const auto& [name, shape] : expected_weights(c, quantized_expert_layout(q)))
      if (name.find(".mlp.experts.") != std::string::npos) {
        expert_params += shape_numel(shape);
        eb += q.quantized() && quantizes_tensor(name, shape, q)
                  ? double(quantized_bytes(shape[0], shape[1], q))
                  : double(shape_numel(shape)) * double(dtype_size(c.dtype));
      }
    std::printf("experts:            %lld routed, top %lld%s, expert ffn %lld",
                (long long)m.num_experts, (long long)m.num_experts_per_tok,
                m.norm_topk_prob ? " (renormalized)" : "", (long long)m.moe_intermediate_size);
    if (m.shared_expert_intermediate_size > 0)
      std::printf(", shared expert ffn %lld", (long long)m.shared_expert_intermediate_size);
    std::printf("; %lld of %lld layers sparse\n", (long long)sparse,
                (long long)c.num_hidden_layers);
    std::printf(
        "expert bytes:       %s in routed experts (%lld params), %s of them read per token\n",
        human_bytes(eb).c_str(), (long long)expert_params,
        human_bytes(eb * double(m.num_experts_per_tok) / double(m.num_experts)).c_str());
  }
  std::printf("heads (q / kv):     %lld / %lld, head_dim %lld\n", (long long)c.num_attention_heads,
              (long long)c.num_key_value_heads, (long long)c.head_dim);
  std::printf("vocab:              %lld%s\n", (long long)c.vocab_size,
              c.tie_word_embeddings ? " (tied embeddings)" : "");
  std::printf("rope:               %s, theta %g, factor %g", rope, c.rope.theta, c.rope.factor);
  if (c.rope.type == RopeType::kLlama3 || c.rope.type == RopeType::kYarn ||
      c.rope.type == RopeType::kLongrope)
    std::printf(", original context %lld", (long long)c.rope.original_max_position_embeddings);
  if (c.rope.partial_rotary_factor != 1.0)
    std::printf(", partial rotary %g", c.rope.partial_rotary_factor);
  if (c.has_local_rope)
    std::printf("; sliding layers: %s, theta %g, factor %g", rope_type_name(c.local_rope.type),
                c.local_rope.theta, c.local_rope.factor);
  std::printf("\n");
  std::printf("parameters:         %lld (%.3f B)\n", (long long)params, params / 1e9);
  std::printf("dtypes:             %s\n", dtypes.c_str());
  std::printf("weight bytes:       %zu (%s)\n", bytes, human_bytes(double(bytes)).c_str());
  // Whether the device holds a quantized checkpoint's Linears packed or their dense copies.
  const Device device = resolve_device(opts.device);
  ModelBuildOptions build;
  build.device = device;
  if (opts.packed_weights) build.packed_weights = true;
  if (opts.dense_weights) build.packed_weights = false;
  const bool packed = packs_quantized_linears(c.quantization, build, ck == nullptr);
  if (packed)
    std::printf(
        "quantization:       %s: the decoder's Linears kept packed (dense where a format cannot "
        "stack q/k/v or gate/up)\n",
        quant_method_name(c.quantization.method));
  else if (c.quantization.quantized())
    std::printf(
        "quantization:       %s: the decoder's Linears dequantized to %s as the model loads "
        "(host memory holds them packed; --packed-weights keeps them packed)\n",
        quant_method_name(c.quantization.method), std::string(dtype_name(c.dtype)).c_str());
  const KvGroups groups = KvGroups::from_config(c, runner.kv_dtype);
  const int64_t info_block = runner.block_size > 0 ? runner.block_size : kDefaultBlockSize;
  std::printf("KV bytes per token: %lld (%s K+V of every attention layer%s)\n",
              (long long)groups.paged_bytes_per_token(),
              std::string(dtype_name(runner.kv_dtype)).c_str(),
              runner.kv_dtype == DType::kFP8E4M3 ? ", plus fp32 K and V scales per block" : "");
  // Each layer's attention state, by group: kind, window, layers, bytes per token (or sequence).
  for (const std::string& g : groups.describe()) std::printf("KV %s\n", g.c_str());
  if (groups.state_bytes_per_seq() > 0)
    std::printf(
        "state snapshots:    %lld for prefix hits, %s each (fp32, as one sequence's "
        "states): %s\n",
        (long long)runner.max_state_snapshots,
        human_bytes(double(groups.state_bytes_per_seq())).c_str(),
        human_bytes(double(runner.max_state_snapshots * groups.state_bytes_per_seq())).c_str());
  // Per sequence, each group as it keeps tokens (a sliding group only its window).
  std::printf("max context:        %lld tokens (KV at max context: %s)\n",
              (long long)c.max_positions(),
              human_bytes(double(groups.bytes_per_seq(c.max_positions(), info_block))).c_str());
  for (int64_t n : {32768LL, 131072LL, 1048576LL})
    std::printf("KV at %7lld tok:   %s\n", (long long)n,
                human_bytes(double(groups.bytes_per_seq(n, info_block))).c_str());
  // The GPU memory plan: of the device this would run on, or of a GPU of --gpu-memory-limit
  // bytes (planning for a card this machine does not have).
  int64_t budget = opts.gpu_memory_limit_bytes();
  if (device.is_cuda()) {
    configure_device_memory(device.index, budget, opts.gpu_memory_utilization);
    budget = device_memory_stats(device.index).budget;
  }
  if (budget > 0) {
    try {
      ModelConfig on_device = c;  // the weights as the GPU would hold them
      if (!packed) on_device.quantization = QuantConfig();
      const GpuMemoryPlan plan = plan_gpu_memory(on_device, runner, budget);
      std::printf("GPU memory plan:    %s%s\n", device.is_cuda() ? "" : "(no GPU here) ",
                  plan.str().c_str());
    } catch (const Error& e) {
      std::printf("GPU memory plan:    does not fit: %s\n", e.what());
    }
  } else {
    std::printf(
        "GPU memory plan:    none (running on the CPU; give --gpu-memory-limit to plan "
        "for a GPU)\n");
  }
}

CommandRegistration reg("info", [](CLI::App& app) {
  auto opts = std::make_shared<ModelOptions>();
  CLI::App* cmd = app.add_subcommand("info", "Describe a checkpoint: shapes, sizes, KV cost");
  opts->add_to(cmd, kModelFlags | kEngineFlags | kOffloadFlags);
  cmd->callback([opts] { run_info(*opts); });
});

}  // namespace
}  // namespace longctx::cli
