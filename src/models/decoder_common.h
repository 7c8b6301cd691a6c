// Building blocks shared by the decoder-only architectures (Llama, Mistral, Phi-3, Qwen2, Qwen3,
// Gemma 3): the
// weights of a layer, and the pieces every HF modeling file repeats ("Copied from
// transformers.models.llama..."): RMSNorm, the gated SiLU MLP, projections with optional bias,
// rotary embedding, attention. Each architecture file composes them in the order of its HF
// forward(). The code is one for every device: ops dispatch on the tensors' device, and the
// AttentionBackend decides where K/V live.
//
// Loaded differently from the checkpoint in two ways: q/k/v_proj are fused into one qkv_proj and
// gate/up_proj into gate_up_proj (rows concatenated), so each is one GEMM; q, k, v and gate, up
// are strided views of its output. (The loader gives every checkpoint these names: Phi-3's fused
// tensors split, a multimodal checkpoint's text model under model.) And Gemma's
// zero-centred norm weights w are loaded as 1 + w, so one RMSNorm op serves every family.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "longctx/core/tensor.h"
#include "longctx/loader/checkpoint.h"
#include "longctx/models/model.h"
#include "models/tensor_parallel.h"
#include "ops/rope.h"

namespace longctx::models {

// A Linear's weight: dense rows in the device's dtype, or a quantized checkpoint's packed tensors
// as stored (on the device), which ops::quantized_linear runs without a dense copy.
struct LinearWeight {
  Tensor dense;            // [out, in]; undefined when packed
  QuantizedWeight packed;  // the format's tensors (quantization.h); method kNone when dense
  bool is_packed() const { return packed.method != QuantMethod::kNone; }
  bool defined() const { return dense.defined() || is_packed(); }
};

// The block scales of FP8 experts kept packed (ops::MoeArgs' layout); undefined for float experts.
struct ExpertScales {
  Tensor gate_up;  // [experts, 2 ceil(moe_inter / block_out), ceil(hidden / block_in)] f32
  Tensor down;     // [experts, ceil(hidden / block_out), ceil(moe_inter / block_in)] f32
  int64_t block_out = 0, block_in = 0;
  bool defined() const { return gate_up.defined(); }
};

// One decoder layer. Optional tensors (biases, q/k norms) are undefined when absent.
struct LayerWeights {
  Tensor input_layernorm;             // [hidden]
  LinearWeight qkv_proj;              // [q_size + 2 kv_size, hidden]
  Tensor qkv_bias;                    // [q_size + 2 kv_size]
  LinearWeight o_proj;                // [hidden, q_size]
  Tensor o_bias;                      // [hidden]
  Tensor q_norm, k_norm;              // [head_dim] each (Qwen3, Gemma 3)
  Tensor post_attention_layernorm;    // [hidden]
  Tensor pre_feedforward_layernorm;   // [hidden] (Gemma 3: post_attention_layernorm then
  Tensor post_feedforward_layernorm;  // [hidden]  normalizes the attention output)
  LinearWeight gate_up_proj;          // [2 intermediate, hidden]
  Tensor gate_up_bias;                // [2 intermediate]
  LinearWeight down_proj;             // [hidden, intermediate]
  Tensor down_bias;                   // [hidden]
  // A mixture-of-experts layer (config.is_moe_layer) instead of gate_up_proj / down_proj:
  Tensor router;  // mlp.gate [experts, hidden]
  // [experts, 2 moe_inter, hidden], [experts, hidden, moe_inter]: the device's float dtype, or
  // F8_E4M3 codes when experts_fp8 holds their scales.
  Tensor experts_gate_up, experts_down;
  ExpertScales experts_fp8;
  LinearWeight shared_gate_up, shared_down;  // the shared expert (Qwen2-MoE), as gate_up/down_proj
  Tensor shared_expert_gate;                 // [1, hidden]
};

// The step's inputs on the model's device.
struct StepInputs {
  int64_t num_tokens = 0;
  Tensor input_ids;       // [T] i32
  Tensor positions;       // [T] i64
  Tensor logits_indices;  // [R] i32
  // [S + 1] host: sequence s owns rows [qo_indptr[s], qo_indptr[s + 1]) (linear attention runs
  // each sequence through its own state); empty on the device-only path.
  std::span<const int32_t> qo_indptr;
  // [T] i64: the length of each token's sequence at the end of the step (its largest position
  // in the step + 1), which picks longrope's and dynamic NTK's frequencies; undefined for a
  // fixed rope, or on the device-only path (decode: position + 1 is that length).
  Tensor rope_lens;
};

// The op marks (OpTimer) of one gated MLP: the dense MLP's, or a MoE block's shared expert's (so
// the profile tells it from a dense layer's).
struct MlpMarks {
  const char* gate_up = "gate_up_proj";
  const char* act = "act_and_mul";
  const char* down = "down_proj";
};

// What a decoder-only model owns: the checkpoint (its mmaps back every CPU weight), the weights
// by role on the model's device, and the rope frequencies. forward() and the decoder layer are
// the same in every HF file of this family (LlamaModel / Qwen2Model / Qwen3Model); an
// architecture overrides self_attn() where its attention differs.
class DecoderModel : public Model {
 public:
  DecoderModel(std::shared_ptr<const Checkpoint> checkpoint, const ModelBuildOptions& options);
  // The checkpoint's config, or a tensor-parallel rank's (tp_local_config).
  const ModelConfig& config() const override { return config_; }
  Device device() const override { return device_; }
  DType activation_dtype() const override { return act_dtype_; }

  // *ForCausalLM.forward -> *Model.forward (embed, decoder layers), then norm and lm_head on the
  // rows that need logits.
  Tensor forward(const ForwardBatch& batch, AttentionBackend& attention) override;
  void forward_on_device(const Tensor& input_ids, const Tensor& positions,
                         const Tensor& logits_indices, AttentionBackend& attention,
                         const Tensor& logits) override;

