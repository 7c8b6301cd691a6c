"""The transformers peer of bench_model: the same shapes (Llama-3.1-8B config, or Gemma-3-12B's
text model with --model gemma-3-12b; random bf16 weights, sdpa attention, DynamicCache) on the
same GPU, timed the same way:
  python3 bench/model/hf_peer.py --contexts 32768,131072 --decode-steps 32
  python3 bench/model/hf_peer.py --model gemma-3-12b --contexts 32000 --decode-steps 32
  (--model qwen3-8b-yarn-128k: Qwen3-8B with the yarn recipe for 128K)
  python3 bench/model/hf_peer.py --model qwen3-30b-a3b --contexts 32768 --decode-steps 32
  (Qwen3MoeForCausalLM at the engine's preset qwen3-30b-a3b: 128 experts, top-8, 61 GB of bf16
  weights, so an H200 or an 80 GB card with little else on it; transformers' own MoE block)
Prefill = one forward of the prompt with use_cache (logits of the last position only);
decode = one token per forward after the first context, batch 1.
"""

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.cache_utils import DynamicCache


def llama31_8b() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        torch_dtype=torch.bfloat16, attn_implementation="sdpa")


def gemma3_12b():
    # gemma-3-12b-it's text_config as published (8 fields); the rest are Gemma3TextConfig's
    # defaults: 5 sliding (window 1024) : 1 global layers, head_dim 256, vocabulary 262,208.
    import inspect

    from transformers import Gemma3TextConfig

    kw = dict(hidden_size=3840, intermediate_size=15360, num_attention_heads=16,
              num_hidden_layers=48, num_key_value_heads=8, sliding_window=1024,
              max_position_embeddings=131072, torch_dtype=torch.bfloat16,
              attn_implementation="sdpa")
    glob = {"rope_type": "linear", "factor": 8.0}
    if "rope_local_base_freq" in inspect.signature(Gemma3TextConfig.__init__).parameters:  # 4.x
        return Gemma3TextConfig(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling=glob, **kw)
    return Gemma3TextConfig(rope_parameters={
        "full_attention": dict(glob, rope_theta=1e6),
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, **kw)


def qwen3_8b_yarn_128k():
    # Qwen3-8B with Qwen's 128K recipe (yarn, factor 4 over 32768), as the preset.
    import inspect

    from transformers import Qwen3Config

    kw = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
              num_attention_heads=32, num_key_value_heads=8, head_dim=128,
              max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=False,
              torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    if "rope_parameters" in inspect.signature(Qwen3Config.__init__).parameters:  # 5.x
        return Qwen3Config(rope_parameters=dict(yarn, rope_theta=1e6), **kw)
    return Qwen3Config(rope_theta=1e6, rope_scaling=yarn, **kw)


def qwen3_30b_a3b():
    # The engine's preset qwen3-30b-a3b (src/loader/dummy.cpp), field for field: Qwen3-30B-A3B's
    # published shapes, every layer sparse.
    import inspect

    from transformers import Qwen3MoeConfig

    kw = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
              num_attention_heads=32, num_key_value_heads=4, head_dim=128,
              moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
              output_router_logits=False, max_position_embeddings=40960, rms_norm_eps=1e-6,
              tie_word_embeddings=False, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    if "rope_parameters" in inspect.signature(Qwen3MoeConfig.__init__).parameters:  # 5.x
        return Qwen3MoeConfig(rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **kw)
    return Qwen3MoeConfig(rope_theta=1e6, **kw)


def qwen3_next_80b_a3b():
    # The engine's preset qwen3-next-80b-a3b (src/loader/dummy.cpp): the published config.json's
    # fields. transformers runs its torch fallback for the gated delta rule unless
    # flash-linear-attention is installed (printed at start).
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=5120, num_hidden_layers=48,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        max_position_embeddings=262144, rms_norm_eps=1e-6, rope_theta=10000000.0,
        partial_rotary_factor=0.25, full_attention_interval=4, linear_conv_kernel_dim=4,
        linear_key_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_value_head_dim=128, num_experts=512, num_experts_per_tok=10,
        moe_intermediate_size=512, shared_expert_intermediate_size=512, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
        output_router_logits=False, torch_dtype=torch.bfloat16)


CONFIGS = {"llama-3.1-8b": llama31_8b, "gemma-3-12b": gemma3_12b,
           "qwen3-8b-yarn-128k": qwen3_8b_yarn_128k, "qwen3-30b-a3b": qwen3_30b_a3b,
           "qwen3-next-80b-a3b": qwen3_next_80b_a3b}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="32768")
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--model", default="llama-3.1-8b", choices=sorted(CONFIGS))
    ap.add_argument("--layers", type=int, default=0,
                    help="the first N decoder layers only (as longctx's --dummy-layers)")
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = CONFIGS[a.model]()
    if a.layers > 0:
        cfg.num_hidden_layers = a.layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[:a.layers]
    if a.model == "qwen3-next-80b-a3b":
        try:
            import fla  # noqa: F401
            print("hf: flash-linear-attention installed (its kernels)", flush=True)
        except ImportError:
            print("hf: flash-linear-attention not installed (the torch fallback)", flush=True)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    vocab = cfg.vocab_size
    ctxs = [int(x) for x in a.contexts.split(",")]
    with torch.inference_mode():
        warm = torch.randint(0, vocab, (1, 4096), device="cuda")
        # Qwen3-Next keeps its own cache class (KV and linear-attention states): it makes one.
        new_cache = (lambda: None) if a.model == "qwen3-next-80b-a3b" else DynamicCache
        model(warm, past_key_values=new_cache(), use_cache=True, logits_to_keep=1)
        for ci, n in enumerate(ctxs):
            ids = torch.randint(0, vocab, (1, n), device="cuda")
            cache = new_cache()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            print(f"hf prefill {n:7d} tokens: {dt:.3f} s  {n / dt:.0f} tok/s", flush=True)
            if ci == 0 and a.decode_steps > 0:
                times = []
                tok = out.logits[:, -1:].argmax(-1)
                for _ in range(a.decode_steps):
                    t1 = time.perf_counter()
                    out = model(tok, past_key_values=out.past_key_values, use_cache=True)
                    tok = out.logits[:, -1:].argmax(-1)
                    tok.cpu()
                    times.append(time.perf_counter() - t1)
                times.sort()
                print(f"hf decode after {n} tokens, batch 1: {1e3 * sum(times) / len(times):.3f} "
                      f"ms/token mean, {1e3 * times[len(times) // 2]:.3f} median", flush=True)
            del out, cache
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
