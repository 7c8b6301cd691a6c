#!/usr/bin/env python3
"""A Whisper-style streaming encoder on longctx's block-causal op: parity and speed.

An encoder stack at the shapes of a Whisper encoder config (transformers' WhisperConfig:
d_model, encoder_attention_heads, encoder_ffn_dim, encoder_layers; pre-LayerNorm blocks, GELU
MLP, k_proj without bias, a final LayerNorm), random weights, runs two ways over a batch of clips
of different lengths (frames after the conv stem):

  packed     every clip packed end to end into one [total, d_model] batch; each layer's
             attention is longctx.ops.RaggedBlockCausalWrapper planned with the clip lengths
             (a frame attends every frame of its own block and of the earlier blocks of its clip);
  streaming  each clip fed block by block as a streaming client would: a new block's frames
             attend the cached K/V of the earlier blocks of the clip (per layer) and their own
             block, with plain torch attention; no frame ever sees a later block.

The features agree (up to bf16 rounding of the attention output: both sides round q/k/v and the
output to bf16, accumulate in fp32), which is the op's reason to exist: a streaming client gets
what one packed forward computes.

--bench (GPU) times the packed encoder's attention three ways in the same process: the op,
torch's flex_attention with a block mask, and SDPA with a dense boolean mask.

  python3 examples/whisper_streaming_parity.py --device cpu --config tiny --clips 3
  python3 examples/whisper_streaming_parity.py --device cuda --config large-v3 --bench
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Dict, List

import torch

try:
    import longctx.ops as lops
except ImportError:  # a build tree: build/python next to this checkout
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "build", "python"))
    import longctx.ops as lops

# transformers' WhisperConfig encoder fields of the released checkpoints.
CONFIGS: Dict[str, Dict[str, int]] = {
    "tiny": dict(d_model=384, heads=6, ffn=1536, layers=4),
    "base": dict(d_model=512, heads=8, ffn=2048, layers=6),
    "small": dict(d_model=768, heads=12, ffn=3072, layers=12),
    "medium": dict(d_model=1024, heads=16, ffn=4096, layers=24),
    "large-v3": dict(d_model=1280, heads=20, ffn=5120, layers=32),
}


def sinusoids(length: int, channels: int) -> torch.Tensor:
    """Whisper's encoder position embedding (the clip's frame index)."""
    log_inc = math.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-log_inc * torch.arange(channels // 2, dtype=torch.float32))
    t = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class Encoder:
    """The weights and the per-layer pieces both runs share (everything but the attention)."""

    def __init__(self, cfg: Dict[str, int], layers: int, device: str, seed: int):
        g = torch.Generator().manual_seed(seed)
        d, f = cfg["d_model"], cfg["ffn"]
        self.d, self.heads = d, cfg["heads"]
        self.head_dim = d // self.heads

        def w(*shape, scale=None):
            scale = scale or 1.0 / math.sqrt(shape[-1])
            return (torch.randn(*shape, generator=g) * scale).to(device)

        self.layers = []
        for _ in range(layers):
            self.layers.append(dict(
                ln1_w=1 + 0.1 * w(d, scale=1), ln1_b=0.1 * w(d, scale=1),
                q_w=w(d, d), q_b=0.1 * w(d, scale=1), k_w=w(d, d),
                v_w=w(d, d), v_b=0.1 * w(d, scale=1), o_w=w(d, d), o_b=0.1 * w(d, scale=1),
                ln2_w=1 + 0.1 * w(d, scale=1), ln2_b=0.1 * w(d, scale=1),
                fc1_w=w(f, d), fc1_b=0.1 * w(f, scale=1), fc2_w=w(d, f), fc2_b=0.1 * w(d, scale=1)))
        self.lnf_w = 1 + 0.1 * w(d, scale=1)
        self.lnf_b = 0.1 * w(d, scale=1)

    def qkv(self, L: dict, x: torch.Tensor):
        """[n, d] hidden -> bf16 q, k, v [n, H, D] (Whisper: k_proj has no bias)."""
        h = torch.nn.functional.layer_norm(x, (self.d,), L["ln1_w"], L["ln1_b"])
        shape = (x.shape[0], self.heads, self.head_dim)
        q = torch.nn.functional.linear(h, L["q_w"], L["q_b"])
        k = torch.nn.functional.linear(h, L["k_w"])
        v = torch.nn.functional.linear(h, L["v_w"], L["v_b"])
        return (q.reshape(shape).to(torch.bfloat16), k.reshape(shape).to(torch.bfloat16),
                v.reshape(shape).to(torch.bfloat16))

    def finish_layer(self, L: dict, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """x + o_proj(attn), then the MLP block."""
        x = x + torch.nn.functional.linear(attn.float().reshape(x.shape[0], self.d), L["o_w"],
                                           L["o_b"])
        h = torch.nn.functional.layer_norm(x, (self.d,), L["ln2_w"], L["ln2_b"])
        h = torch.nn.functional.gelu(torch.nn.functional.linear(h, L["fc1_w"], L["fc1_b"]))
        return x + torch.nn.functional.linear(h, L["fc2_w"], L["fc2_b"])

    def final(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (self.d,), self.lnf_w, self.lnf_b)


def embed(frames: List[torch.Tensor]) -> List[torch.Tensor]:
    return [f + sinusoids(f.shape[0], f.shape[1]).to(f.device) for f in frames]


def packed_forward(enc: Encoder, frames: List[torch.Tensor], block: int, device: str):
    """The whole batch in one pass per layer through the block-causal op."""
    lens = [f.shape[0] for f in frames]
    x = torch.cat(embed(frames))
    ws_bytes = lops.workspace_bytes(enc.heads, enc.heads, sum(lens), block, len(lens))
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=device)
    op = lops.RaggedBlockCausalWrapper(ws, enc.heads, enc.heads, enc.head_dim, block,
                                       max_num_segments=len(lens), max_total_tokens=sum(lens),
                                       q_data_type=torch.bfloat16)
    op.plan(lens)
    for L in enc.layers:
        q, k, v = enc.qkv(L, x)
        x = enc.finish_layer(L, x, op.run(q, k, v))
    return enc.final(x)


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A block's queries over every key given (cache + own block), fp32 math on bf16 inputs,
    bf16 out: the client's attention, independent of longctx."""
    qf, kf, vf = (t.float().transpose(0, 1) for t in (q, k, v))  # [H, n, D]
    s = qf @ kf.transpose(1, 2) / math.sqrt(q.shape[-1])
    return (torch.softmax(s, dim=-1) @ vf).transpose(0, 1).to(torch.bfloat16)


