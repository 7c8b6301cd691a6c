#!/usr/bin/env python3
"""Writes a bf16 Qwen3 checkpoint folder of real shapes with random weights (standard library
only), for measuring the loader on a model of real size without downloading one:

    python3 tools/write_random_checkpoint.py --shape qwen3-1.7b --output /tmp/q17b
    longctx quantize --model /tmp/q17b --output /tmp/q17b-awq --method awq

Weights are a 1M-value block of N(0, 0.02) bf16 values tiled (at a different offset per
tensor), norms near 1: every value finite, so the quantized copy is a normal one. The model's
outputs mean nothing; its bytes and shapes are those of the real model.
"""

import argparse
import json
import os
import random
import struct

# hidden, intermediate, layers, heads, kv heads, tied embeddings (Qwen3's published configs).
SHAPES = {
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, True),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, True),
    "qwen3-4b": (2560, 9728, 36, 32, 8, True),
}
VOCAB = 151936
HEAD_DIM = 128


def bf16_bytes(values):
    """The bf16 encoding (round to nearest even) of `values`."""
    out = bytearray(2 * len(values))
    for i, v in enumerate(values):
        (u,) = struct.unpack("<I", struct.pack("<f", v))
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out[2 * i : 2 * i + 2] = struct.pack("<H", u)
    return bytes(out)


def tensors(hidden, inter, layers, heads, kv_heads, tied):
    """(name, shape) of every tensor, in the order they are written."""
    t = [("model.embed_tokens.weight", [VOCAB, hidden])]
    q, kv = heads * HEAD_DIM, kv_heads * HEAD_DIM
    for i in range(layers):
        p = f"model.layers.{i}."
        t += [
            (p + "input_layernorm.weight", [hidden]),
            (p + "post_attention_layernorm.weight", [hidden]),
            (p + "self_attn.q_proj.weight", [q, hidden]),
            (p + "self_attn.k_proj.weight", [kv, hidden]),
            (p + "self_attn.v_proj.weight", [kv, hidden]),
            (p + "self_attn.o_proj.weight", [hidden, q]),
            (p + "self_attn.q_norm.weight", [HEAD_DIM]),
            (p + "self_attn.k_norm.weight", [HEAD_DIM]),
            (p + "mlp.gate_proj.weight", [inter, hidden]),
            (p + "mlp.up_proj.weight", [inter, hidden]),
            (p + "mlp.down_proj.weight", [hidden, inter]),
        ]
    t.append(("model.norm.weight", [hidden]))
    if not tied:
        t.append(("lm_head.weight", [VOCAB, hidden]))
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b")
    ap.add_argument("--output", required=True, help="folder to create (must not exist)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    hidden, inter, layers, heads, kv_heads, tied = SHAPES[a.shape]
    os.makedirs(a.output)
    rng = random.Random(a.seed)
    block = bf16_bytes([rng.gauss(0.0, 0.02) for _ in range(1 << 20)])
    ones = bf16_bytes([1.0 + rng.uniform(-0.1, 0.1) for _ in range(1 << 12)])
    spec = tensors(hidden, inter, layers, heads, kv_heads, tied)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in spec:
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(a.output, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for k, (name, shape) in enumerate(spec):
            n = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            src = ones if name.endswith("norm.weight") else block
            start = (k * 4099 * 2) % len(src)
            rotated = src[start:] + src[:start]
            while n > 0:
                piece = rotated[: min(n, len(rotated))]
                f.write(piece)
                n -= len(piece)
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    }
    with open(os.path.join(a.output, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote {a.output}: {a.shape}, {offset / 1e9:.2f} GB of bf16 weights")


if __name__ == "__main__":
    main()
