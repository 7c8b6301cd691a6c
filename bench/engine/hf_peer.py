"""The transformers peer of `longctx bench throughput` and `longctx bench latency`: the same
workloads on the same GPU with random bf16 weights of the Qwen3-0.6B shapes (the engine's
dummy preset qwen3-0.6b), sdpa attention, batched `generate`.

  python3 bench/engine/hf_peer.py throughput --num-seqs 256 --batch-size 256
  python3 bench/engine/hf_peer.py latency --input-len 32768 --output-len 128
  python3 bench/engine/hf_peer.py throughput --model qwen3-30b-a3b --num-seqs 256 --batch-size 64
  (--model qwen3-30b-a3b: Qwen3MoeForCausalLM at the engine's preset qwen3-30b-a3b, the config of
  bench/model/hf_peer.py; 61 GB of bf16 weights)

Throughput: nano-vllm's workload (prompt lengths 100-1024 of random ids in [0, 10000], output
lengths 100-1024, temperature 0.6, EOS ignored) drawn with the same distribution (not the same
numbers: C++ and Python generators differ). transformers cannot stop one row of a batch early,
so each batch (left-padded) runs to its longest output; only the tokens each request asked for
count as output, and the time covers everything, as a user of batched generate would see.
"""

import argparse
import random
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def qwen3_06b() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, torch_dtype=torch.bfloat16, attn_implementation="sdpa",
        pad_token_id=0, eos_token_id=151645, bos_token_id=151643)


def make_model(name: str = "qwen3-0.6b"):
    torch.manual_seed(0)
    if name == "qwen3-30b-a3b":
        import importlib.util
        import os

        from transformers import AutoModelForCausalLM

        # One definition of the config: bench/model/hf_peer.py's.
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "hf_peer.py")
        spec = importlib.util.spec_from_file_location("model_hf_peer", path)
        peer = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(peer)
        cfg = peer.qwen3_30b_a3b()
        cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id = 0, 151645, 151643
        with torch.device("cuda"):  # built in bf16: fp32 parameters would not fit
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).eval()
    else:
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(qwen3_06b()).to(torch.bfloat16).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    return model


def generate(model, prompts, max_new, temperature):
    """One left-padded batch; returns after every row produced max_new tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    kw = dict(do_sample=temperature > 0, max_new_tokens=max_new, min_new_tokens=max_new)
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=1.0)
    return model.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), **kw)


def throughput(a) -> None:
    model = make_model(a.model)
    rng = random.Random(a.seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))]
               for _ in range(a.num_seqs)]
    outs = [rng.randint(100, 1024) for _ in range(a.num_seqs)]
    with torch.inference_mode():
        generate(model, [[1] * 64], 8, a.temperature)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in range(0, a.num_seqs, a.batch_size):
            generate(model, prompts[b:b + a.batch_size], max(outs[b:b + a.batch_size]),
                     a.temperature)
            print(f"  batch at {b}: {time.perf_counter() - t0:.1f} s", flush=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    p, o = sum(len(x) for x in prompts), sum(outs)
    print(f"hf throughput: {a.num_seqs} requests ({p} prompt + {o} output tokens) in {dt:.2f} s, "
          f"batch {a.batch_size}")
    print(f"  {a.num_seqs / dt:.2f} requests/s, {o / dt:.0f} output tok/s, "
          f"{(p + o) / dt:.0f} total tok/s", flush=True)


def latency(a) -> None:
    model = make_model(a.model)
    rng = random.Random(a.seed)
    ttft, e2e = [], []
    with torch.inference_mode():
        for it in range(a.num_warmup + a.num_iters):
            prompts = [[rng.randint(0, 151935) for _ in range(a.input_len)]
                       for _ in range(a.batch_size)]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            generate(model, prompts, 1, 0)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            generate(model, prompts, a.output_len, 0)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if it >= a.num_warmup:
                ttft.append(t1 - t0)
                e2e.append(t2 - t1)
    ttft.sort()
    e2e.sort()
    f, e = ttft[len(ttft) // 2], e2e[len(e2e) // 2]
    tpot = (e - f) / max(1, a.output_len - 1)
    print(f"hf latency: batch {a.batch_size}, {a.input_len} prompt + {a.output_len} output tokens")
    print(f"  TTFT {1e3 * f:.2f} ms, TPOT {1e3 * tpot:.3f} ms, end-to-end {e:.3f} s (medians)",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--num-seqs", type=int, default=256)
    t.add_argument("--batch-size", type=int, default=256)
    t.add_argument("--temperature", type=float, default=0.6)
    t.add_argument("--seed", type=int, default=0)
    lat = sub.add_parser("latency")
    lat.add_argument("--input-len", type=int, default=32768)
    lat.add_argument("--output-len", type=int, default=128)
    lat.add_argument("--batch-size", type=int, default=1)
    lat.add_argument("--num-iters", type=int, default=3)
    lat.add_argument("--num-warmup", type=int, default=1)
    lat.add_argument("--seed", type=int, default=0)
    for p in (t, lat):
        p.add_argument("--model", default="qwen3-0.6b", choices=["qwen3-0.6b", "qwen3-30b-a3b"])
    a = ap.parse_args()
    throughput(a) if a.mode == "throughput" else latency(a)


if __name__ == "__main__":
    main()
