"""longctx.ops on CUDA torch tensors (label gpu: built with LONGCTX_CUDA, run on a GPU machine):
the op against the dense masked reference on the caller's stream, and graph mode replaying every
layout of a bucket through one captured CUDA graph."""

import math

import torch

import longctx
from longctx import ops
from test_ops import dense_reference


def make_wrapper(Hq, Hkv, D, B, S, T, graph):
    ws = torch.empty(ops.workspace_bytes(Hq, Hkv, T, B, S), dtype=torch.uint8, device="cuda")
    return ops.RaggedBlockCausalWrapper(ws, Hq, Hkv, D, B, max_num_segments=S,
                                        max_total_tokens=T, accelerator_graph=graph,
                                        q_data_type=torch.bfloat16)


def test_built_with_cuda():
    assert longctx.built_with_cuda and torch.cuda.is_available()


def test_cuda_run_on_a_side_stream_matches_reference():
    Hq, Hkv, D, B = 8, 2, 64, 32
    seg_lens = [100, 32, 1, 77]
    n = sum(seg_lens)
    w = make_wrapper(Hq, Hkv, D, B, len(seg_lens), n, graph=False)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        q = torch.randn(n, Hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(n, Hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(n, Hkv, D, device="cuda", dtype=torch.bfloat16)
        w.plan(seg_lens)
        out = w.run(q, k, v)
    side.synchronize()
    assert out.is_cuda and out.shape == q.shape
    ref = dense_reference(q.cpu(), k.cpu(), v.cpu(), seg_lens, B, 1 / math.sqrt(D))
    assert (out.cpu().float() - ref).abs().max().item() < 2e-2


def test_graph_mode_replays_every_layout_of_the_bucket():
    Hq, Hkv, D, B, S, T = 4, 4, 64, 16, 4, 200
    w = make_wrapper(Hq, Hkv, D, B, S, T, graph=True)
    q = torch.randn(T, Hq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, Hkv, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(T, Hkv, D, device="cuda", dtype=torch.bfloat16)
    layouts = [[200], [1, 1, 1, 197], [50, 50, 50, 50], [17, 33], [16, 16, 16, 152]]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        w.plan(layouts[0])
        w.run(q, k, v)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = w.run(q, k, v)
        for seg_lens in layouts:
            w.plan(seg_lens)  # rewrites device buffers on the stream only
            graph.replay()
            stream.synchronize()
            assert w.padded_num_blocks >= ops.max_blocks(S, T, B)
            # A layout may cover fewer tokens than the captured tensors: rows past it are padding.
            n = sum(seg_lens)
            ref = dense_reference(q[:n].cpu(), k[:n].cpu(), v[:n].cpu(), seg_lens, B,
                                  1 / math.sqrt(D))
            err = (out[:n].cpu().float() - ref).abs().max().item()
            assert err < 2e-2, (seg_lens, err)
