"""Block-causal cacheless attention for streaming encoders (Whisper-style), over packed
[total, H, D] tensors: the C++ op of include/longctx/attention/block_causal.h.

Within each declared span, a token in block b (block_size tokens a block, counted from the
span's start) attends every key of blocks 0..b of that span: causal between blocks,
bidirectional within one, nothing across spans. So a streaming client that feeds a span block by
block sees the features a whole-span forward computes.

The prefixes of one span overlap, which a ragged kv_indptr cannot express; a paged layout can:
the packed keys are viewed as pages of one token and each query block is one paged "request"
whose page list is its prefix. No key is copied; the page lists are index arithmetic done at
plan time. Tensors go in and out through DLPack (torch, numpy on the CPU, CuPy), without copies.
"""

from __future__ import annotations

import importlib
from typing import Any, List, Optional, Sequence, Tuple

from longctx import _longctx

_ops = _longctx.ops

__all__ = [
    "RaggedBlockCausalWrapper",
    "block_causal_layout",
    "max_blocks",
    "max_prefix_tokens",
    "workspace_bytes",
]


def _from_dlpack_like(like: Any, dl: Any) -> Any:
    """`dl` (a longctx DLPack tensor) as a tensor of `like`'s library (torch, numpy, cupy)."""
    lib = importlib.import_module(type(like).__module__.split(".")[0])
    return lib.from_dlpack(dl)


def block_causal_layout(seg_lens: Sequence[int],
                        block_size: int) -> Tuple[List[int], List[int], Any]:
    """(qo_indptr, kv_indptr, kv_indices) for spans packed end to end.

    One entry per query block. Block i of a span starting at off has queries
    [off + i*B, off + min((i+1)*B, L)) and keys [off, off + min((i+1)*B, L)). kv_indices is an
    int32 torch tensor (a numpy array when torch is not installed). Spans of 0 tokens have no
    blocks; an empty list gives ([0], [0], []).
    """
    seg_lens = [int(n) for n in seg_lens]
    for i, n in enumerate(seg_lens):
        if n < 0:
            raise ValueError(f"block_causal_layout: span {i} has length {n} (must be >= 0)")
    nonempty = [n for n in seg_lens if n > 0]
    if nonempty:
        qo, kv, indices = _ops.block_causal_layout(nonempty, int(block_size))
    else:
        max_blocks(0, 0, block_size)  # the block size's check
        qo, kv, indices = [0], [0], None
    try:
        import torch
        idx = (torch.from_dlpack(indices) if indices is not None else
               torch.zeros(0, dtype=torch.int32))
    except ImportError:
        import numpy
        idx = numpy.from_dlpack(indices) if indices is not None else numpy.zeros(0, numpy.int32)
    return list(qo), list(kv), idx


def max_blocks(max_segments: int, max_tokens: int, block_size: int) -> int:
    """Most query blocks a layout of at most this many spans and tokens has: every span may end
    on a partial block."""
    return _ops.max_blocks(int(max_segments), int(max_tokens), int(block_size))


def max_prefix_tokens(max_tokens: int, block_size: int) -> int:
    """Most page indices such a layout needs: one span holding every token, which maximizes the
    sum of its blocks' prefixes."""
    return _ops.max_prefix_tokens(int(max_tokens), int(block_size))


def workspace_bytes(num_qo_heads: int, num_kv_heads: int, max_total_tokens: int,
                    block_size: int, max_num_segments: Optional[int] = None) -> int:
    """Bytes of the workspace_buffer a CUDA wrapper with these limits needs (0 on the CPU)."""
    segs = max_total_tokens if max_num_segments is None else max_num_segments
    return _ops.workspace_bytes(num_qo_heads, num_kv_heads, max_total_tokens, block_size,
                                max_blocks(segs, max_total_tokens, block_size))


def _device_str(device: Any) -> str:
    s = str(device)
    return "cuda:0" if s == "cuda" else s


def _dlpack_device(t: Any) -> str:
    """"cpu" or "cuda:N" of any DLPack tensor (None: "cpu")."""
    if t is None:
        return "cpu"
    kind, index = t.__dlpack_device__()
    if int(kind) == 1:
        return "cpu"
    if int(kind) == 2:
        return f"cuda:{int(index)}"
    raise ValueError(f"workspace_buffer is on DLPack device type {int(kind)} (CPU or CUDA only)")


