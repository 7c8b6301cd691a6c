"""longctx.ops against the seed's definitions (written out here from its docstrings) and a dense
masked attention reference, on CPU torch tensors and numpy arrays."""

import itertools
import math
import random

import numpy as np
import pytest
import torch

import longctx
from longctx import ops


# ---- the seed's definitions, directly ----
def seed_layout(seg_lens, B):
    """One entry per query block. Block i of a span starting at off has queries
    [off + i*B, off + min((i+1)*B, L)) and keys [off, off + min((i+1)*B, L))."""
    qo, kv, idx = [0], [0], []
    off = 0
    for L in seg_lens:
        for i in range(math.ceil(L / B)):
            end = min((i + 1) * B, L)
            qo.append(off + end)
            idx.extend(range(off, off + end))
            kv.append(len(idx))
        off += L
    return qo, kv, idx


def compositions(max_segments, max_tokens):
    """Every list of at most max_segments non-empty spans of at most max_tokens tokens."""
    yield []
    for n in range(1, max_segments + 1):
        for total in range(n, max_tokens + 1):
            for cuts in itertools.combinations(range(1, total), n - 1):
                bounds = (0,) + cuts + (total,)
                yield [b - a for a, b in zip(bounds, bounds[1:])]


def test_layout_matches_the_seed_on_random_lists():
    rng = random.Random(0)
    for trial in range(300):
        B = rng.choice([1, 2, 3, 4, 7, 16, 64])
        n = rng.randint(0, 8)
        # Empty spans, spans shorter than a block, exact multiples and partial last blocks.
        lens = [rng.choice([0, 1, B - 1 or 1, B, B + 1, 2 * B, rng.randint(0, 5 * B)])
                for _ in range(n)]
        qo, kv, idx = ops.block_causal_layout(lens, B)
        want_qo, want_kv, want_idx = seed_layout(lens, B)
        assert (qo, kv) == (want_qo, want_kv), (lens, B)
        assert isinstance(idx, torch.Tensor) and idx.dtype == torch.int32
        assert idx.tolist() == want_idx, (lens, B)


def test_layout_empty_and_errors():
    qo, kv, idx = ops.block_causal_layout([], 4)
    assert (qo, kv, idx.tolist()) == ([0], [0], [])
    assert ops.block_causal_layout([0, 0], 4)[0] == [0]
    with pytest.raises(ValueError, match="span 1 has length -1"):
        ops.block_causal_layout([3, -1], 4)
    with pytest.raises(longctx.InvalidArgumentError, match="block"):
        ops.block_causal_layout([3], 0)


def test_max_blocks_and_max_prefix_tokens_are_the_seed_maxima():
    # "Most query blocks a layout of at most this many spans and tokens has" and "most page
    # indices such a layout needs": brute force over every layout within the limits.
    for B in (1, 2, 3, 5):
        for S in range(0, 5):
            for T in range(0, 10):
                best_blocks = best_prefix = 0
                for lens in compositions(S, T):
                    qo, kv, _ = seed_layout(lens, B)
                    best_blocks = max(best_blocks, len(qo) - 1)
                    best_prefix = max(best_prefix, kv[-1])
                assert ops.max_blocks(S, T, B) == best_blocks, (S, T, B)
                if S >= 1:
                    assert ops.max_prefix_tokens(T, B) == best_prefix, (T, B)


def dense_reference(q, k, v, seg_lens, B, scale):
    """Softmax attention with the block-causal mask spelled out per (query, key) pair."""
    n = sum(seg_lens)
    seg = torch.repeat_interleave(torch.arange(len(seg_lens)), torch.tensor(seg_lens))
    start = torch.repeat_interleave(torch.tensor([0] + list(np.cumsum(seg_lens[:-1]))),
                                    torch.tensor(seg_lens))
    blk = (torch.arange(n) - start) // B
    allowed = (seg[:, None] == seg[None, :]) & (blk[None, :] <= blk[:, None])
    group = q.shape[1] // k.shape[1]
    kf = k[:n].float().repeat_interleave(group, dim=1)
    vf = v[:n].float().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q[:n].float(), kf) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vf)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wrapper_run_matches_dense_masked_reference(dtype):
    g = torch.Generator().manual_seed(1)
    Hq, Hkv, D, B = 8, 2, 32, 16
    w = ops.RaggedBlockCausalWrapper(torch.empty(0, dtype=torch.uint8), Hq, Hkv, D, B,
                                     q_data_type=dtype)
    for seg_lens in ([37], [16, 5, 33, 1], [70, 16, 17]):
        n = sum(seg_lens)
        rows = n + 3  # rows past the planned total are allowed (and ignored)
        q = torch.randn(rows, Hq, D, generator=g).to(dtype)
        k = torch.randn(rows, Hkv, D, generator=g).to(dtype)
        v = torch.randn(rows, Hkv, D, generator=g).to(dtype)
        w.plan(seg_lens)
        assert w.num_segments == len(seg_lens)
        assert w.num_blocks == sum(math.ceil(L / B) for L in seg_lens)
        out = w.run(q, k, v)
        assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.shape == q.shape
        ref = dense_reference(q, k, v, seg_lens, B, 1 / math.sqrt(D))
        err = (out[:n].float() - ref).abs().max().item()
        assert err < 2e-2, (seg_lens, err)
        # A wrong mask (plain causal within the span) is far off: the check can fail.
        assert (out[:n].float() - dense_reference(q, k, v, seg_lens, 1, 1 / math.sqrt(D))
                ).abs().max().item() > 0.1