def streaming_forward(enc: Encoder, frames: List[torch.Tensor], block: int) -> torch.Tensor:
    """Each clip block by block, with a per-layer K/V cache of the clip's earlier blocks."""
    outs = []
    for clip in embed(frames):
        cache_k: List[List[torch.Tensor]] = [[] for _ in enc.layers]
        cache_v: List[List[torch.Tensor]] = [[] for _ in enc.layers]
        for start in range(0, clip.shape[0], block):
            x = clip[start:start + block]
            for i, L in enumerate(enc.layers):
                q, k, v = enc.qkv(L, x)
                cache_k[i].append(k)
                cache_v[i].append(v)
                attn = block_attention(q, torch.cat(cache_k[i]), torch.cat(cache_v[i]))
                x = enc.finish_layer(L, x, attn)
            outs.append(enc.final(x))
    return torch.cat(outs)


def parity(cfg_name: str, layers: int, clip_lens: List[int], block: int, device: str,
           seed: int = 0) -> Dict[str, float]:
    """Runs both ways; returns max |packed - streaming| and the features' max |value|."""
    cfg = CONFIGS[cfg_name]
    enc = Encoder(cfg, layers, device, seed)
    g = torch.Generator().manual_seed(seed + 1)
    frames = [torch.randn(n, cfg["d_model"], generator=g).to(device) for n in clip_lens]
    packed = packed_forward(enc, frames, block, device)
    streamed = streaming_forward(enc, frames, block)
    diff = (packed - streamed).abs()
    return dict(max_abs_diff=diff.max().item(), mean_abs_diff=diff.mean().item(),
                max_abs_value=streamed.abs().max().item(), frames=sum(clip_lens))


