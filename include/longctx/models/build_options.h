// How a model is built: where its weights live, its activation dtype, numerics choices that
// depend on which reference it should reproduce, and its tensor-parallel rank. Plain options
// (core types only), so the public engine API can carry them without the model's interface.
#pragma once

#include <memory>
#include <optional>

#include "longctx/core/communicator.h"
#include "longctx/core/device.h"
#include "longctx/core/dtype.h"

namespace longctx {

// Numerics choices that depend on which reference a model should reproduce.
struct ModelBuildOptions {
  // The dtype rope's inv_freq is rounded to before use (then upcast to float32 for the angles).
  // Unset (or DType::kF32): exact float32, as transformers 5.17's from_pretrained (also at
  // dtype=bfloat16: the buffer stays float32), vLLM and the training code. DType::kBF16
  // reproduces a model whose buffers were cast with .to(torch.bfloat16): the tiny fixtures'
  // reference logits were made that way, and at long context the difference matters (a model
  // trained with exact inv_freq, models/needle, moves by up to 7.6 logits at 1K tokens).
  std::optional<DType> rope_inv_freq_dtype;
  // Device of the weights and the forward. CUDA: weights are uploaded as bf16 (QKV and gate/up
  // fused), through pinned staging (see activation_dtype).
  Device device = Device::cpu();
  // Weights, activations and KV on a GPU: bf16 (default) or f16 (3 more mantissa bits, the range
  // of f16: for models whose activations stay below 65504, and for checking numerics). The CPU
  // reference is f32 whatever this says.
  DType activation_dtype = DType::kBF16;
  // Tensor parallelism (docs/tensor_parallel.md): with a communicator of size > 1 the model is
  // rank communicator->rank(), holding its slice of every weight; config() is then the rank's
  // (its q / KV heads and MLP width), the logits the whole vocabulary's. Every rank must run the
  // same forwards: thread communicators (CPU) or NCCL (one thread per GPU).
  std::shared_ptr<Communicator> communicator;
  // A quantized checkpoint's Linears (config.quantization): kept packed as stored and run by the
  // quantized Linear (decode reads a quarter of bf16's bytes for int4, half for FP8), or
  // dequantized into dense weights at load (one projection at a time, from the packed tensors:
  // the checkpoint holds no dense copy). Unset: dense for a checkpoint folder (the packed path
  // has not yet run whole models on a GPU; the CPU's packed op dequantizes on every call, a
  // reference, not a speed path), packed for dummy weights. Packed needs an unsharded model.
  std::optional<bool> packed_weights;
};

}  // namespace longctx