def _dtype_str(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    table = {"bfloat16": "bf16", "float16": "f16", "half": "f16", "bf16": "bf16", "f16": "f16"}
    if name not in table:
        raise ValueError(f"q_data_type {dtype}: the op takes bfloat16 or float16")
    return table[name]


def _current_stream(t: Any) -> Optional[int]:
    """The caller's current CUDA stream for a torch CUDA tensor (None otherwise)."""
    if type(t).__module__.split(".")[0] != "torch" or not t.is_cuda:
        return None
    import torch
    return _stream_handle(torch.cuda.current_stream(t.device).cuda_stream)


def _stream_handle(ptr: int) -> int:
    """A cudaStream_t for DLPack and CUDA alike: the legacy default stream (pointer 0) is 1 in
    DLPack's __dlpack__(stream=...) and cudaStreamLegacy's value in CUDA."""
    return ptr if ptr != 0 else 1


class RaggedBlockCausalWrapper:
    """Paged prefill over a packed, cacheless [total, H, D] layout, planned block-causally per
    segment; see the module docstring.

    In graph mode (accelerator_graph=True) the block count is padded to the bucket's ceiling
    (max_blocks(max_num_segments, max_total_tokens, block_size)) with zero-length blocks, and the
    index buffer is sized for the worst prefix sum the bucket's token count allows, so any layout
    inside the bucket replays through the same captured kernel: plan() only rewrites device
    buffers (async copies on the stream), run() only launches, and its output is a fixed buffer.

    `device` defaults to the workspace buffer's device. On the CPU the op runs the engine's
    reference paged prefill (fp32 accumulation), so the whole API works without a GPU; the
    workspace may then be any (even empty) tensor. The CUDA path runs on the caller's current
    torch stream (or `stream=` given to plan/run).
    """

    def __init__(self, workspace_buffer: Any, num_qo_heads: int, num_kv_heads: int,
                 head_dim: int, block_size: int, max_num_segments: Optional[int] = None,
                 max_total_tokens: Optional[int] = None, device: Any = None,
                 accelerator_graph: bool = False, sm_scale: Optional[float] = None,
                 q_data_type: Any = "bfloat16", backend: str = "auto"):
        if backend != "auto":
            raise ValueError(f"backend {backend!r}: longctx has one kernel per device ('auto')")
        if device is None:
            device = _dlpack_device(workspace_buffer)
        self._device = _device_str(device)
        self._workspace = workspace_buffer  # the op views its memory
        self._op = _ops.RaggedBlockCausalAttention(
            workspace_buffer if self._device != "cpu" else None, int(num_qo_heads),
            int(num_kv_heads), int(head_dim), int(block_size), max_num_segments,
            max_total_tokens, self._device, bool(accelerator_graph), sm_scale,
            _dtype_str(q_data_type))

    def plan(self, seg_lens: Sequence[int], stream: Optional[int] = None) -> None:
        """Plan one packed layout: seg_lens[i] tokens in span i, end to end."""
        if stream is None and self._device.startswith("cuda"):
            import torch
            stream = _stream_handle(torch.cuda.current_stream(self._device).cuda_stream)
        self._op.plan([int(n) for n in seg_lens], stream)

    def run(self, q: Any, k: Any, v: Any, out: Any = None, stream: Optional[int] = None) -> Any:
        """[total, H, D] q/k/v packed by the planned spans -> [total, H, D], in q's library.

        As with the ragged wrapper, rows past the planned total are not a valid result; the
        caller slices. With `out`, writes there and returns it."""
        if stream is None:
            stream = _current_stream(q)
        if out is not None:
            self._op.run_into(q, k, v, out, stream)
            return out
        return _from_dlpack_like(q, self._op.run(q, k, v, stream))

    @property
    def num_segments(self) -> int:
        """Real (unpadded) segment count from the most recent plan."""
        return self._op.num_segments

    @property
    def num_blocks(self) -> int:
        """Real (unpadded) query block count from the most recent plan."""
        return self._op.num_blocks

    @property
    def padded_num_blocks(self) -> int:
        """The launch's block count (the bucket's ceiling in graph mode)."""
        return self._op.padded_num_blocks
