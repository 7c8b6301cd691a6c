"""The streaming-encoder example's parity on the CPU (examples/whisper_streaming_parity.py)."""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import whisper_streaming_parity as demo  # noqa: E402


def test_packed_equals_streaming_on_the_cpu():
    # Whisper-tiny's widths, two layers, clips with partial last blocks and one shorter than a
    # block.
    r = demo.parity("tiny", layers=2, clip_lens=[70, 45, 9], block=16, device="cpu")
    assert r["frames"] == 124
    assert r["max_abs_diff"] < 1e-3 * r["max_abs_value"], r


def test_a_wrong_streaming_block_is_caught():
    # The comparison can fail: streaming with blocks of 8 against a packed plan of 16 differs.
    cfg = demo.CONFIGS["tiny"]
    import torch

    enc = demo.Encoder(cfg, 1, "cpu", seed=0)
    g = torch.Generator().manual_seed(1)
    frames = [torch.randn(40, cfg["d_model"], generator=g)]
    packed = demo.packed_forward(enc, frames, 16, "cpu")
    streamed = demo.streaming_forward(enc, frames, 8)
    assert (packed - streamed).abs().max().item() > 1e-2


def test_cli_runs(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["demo", "--device", "cpu", "--config", "tiny", "--layers",
                                      "1", "--clips", "2", "--max-frames", "40", "--block", "8"])
    assert demo.main() == 0
    assert "parity: OK" in capsys.readouterr().out


def test_bench_needs_cuda(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["demo", "--device", "cpu", "--layers", "1", "--clips", "1",
                                      "--max-frames", "16", "--bench"])
    assert demo.main() == 2
