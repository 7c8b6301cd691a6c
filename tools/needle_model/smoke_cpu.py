"""CPU smoke test of train.py without transformers (PyTorch only; any version from 1.13).

  python3 tools/needle_model/smoke_cpu.py [--stages v2] [--steps-per-stage 2]

Runs `train.train` on a tiny Llama-shaped stand-in model (embeddings, RMSNorm, RoPE attention
with grouped KV heads, SiLU MLP, tied head: the interface train.py uses of transformers'
LlamaForCausalLM) through every stage of a stage set (`--stage-steps` replay, short lengths), with
worker processes building the batches, spike skipping, a checkpoint save, a saved training
state and a second run resumed from it; then checks that the GPU plan's command lines in
README.md parse (gpu_run.py's and train.py's options). What it cannot check: transformers'
model, SDPA kernels, memory and speed at 128K tokens (gpu_run.py's smoke phase does, on the GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shlex
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import train as needle_train  # noqa: E402


class _Output:
    def __init__(self, h):
        self.last_hidden_state = h


class _Config:
    dtype = torch.float32


class StandIn(torch.nn.Module):
    """LlamaForCausalLM's shape and interface at toy size (float32, CPU)."""

    def __init__(self, vocab=2048, hidden=32, layers=2, heads=4, kv_heads=2, theta=1e8):
        super().__init__()
        self.hd, self.nh, self.nkv, self.theta = hidden // heads, heads, kv_heads, theta
        self.config = _Config()
        self.embed = torch.nn.Embedding(vocab, hidden)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            self.layers.append(torch.nn.ModuleDict({
                "q": torch.nn.Linear(hidden, heads * self.hd, bias=False),
                "kv": torch.nn.Linear(hidden, 2 * kv_heads * self.hd, bias=False),
                "o": torch.nn.Linear(heads * self.hd, hidden, bias=False),
                "up": torch.nn.Linear(hidden, 2 * 3 * hidden, bias=False),
                "down": torch.nn.Linear(3 * hidden, hidden, bias=False)}))
        self.norms = torch.nn.Parameter(torch.ones(2 * layers + 1, hidden))
        self.model = self._body  # model.model(input_ids=...).last_hidden_state, as in HF

    def lm_head(self, h):
        return h @ self.embed.weight.T

    def _rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def _rope(self, t):
        L, hd = t.shape[-2], self.hd
        inv = 1.0 / (self.theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = torch.arange(L, dtype=torch.float32)[:, None] * inv[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        t1, t2 = t[..., :hd // 2], t[..., hd // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    def _body(self, input_ids, use_cache=False):
        B, L = input_ids.shape
        x = self.embed(input_ids)
        mask = torch.full((L, L), float("-inf")).triu(1)
        for i, ly in enumerate(self.layers):
            h = self._rms(x, self.norms[2 * i])
            q = ly["q"](h).view(B, L, self.nh, self.hd).transpose(1, 2)
            k, v = ly["kv"](h).view(B, L, 2, self.nkv, self.hd).permute(2, 0, 3, 1, 4)
            q, k = self._rope(q), self._rope(k)
            rep = self.nh // self.nkv
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.hd) + mask, -1) @ v
            x = x + ly["o"](a.transpose(1, 2).reshape(B, L, -1))
            h = self._rms(x, self.norms[2 * i + 1])
            g, u = ly["up"](h).chunk(2, -1)
            x = x + ly["down"](F.silu(g) * u)
        return _Output(self._rms(x, self.norms[-1]))

    def save_pretrained(self, path):
        os.makedirs(path, exist_ok=True)
        torch.save(self.state_dict(), os.path.join(path, "stand_in.pt"))
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"stand_in": True}, f)


def stand_in_factory(c, dev):
    torch.manual_seed(c.seed)
    shape = needle_train.MODEL_SHAPES[c.model_shape]
    return StandIn(theta=shape.rope_theta).to(dev)