  void set_op_timer(OpTimer* timer) override { op_timer_ = timer; }

 protected:
  // Embedding, every layer, final norm and lm_head into logits [R, vocab] f32: the part of
  // forward() after plan() and the input upload.
  void run_layers(const StepInputs& in, AttentionBackend& attention, const Tensor& logits);
  // *DecoderLayer.forward: pre-norm attention and MLP, each with a residual. The residual stream
  // is fp32 on every device and the adds are fused into the next norm (vLLM's fused_add_rms_norm):
  // on entry `residual` is the layer's input and `mlp_out` the previous layer's MLP output
  // (undefined for layer 0); on return `mlp_out` is this layer's and `residual` the sum before it.
  virtual void decoder_layer(int64_t i, Tensor& residual, Tensor& mlp_out, const StepInputs& in,
                             AttentionBackend& attention);
  // LlamaAttention.forward: project (bias where the checkpoint has one), normalize each head of q
  // and k where the config has q/k norms (Qwen3Attention, Gemma3Attention), rotate q and k, store
  // k and v, attend, project back.
  virtual Tensor self_attn(const Tensor& hidden_states, int64_t i, const StepInputs& in,
                           AttentionBackend& attention);

  // The step's ids, positions and logits rows on device_ (views of the batch on the CPU).
  StepInputs upload_inputs(const ForwardBatch& batch) const;
  // A new activation-dtype tensor on the model's device.
  Tensor act_empty(const Shape& shape) const;
  // RMSNorm over the last dim of x (weight's length) into a new activation tensor.
  Tensor rms_norm(const Tensor& x, const Tensor& weight) const;
  // residual += x; returns rms_norm(residual) (fused add + norm).
  Tensor add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight) const;
  // x @ weight^T + bias (bias may be undefined), a new [n, out] activation tensor.
  Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) const;
  Tensor linear(const Tensor& x, const LinearWeight& weight, const Tensor& bias) const;
  // q, k, v of a fused projection output qkv [T, (Hq + 2 Hkv) head_dim]: [T, H, head_dim] views;
  // qk: q and k together ([T, Hq + Hkv, head_dim], adjacent in each row), so RoPE, which treats
  // every head alike, runs once over both.
  struct QKV {
    Tensor q, k, v, qk;
  };
  QKV split_qkv(const Tensor& qkv) const;
  // down_proj(act(gate_proj(x)) * up_proj(x)): LlamaMLP / Qwen2MLP / Qwen3MLP (silu),
  // Gemma3MLP (gelu_pytorch_tanh).
  Tensor gated_mlp(const Tensor& x, const LayerWeights& w) const;
  Tensor gated_mlp(const Tensor& x, const LinearWeight& gate_up, const Tensor& gate_up_bias,
                   const LinearWeight& down, const Tensor& down_bias,
                   const MlpMarks& marks = {}) const;
  // Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock: router, top-k experts, the shared expert.
  Tensor sparse_moe_block(const Tensor& x, const LayerWeights& w) const;
  // In place on x [T, heads, head_dim] at the step's positions, with layer i's rope (Gemma 3's
  // sliding layers have their own).
  void apply_rope(const Tensor& x, const StepInputs& in, int64_t i) const;
  // The rope arguments of layer i (its kind's frequencies; the step's lengths).
  ops::RopeArgs rope_args(const StepInputs& in, int64_t i) const;
  // Final norm (after the last residual add) and lm_head over the rows that need logits, into
  // logits [R, vocab] f32.
  void final_logits(const Tensor& residual, const Tensor& mlp_out, const StepInputs& in,
                    const Tensor& logits) const;

  // op_timer_->mark(op, bytes) where a timer is set.
  void mark(const char* op, double bytes = 0) const {
    if (op_timer_ != nullptr) op_timer_->mark(op, bytes);
  }

  // With any communicator (one rank too: its collectives run, NCCL's included).
  bool sharded() const { return comm_ != nullptr; }
  // residual [T, hidden] f32 = embed_tokens[input_ids] (vocab-parallel: summed over the ranks).
  void embed(const StepInputs& in, const Tensor& residual) const;
  // x summed over the ranks (row-parallel outputs); nothing without tensor parallelism.
  void reduce(const Tensor& x) const;

  std::shared_ptr<const Checkpoint> checkpoint_;
  ModelConfig config_;
  TpShard shard_;                       // the whole model when not sharded
  std::shared_ptr<Communicator> comm_;  // null: not sharded
  Device device_;
  DType act_dtype_ = DType::kF32;  // activations (CPU f32, CUDA bf16); the residual is f32
  Tensor embed_tokens_;            // [vocab (the rank's rows), hidden]
  std::vector<LayerWeights> layers_;
  Tensor norm_;     // [hidden]
  Tensor lm_head_;  // [vocab (the rank's rows), hidden]; embed_tokens_ when tied
  // [bytes] u8 on a GPU with packed Linears: their GEMV partials or dequantized scratch, shared
  // by every Linear (the ops of one stream run in order) and fixed, so graphs capture it.
  Tensor quant_workspace_;
  ops::RopeFrequencies rope_;  // the host-side rope (rotary dim, scaling, how rows are picked)
  Tensor inv_freq_;            // [rope_.tables(), rotary_dim / 2] f32 on device_
  ops::RopeFrequencies local_rope_;  // sliding layers' (config.has_local_rope)
  Tensor local_inv_freq_;            // [local_rope_.tables(), rotary_dim / 2] f32 on device_
  OpTimer* op_timer_ = nullptr;      // bench_model's per-op profile; null otherwise
};

}  // namespace longctx::models