def test_wrapper_out_argument_and_sm_scale():
    Hq = Hkv = 2
    D, B = 16, 4
    q, k, v = (torch.randn(10, Hq, D).bfloat16() for _ in range(3))
    w = ops.RaggedBlockCausalWrapper(torch.empty(0, dtype=torch.uint8), Hq, Hkv, D, B,
                                     sm_scale=0.5)
    w.plan([6, 4])
    out = torch.empty_like(q)
    ret = w.run(q, k, v, out=out)
    assert ret is out
    ref = dense_reference(q, k, v, [6, 4], B, 0.5)
    assert (out.float() - ref).abs().max().item() < 2e-2


def test_wrapper_on_numpy_float16():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((12, 4, 16)).astype(np.float16)
    k = rng.standard_normal((12, 4, 16)).astype(np.float16)
    v = rng.standard_normal((12, 4, 16)).astype(np.float16)
    w = ops.RaggedBlockCausalWrapper(np.empty(0, np.uint8), 4, 4, 16, 5, q_data_type="float16")
    w.plan([12])
    out = w.run(q, k, v)
    assert isinstance(out, np.ndarray) and out.dtype == np.float16
    ref = dense_reference(*(torch.from_numpy(t) for t in (q, k, v)), [12], 5, 0.25)
    assert np.abs(out.astype(np.float32) - ref.numpy()).max() < 1e-2


def test_wrapper_errors():
    w = ops.RaggedBlockCausalWrapper(torch.empty(0, dtype=torch.uint8), 4, 2, 16, 4)
    q, k, v = torch.randn(8, 4, 16).bfloat16(), torch.randn(8, 2, 16).bfloat16(), \
        torch.randn(8, 2, 16).bfloat16()
    with pytest.raises(longctx.InvalidArgumentError, match="call plan"):
        w.run(q, k, v)
    w.plan([8])
    with pytest.raises(longctx.InvalidArgumentError, match="q has dtype f32"):
        w.run(q.float(), k, v)
    with pytest.raises(longctx.InvalidArgumentError, match=r"k has shape \[8, 4, 16\]"):
        w.run(q, q, v)
    with pytest.raises(longctx.InvalidArgumentError, match="contiguous"):
        w.run(q.transpose(0, 1).contiguous().transpose(0, 1), k, v)
    with pytest.raises(longctx.InvalidArgumentError, match="plan packs 12"):
        w.plan([12])
        w.run(q, k, v)
    with pytest.raises(longctx.InvalidArgumentError, match="num_qo_heads 3"):
        ops.RaggedBlockCausalWrapper(torch.empty(0, dtype=torch.uint8), 3, 2, 16, 4)
    with pytest.raises(longctx.InvalidArgumentError, match="graph mode needs"):
        ops.RaggedBlockCausalWrapper(torch.empty(0, dtype=torch.uint8), 4, 2, 16, 4,
                                     accelerator_graph=True)
    with pytest.raises(longctx.InvalidArgumentError, match="graph mode needs a CUDA device"):
        ops.RaggedBlockCausalWrapper(torch.empty(0, dtype=torch.uint8), 4, 2, 16, 4,
                                     max_num_segments=2, max_total_tokens=8,
                                     accelerator_graph=True)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        ops.RaggedBlockCausalWrapper(torch.empty(0, dtype=torch.uint8), 4, 2, 16, 4,
                                     q_data_type=torch.float32)
    if not longctx.built_with_cuda:
        with pytest.raises(longctx.UnsupportedError):
            ops.RaggedBlockCausalWrapper(torch.empty(0, dtype=torch.uint8), 4, 2, 16, 4,
                                         device="cuda")