def bench(cfg_name: str, clip_lens: List[int], block: int, iters: int) -> None:
    """Attention of one packed layer, three ways, on the GPU (times in ms, CUDA events)."""
    cfg = CONFIGS[cfg_name]
    dev = "cuda"
    H, D = cfg["heads"], cfg["d_model"] // cfg["heads"]
    total = sum(clip_lens)
    q, k, v = (torch.randn(total, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    ws = torch.empty(lops.workspace_bytes(H, H, total, block, len(clip_lens)), dtype=torch.uint8,
                     device=dev)
    op = lops.RaggedBlockCausalWrapper(ws, H, H, D, block, max_num_segments=len(clip_lens),
                                       max_total_tokens=total, q_data_type=torch.bfloat16)
    op.plan(clip_lens)

    seg = torch.repeat_interleave(torch.arange(len(clip_lens), device=dev),
                                  torch.tensor(clip_lens, device=dev))
    offsets = torch.cumsum(torch.tensor([0] + clip_lens[:-1], device=dev), 0)
    starts = torch.repeat_interleave(offsets, torch.tensor(clip_lens, device=dev))
    blk = (torch.arange(total, device=dev) - starts) // block

    def allowed(qi, ki):
        return (seg[qi] == seg[ki]) & (blk[ki] <= blk[qi])

    idx = torch.arange(total, device=dev)
    dense = allowed(idx[:, None], idx[None, :])
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, H, n, D]

    def run_op():
        return op.run(q, k, v)

    def run_sdpa():
        return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=dense)

    runs = {"longctx block-causal op": run_op, "SDPA, dense bool mask": run_sdpa}
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        bm = create_block_mask(lambda b, h, qi, ki: allowed(qi, ki), None, None, total, total,
                               device=dev)
        flex = torch.compile(flex_attention)
        runs["flex_attention, block mask"] = lambda: flex(qh, kh, vh, block_mask=bm)
    except ImportError as e:
        print(f"flex_attention unavailable in torch {torch.__version__}: {e}", file=sys.stderr)

    ref = run_sdpa()[0].transpose(0, 1).float()
    print(f"{cfg_name}: {len(clip_lens)} clips, {total} frames, {H} heads x {D}, block {block}; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"| attention | ms / layer | max abs diff vs SDPA |")
    print(f"| --- | ---: | ---: |")
    for name, fn in runs.items():
        out = fn()
        out = out[0].transpose(0, 1) if out.dim() == 4 else out
        err = (out.float() - ref).abs().max().item()
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        print(f"| {name} | {start.elapsed_time(end) / iters:.3f} | {err:.2e} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--layers", type=int, default=None, help="default: the config's")
    ap.add_argument("--clips", type=int, default=3)
    ap.add_argument("--max-frames", type=int, default=200,
                    help="clip lengths are drawn in [max/4, max] (Whisper: 1500 for 30 s)")
    ap.add_argument("--block", type=int, default=50, help="frames per block (50 = 1 s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bench", action="store_true", help="GPU: time the op vs flex/SDPA")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    lo = max(1, args.max_frames // 4)
    lens = [int(torch.randint(lo, args.max_frames + 1, (1,), generator=g))
            for _ in range(args.clips)]
    layers = args.layers or CONFIGS[args.config]["layers"]
    r = parity(args.config, layers, lens, args.block, args.device, args.seed)
    rel = r["max_abs_diff"] / r["max_abs_value"]
    print(f"{args.config} x {layers} layers, clips {lens}, block {args.block} on {args.device}: "
          f"max |packed - streaming| {r['max_abs_diff']:.3e} (features up to "
          f"{r['max_abs_value']:.2f}, relative {rel:.1e}), mean {r['mean_abs_diff']:.2e}")
    ok = rel < 2e-2
    print("parity: OK" if ok else "parity: FAILED")
    if args.bench:
        if args.device != "cuda":
            print("--bench needs --device cuda", file=sys.stderr)
            return 2
        bench(args.config, lens, args.block, args.iters)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