def check_plan_commands(readme: str) -> int:
    """Every gpu_run.py / train.py / eval.py command line in README.md's "v2 plan" and "Run 9
    plan" parses."""
    import gpu_run
    import eval as needle_eval
    with open(readme) as f:
        text = f.read()
    blocks = []
    for header, ends in (("## v2 plan", ("\n## ",)), ("### Run 9 plan", ("\n## ", "\n### "))):
        plan = text[text.index(header) + len(header):]
        cut = min((plan.index(e) for e in ends if e in plan), default=len(plan))
        blocks += re.findall(r"```sh\n(.*?)```", plan[:cut], re.S)
    n = 0
    for block in blocks:
        for cmd in block.replace("\\\n", " ").splitlines():
            m = re.search(r"tools/needle_model/(gpu_run|train|eval)\.py (.*)", cmd)
            if not m:
                continue
            argv = shlex.split(m.group(2).split(" 2>&1")[0].split(" | ")[0].split(" && ")[0])
            argv = [x.replace("$OUT", "/tmp/out") for x in argv]
            if m.group(1) == "gpu_run":
                gpu_run.parser().parse_args(argv)
            elif m.group(1) == "train":
                needle_train.config_from_args(argv)
            else:
                needle_eval.parser().parse_args(argv)
            n += 1
    assert n >= 4, f"only {n} plan commands found in {readme}"
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--stages", default="v2", choices=list(needle_train.STAGES_SETS))
    ap.add_argument("--steps-per-stage", type=int, default=2)
    ap.add_argument("--lengths", default="256,512", help="force_length (short: a CPU forward)")
    ap.add_argument("--essays", default=needle_train.TrainConfig().essays)
    a = ap.parse_args()
    n_stages = len(needle_train.STAGES_SETS[a.stages])
    k = a.steps_per_stage
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        base = needle_train.TrainConfig(
            essays=a.essays, stages=a.stages, model_shape="v2", device="cpu", workers=2,
            prefetch=4, tokens_per_step=1024, max_steps=k * n_stages,
            force_length=tuple(int(x) for x in a.lengths.split(",")),
            stage_steps=",".join(str(k * i) for i in range(1, n_stages)), log_every=1,
            acc_every=1, out=os.path.join(tmp, "model"), copy_to=os.path.join(tmp, "copy"),
            save_state=os.path.join(tmp, "state.pt"), skip_spikes=10, warmup=2,
            stage_checkpoints=os.path.join(tmp, "stages"))
        info = needle_train.train(base, log=lines.append, model_factory=stand_in_factory)
        steps = [ln for ln in lines if ln.startswith("step ")]
        losses = [float(re.search(r"loss=([0-9.na]+)", ln).group(1)) for ln in steps]
        assert info["steps"] == k * n_stages and all(math.isfinite(x) for x in losses), lines
        assert [s["stage"] for s in info["stages"]] == list(range(n_stages)), info["stages"]
        assert os.path.exists(base.save_state) and os.listdir(base.stage_checkpoints)
        assert os.path.exists(os.path.join(base.out, "tokenizer.json"))
        # A second call resumes the float32 weights and AdamW moments.
        lines2 = []
        resumed = dataclasses.replace(base, resume_state=base.save_state, save_state="",
                                      start_stage=n_stages - 1, stage_steps="", max_steps=2,
                                      seed=1, stage_checkpoints="")
        info2 = needle_train.train(resumed, log=lines2.append, model_factory=stand_in_factory)
        assert any(ln.startswith("resumed float32 weights") for ln in lines2), lines2
        assert info2["steps"] == 2 and info2["last_stage"] == n_stages - 1
    print("\n".join(lines[:3] + ["..."] + steps[-2:] + lines2[-3:]))
    print(f"train loop ok: {info['steps']} steps over {n_stages} stages of {a.stages!r}, "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, resumed for {info2['steps']} steps")
    n = check_plan_commands(os.path.join(HERE, "README.md"))
    print(f"plan commands ok: {n} command lines of README.md's v2 and run 9 plans parse")


if __name__ == "__main__":
    main()
