#!/usr/bin/env python3
"""PyTorch peers of bench_attention, same shapes (32 q / 8 kv heads, head_dim 128, bf16):
SDPA with the FLASH_ATTENTION and CUDNN_ATTENTION backends, and for block-causal
torch.nn.attention.flex_attention (torch.compile'd) with a block-causal BlockMask plus dense SDPA
with a boolean mask. Prints one line per case: name, ms (median), TFLOP/s of useful work
(causal = visible half, block-causal = attended blocks only) and GB/s of KV read for decode.
Each case is wrapped so an unsupported backend prints a reason instead of stopping the run."""
import math
import sys
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HK, D = 32, 8, 128
DT = torch.bfloat16
DEV = "cuda"
SCALE = 1.0 / math.sqrt(D)


def time_ms(fn, iters=10, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def report(name, ms, flops, nbytes=0.0):
    line = f"{name:<64} {ms:9.3f} ms {flops / (ms * 1e9):8.1f} TFLOP/s"
    if nbytes:
        line += f" {nbytes / (ms * 1e6):8.1f} GB/s"
    print(line, flush=True)


def attempt(name, fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
        print(f"{name:<64} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)


def rand(*shape):
    return torch.empty(*shape, device=DEV, dtype=DT).uniform_(-1, 1)


def sdpa(backend, q, k, v, causal, scale=SCALE):
    """SDPA under one backend; GQA through enable_gqa, else K/V expanded once outside timing."""
    with sdpa_kernel([backend]):
        try:
            F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
            return lambda: F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale, enable_gqa=True), "gqa"
        except Exception:  # noqa: BLE001
            ke = k.repeat_interleave(HQ // HK, dim=1)
            ve = v.repeat_interleave(HQ // HK, dim=1)
            F.scaled_dot_product_attention(q, ke, ve, is_causal=causal, scale=scale)
            return lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=causal,
                                                          scale=scale), "expanded kv"


BACKENDS = [("FLASH", SDPBackend.FLASH_ATTENTION), ("CUDNN", SDPBackend.CUDNN_ATTENTION)]


def causal_prefill(S, d=D):
    q, k, v = rand(1, HQ, S, d), rand(1, HK, S, d), rand(1, HK, S, d)
    flops = 4.0 * d * HQ * S * (S + 1) / 2
    tag = "" if d == D else f" head_dim {d}"
    for bname, be in BACKENDS:
        def run():
            fn, how = sdpa(be, q, k, v, True, 1.0 / math.sqrt(d))
            with sdpa_kernel([be]):
                ms = time_ms(fn)
            report(f"sdpa {bname} causal S={S}{tag} ({how})", ms, flops)
        attempt(f"sdpa {bname} causal S={S}{tag}", run)


def chunk_with_lse(nq=2048, nk=30720, d=D):
    """nq queries against nk keys, non-causal, with the LSE (the aten ops return it)."""
    q, k, v = rand(1, HQ, nq, d), rand(1, HK, nk, d), rand(1, HK, nk, d)
    ke, ve = k.repeat_interleave(HQ // HK, dim=1), v.repeat_interleave(HQ // HK, dim=1)
    flops = 4.0 * d * HQ * nq * nk
    scale = 1.0 / math.sqrt(d)
    tag = "" if d == D else f" head_dim {d}"

    def flash():
        fn = lambda: torch.ops.aten._scaled_dot_product_flash_attention(  # noqa: E731
            q, ke, ve, 0.0, False, False, scale=scale)
        out = fn()
        assert out[1].shape[-1] == nq, "no lse"
        report(f"sdpa FLASH chunk q={nq} kv={nk}{tag} +lse (aten, expanded kv)", time_ms(fn), flops)

    def cudnn():
        fn = lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(  # noqa: E731
            q, ke, ve, None, True, 0.0, False, False, scale=scale)
        out = fn()
        assert out[1].numel() > 0, "no lse"
        report(f"sdpa CUDNN chunk q={nq} kv={nk}{tag} +lse (aten, expanded kv)", time_ms(fn), flops)

    attempt("sdpa FLASH chunk +lse", flash)
    attempt("sdpa CUDNN chunk +lse", cudnn)


def decode(B, kv):
    q, k, v = rand(B, HQ, 1, D), rand(B, HK, kv, D), rand(B, HK, kv, D)
    flops = 4.0 * D * HQ * B * kv
    nbytes = 2.0 * B * kv * HK * D * 2
    for bname, be in BACKENDS:
        def run():
            fn, how = sdpa(be, q, k, v, False)
            with sdpa_kernel([be]):
                ms = time_ms(fn, iters=30)
            report(f"sdpa {bname} decode B={B} kv={kv} ({how})", ms, flops, nbytes)
        attempt(f"sdpa {bname} decode B={B}", run)


def read_ceiling():
    """What one launch can read: torch.sum over the decode shapes' K+V bytes (134 MB = batch 1 at
    32K keys, 537 MB = 128K, 4.3 GB = 1M), timed like the decode rows (events around one call,
    median). Two buffers alternate so the 50 MB L2 never holds the one being read."""
    for nbytes in (134217728, 536870912, 4294967296):
        n = nbytes // 2
        bufs = [torch.empty(n, device=DEV, dtype=DT).uniform_(-1, 1) for _ in range(2)]
        it = [0]

        def fn():
            it[0] ^= 1
            return bufs[it[0]].sum(dtype=torch.float32)

        report(f"torch.sum read {nbytes / 1e6:.0f} MB", time_ms(fn, iters=30), 0.0, nbytes)
        del bufs
        torch.cuda.empty_cache()


def block_causal_meta(total, span, block):
    segs = [span] * (total // span) + ([total % span] if total % span else [])
    seg_id = torch.empty(total, dtype=torch.int32)
    pos = torch.empty(total, dtype=torch.int32)
    off = 0
    pairs = 0
    for i, L in enumerate(segs):
        seg_id[off:off + L] = i
        pos[off:off + L] = torch.arange(L, dtype=torch.int32)
        for s in range(0, L, block):
            e = min(s + block, L)
            pairs += (e - s) * e
        off += L
    return segs, seg_id.to(DEV), pos.to(DEV), pairs


def block_causal(total, span, block):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    segs, seg_id, pos, pairs = block_causal_meta(total, span, block)
    flops = 4.0 * D * HQ * pairs
    q, k, v = rand(1, HQ, total, D), rand(1, HK, total, D), rand(1, HK, total, D)

    def mask_mod(b, h, q_idx, kv_idx):
        return (seg_id[q_idx] == seg_id[kv_idx]) & (pos[kv_idx] // block <= pos[q_idx] // block)

    def flex():
        bm = create_block_mask(mask_mod, None, None, total, total, device=DEV)
        compiled = torch.compile(flex_attention)
        fn = lambda: compiled(q, k, v, block_mask=bm, scale=SCALE, enable_gqa=True)  # noqa: E731
        fn()
        report(f"flex_attention block-causal total={total} span={span} block={block}",
               time_ms(fn), flops)

    def dense_masked():
        i = torch.arange(total, device=DEV)
        mask = mask_mod(None, None, i[:, None], i[None, :])
        ke, ve = k.repeat_interleave(HQ // HK, dim=1), v.repeat_interleave(HQ // HK, dim=1)
        fn = lambda: F.scaled_dot_product_attention(q, ke, ve, attn_mask=mask,  # noqa: E731
                                                    scale=SCALE)
        report(f"sdpa bool-mask block-causal total={total} span={span} block={block}",
               time_ms(fn, iters=3, warmup=1), flops)
        del mask

    attempt(f"flex_attention block-causal block={block}", flex)
    if block == 64:
        attempt("sdpa bool-mask block-causal", dense_masked)


def main():
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name()}; "
          f"{HQ} q / {HK} kv heads, head_dim {D}, bf16", flush=True)
    for what in sys.argv[1:] or ["prefill", "prefill64", "chunk", "decode", "block"]:
        if what == "prefill":
            for S in (8192, 32768):
                causal_prefill(S)
        elif what == "prefill64":  # Llama-3.2-1B class heads: head_dim 64
            for S in (8192, 32768):
                causal_prefill(S, 64)
        elif what == "chunk":
            chunk_with_lse()
            chunk_with_lse(256, 262144)  # a short chunk over a long history
            chunk_with_lse(640)  # 160 units of work: 1.2 rounds on 132 SMs
            chunk_with_lse(d=64)
            torch.cuda.empty_cache()
        elif what == "decode":
            # Shapes whose K/V (>= 134 MB) cannot sit in the 50 MB L2 between timed calls.
            for B, kv in ((1, 32768), (1, 131072), (1, 1048576), (8, 32768), (16, 32768),
                          (32, 32768), (64, 32768)):
                decode(B, kv)
                torch.cuda.empty_cache()
        elif what == "read":
            read_ceiling()
        elif what == "block":
            for block in (64, 128):
                block_causal(32768, 1500, block)
                torch.cuda.empty_cache()

if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
