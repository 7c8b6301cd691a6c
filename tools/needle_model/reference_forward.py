"""An independent float32 forward of the needle model (PyTorch on the CPU, no transformers):
greedy continuation of one sample with the top-1/top-2 logit margin of every token. Used to tell
a model error from an engine error when `longctx needle` misses a sample.

  python3 tools/needle_model/reference_forward.py models/needle samples.jsonl LINE
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import ByteLevelBPE  # noqa: E402

mdir, jsonl, line_no = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = json.load(open(mdir + "/config.json"))
raw = open(mdir + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
base = 8 + n
W = {}
for k, v in hdr.items():
    if k == "__metadata__":
        continue
    a, b = v["data_offsets"]
    assert v["dtype"] == "BF16"
    u = np.frombuffer(raw[base + a:base + b], dtype=np.uint16).astype(np.uint32) << 16
    W[k] = torch.from_numpy(u.view(np.float32).reshape(v["shape"]).copy())
nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
theta = cfg.get("rope_parameters", {}).get("rope_theta") or cfg["rope_theta"]
eps = cfg["rms_norm_eps"]
def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
def forward(ids):
    L = len(ids)
    x = W["model.embed_tokens.weight"][ids]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.arange(L, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    def rope(t):
        t1, t2 = t[..., :hd // 2], t[..., hd // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin
    mask = torch.full((L, L), float("-inf")).triu(1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(L, nh, hd).transpose(0, 1)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).view(L, nkv, hd).transpose(0, 1)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(L, nkv, hd).transpose(0, 1)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        a = torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5 + mask, -1) @ v
        x = x + a.transpose(0, 1).reshape(L, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        g = torch.nn.functional.silu(h @ W[p + "mlp.gate_proj.weight"].T) * (
            h @ W[p + "mlp.up_proj.weight"].T)
        x = x + g @ W[p + "mlp.down_proj.weight"].T
    x = rms(x[-1], W["model.norm.weight"])
    return x @ W.get("lm_head.weight", W["model.embed_tokens.weight"]).T
tok = ByteLevelBPE.from_file(mdir + "/tokenizer.json")
s = json.loads(open(jsonl).read().splitlines()[line_no - 1])
ids = [2045] + tok.encode(s["input"] + s["answer_prefix"])
out = []
with torch.no_grad():
    for _ in range(12):
        top = torch.topk(forward(ids), 2)
        t = int(top.indices[0])
        margin = round(float(top.values[0] - top.values[1]), 2)
        out.append((tok.decode([t]) if t < 2045 else f"<{t}>", margin))
        if t == 2046:
            break
        ids.append(t)
print("expected", repr(s["answer"]), "prompt tokens", len(ids) - len(out) + 1)
print(out)
