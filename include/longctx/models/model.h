// A causal LM built from a checkpoint. One file per architecture under src/models/ implements
// it, reading top to bottom like the Hugging Face modeling file.
#pragma once

#include <cstdint>
#include <memory>

#include "longctx/attention/forward_batch.h"
#include "longctx/core/tensor.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/build_options.h"

namespace longctx {

// Where a forward's time goes, op by op (bench_model's per-op decode profile, bench/model/
// op_profile.h). The model calls mark() right after it issued each op's work: `op` names the op
// (the same name for every layer's), `bytes` what the op must read at least (weights; 0 where the
// caller knows better, e.g. attention's KV, or for row-wise ops). A timer records an event on the
// current stream there, so an op's GPU time is the span from the mark before it.
class OpTimer {
 public:
  virtual ~OpTimer() = default;
  virtual void mark(const char* op, double bytes) = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // Where the weights live and the forward runs (CPU reference: fp32 activations; CUDA: bf16
  // activations, fp32 residual stream and logits).
  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;
  // Softmax scale of the attention: 1 / sqrt(head_dim), or 1 / sqrt(query_pre_attn_scalar) where
  // the config sets it (Gemma 3).
  float attention_scale() const;

  // Runs every sequence of `batch` through the model; `attention` stores and reads K/V.
  // Returns f32 logits [batch.logits_indices.size(), vocab] on device(). Throws Error naming the
  // problem for a malformed batch (before anything is written to the KV).
  virtual Tensor forward(const ForwardBatch& batch, AttentionBackend& attention) = 0;

  // The device half of forward(), for CUDA-graph capture (engine/cuda_graphs.h): the batch was
  // validated and attention.plan()ned already, and its input_ids [T] i32, positions [T] i64 and
  // logits_indices [R] i32 are on device(). Writes f32 logits [R, vocab] into `logits`. Only
  // launches work on the current stream and allocates from the device pool: no host sync, no
  // host-to-device copy, so it can be captured. Rope that depends on a sequence's length
  // (longrope, dynamic NTK) takes each token's position + 1 as that length here, which is exact
  // for the decode batches (one token per sequence) the graphs run.
  virtual void forward_on_device(const Tensor& input_ids, const Tensor& positions,
                                 const Tensor& logits_indices, AttentionBackend& attention,
                                 const Tensor& logits) = 0;

  // Marks every op of the eager forward on `timer` (nullptr: none; the engine runs without one,
  // where a mark is a null check). A virtual here, not a cast to the architecture's class, so a
  // driver that holds only the Model it gave a GpuRunner (bench_model) can time the runner's
  // steps. Not for graph capture: a mark records an event.
  virtual void set_op_timer(OpTimer* timer) = 0;
};

// Whether a quantized checkpoint's Linears run packed: options.packed_weights where set; else
// packed for dummy weights (they have no dense copy) and on a CUDA device, where every format's
// packed GEMVs decode faster than dense bf16 (docs/benchmarks.md); dense on the CPU, where the
// packed op dequantizes on every call (a reference, not a speed path).
bool packs_quantized_linears(const QuantConfig& quantization, const ModelBuildOptions& options,
                             bool dummy_weights);

// Builds the model registered for checkpoint.config.architecture on options.device.
// Throws Error(kUnsupported) listing the supported architectures.
std::unique_ptr<Model> create_model(std::shared_ptr<const Checkpoint> checkpoint,
                                    const ModelBuildOptions& options = {});

}  // namespace longctx
