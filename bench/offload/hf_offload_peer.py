"""The transformers peer of `longctx bench offload`: one random prompt per context length through
Llama-3.1-8B shapes (random bf16 weights, sdpa attention) with transformers' OffloadedCache
(`cache_implementation="offloaded"`: each layer's K/V on the host, prefetched one layer ahead),
greedy. Prints prefill seconds (the time to the first token), decode ms/token (the difference of
a run of 1 + N tokens and a run of 1, over N) and the peak GPU memory torch allocated.

  python3 bench/offload/hf_offload_peer.py --context-len 32768 131072 --decode-steps 8
"""

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def llama31_8b() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=131072 + 1024, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        torch_dtype=torch.bfloat16, attn_implementation="sdpa", bos_token_id=128000,
        eos_token_id=128001, pad_token_id=128001)


def make_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(llama31_8b()).to(torch.bfloat16).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    return model


def timed_generate(model, ids, new_tokens: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                   max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                   cache_implementation="offloaded")
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context-len", type=int, nargs="+", default=[32768])
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    model = make_model()
    gen = torch.Generator().manual_seed(a.seed)
    print(f"hf offload peer: Llama-3.1-8B shapes, OffloadedCache, {torch.cuda.get_device_name()}",
          flush=True)
    with torch.inference_mode():
        timed_generate(model, torch.randint(0, 128000, (1, 256), generator=gen).cuda(), 2)
        for n in a.context_len:
            ids = torch.randint(0, 128000, (1, n), generator=gen).cuda()
            torch.cuda.reset_peak_memory_stats()
            first = timed_generate(model, ids, 1)
            total = timed_generate(model, ids, 1 + a.decode_steps)
            peak = torch.cuda.max_memory_allocated() / 2**30
            print(f"  context {n}: prefill {first:.3f} s ({n / first:.0f} tok/s), decode "
                  f"{1e3 * (total - first) / a.decode_steps:.1f} ms/token, peak GPU memory "
                  f"{peak:.1f} GiB", flush=True)


if __name__ == "__main__":
    main()
