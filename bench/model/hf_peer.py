"""The transformers peer of bench_model: the same shapes (Llama-3.1-8B config, random bf16
weights, sdpa attention, DynamicCache) on the same GPU, timed the same way:
  python3 bench/model/hf_peer.py --contexts 32768,131072 --decode-steps 32
Prefill = one forward of the prompt with use_cache (logits of the last position only);
decode = one token per forward after the first context, batch 1.
"""

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicCache


def llama31_8b() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        torch_dtype=torch.bfloat16, attn_implementation="sdpa")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="32768")
    ap.add_argument("--decode-steps", type=int, default=32)
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = llama31_8b()
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    vocab = cfg.vocab_size
    ctxs = [int(x) for x in a.contexts.split(",")]
    with torch.inference_mode():
        warm = torch.randint(0, vocab, (1, 4096), device="cuda")
        model(warm, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
        for ci, n in enumerate(ctxs):
            ids = torch.randint(0, vocab, (1, n), device="cuda")
            cache = DynamicCache()
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
