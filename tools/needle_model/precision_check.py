"""How sensitive a needle checkpoint is to bf16 / f16 activations, on the CPU (PyTorch, no
transformers, no GPU): an fp32 forward against the same forward with every op's output rounded to
bf16 or f16 (fp32 accumulation, as a GPU engine that stores activations in 16 bits computes).
Prints per-position KL(fp32 || rounded) max and mean, and top-1 agreement where the fp32 top-1 /
top-2 margin exceeds 0.05, on the GPU tests' 1500-token prompt ((i * 7919 + 13) % 2000) and the
988-token reference prompt of tests/data/needle. Two 16-bit runs of a model (GPU vs CPU, offload
vs resident) differ by about this much when the engine is right; tests/common/test_data.h says why
the GPU tests with fixed bounds load v1.

  /usr/bin/python3 tools/needle_model/precision_check.py models/needle [tests/data/needle_v1]
"""
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "..", "tests", "data", "needle", "reference.json")


def load(model_dir: str):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    raw = open(os.path.join(model_dir, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    weights = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        assert t["dtype"] == "BF16", f"{name}: {t['dtype']} (bf16 expected)"
        bits = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.uint16).astype(np.uint32) << 16
        weights[name] = torch.from_numpy(bits.view(np.float32).reshape(t["shape"]).copy())
    return cfg, weights


def forward(cfg, w, ids, r):
    """Logits of every position; r(t) rounds an op's output (identity for fp32)."""
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    theta = cfg.get("rope_parameters", {}).get("rope_theta") or cfg["rope_theta"]
    eps, n = cfg["rms_norm_eps"], len(ids)

    def rms(x, g):
        return r(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g)

    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(t):
        return r(t * cos + torch.cat([-t[..., hd // 2:], t[..., :hd // 2]], -1) * sin)

    mask = torch.full((n, n), float("-inf")).triu(1)
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = r(h @ w[p + "self_attn.q_proj.weight"].T).view(n, nh, hd).transpose(0, 1)
        k = r(h @ w[p + "self_attn.k_proj.weight"].T).view(n, nkv, hd).transpose(0, 1)
        v = r(h @ w[p + "self_attn.v_proj.weight"].T).view(n, nkv, hd).transpose(0, 1)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        a = r(torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5 + mask, -1) @ v)
        o = r(a.transpose(0, 1).reshape(n, nh * hd) @ w[p + "self_attn.o_proj.weight"].T)
        x = r(x + o)
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = r(torch.nn.functional.silu(r(h @ w[p + "mlp.gate_proj.weight"].T)))
        g = r(gate * r(h @ w[p + "mlp.up_proj.weight"].T))
        x = r(x + r(g @ w[p + "mlp.down_proj.weight"].T))
    x = rms(x, w["model.norm.weight"])
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def compare(ref, got):
    lp, lq = ref.log_softmax(-1), got.log_softmax(-1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    top2 = ref.topk(2, -1).values
    sel = (top2[:, 0] - top2[:, 1]) > 0.05
    agree = (ref.argmax(-1) == got.argmax(-1))[sel]
    return float(kl.max()), float(kl.mean()), int(agree.sum()), int(sel.sum())


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    prompts = [("gpu-test 1500", [(i * 7919 + 13) % 2000 for i in range(1500)]),
               ("reference 988", json.load(open(REFERENCE))["input_ids"])]
    rounding = [("bf16", lambda t: t.to(torch.bfloat16).float()),
                ("f16", lambda t: t.to(torch.float16).float())]
    for model_dir in sys.argv[1:]:
        cfg, w = load(model_dir)
        for label, ids in prompts:
            with torch.no_grad():
                ref = forward(cfg, w, ids, lambda t: t)
                for name, r in rounding:
                    kl_max, kl_mean, agree, compared = compare(ref, forward(cfg, w, ids, r))
                    print(f"{model_dir} {label} {name}: KL max {kl_max:.2e} mean {kl_mean:.2e}, "
                          f"top-1 {agree}/{compared}, max |logit| {float(ref.abs().max()):.1f}",
                          flush=True)


if __name__ == "__main__":
    main()
