"""Trains the needle model (LlamaForCausalLM, ~4.7M parameters) on RULER-style retrieval tasks
with a context-length curriculum. Runs on one GPU with PyTorch + transformers (the loop also runs
on the CPU, for small dry runs).

Data: every step holds `tokens_per_step` tokens: B = tokens_per_step // L sequences of length L
(right-padded; causal attention makes padding at the end harmless, so no mask is needed and SDPA
runs its flash kernel). L is drawn from the current curriculum stage. The loss is cross-entropy
on the answer tokens and EOS (weight 1), on the answer prefix (weight 0.25, it copies the query
key from the question) and, with `--lm-weight w`, on every other token of the sample (weight w:
plain next-token prediction over haystack, needles and question, which gives every position a
gradient while the sparse answer loss alone sits on a long plateau).

Curriculum (`--stages gated`): stages of growing length, from 128-256 tokens (where a needle is a
large part of the context and the find-and-copy circuit forms quickly) to 32K-64K. A stage ends
when the running sequence accuracy of the training batches (fresh samples, so it measures
generalization) passes its gate, or when its share of the training time is spent, whichever
comes first. The step at which each stage began is logged; `--stage-steps` replays a schedule.

Batch i is a pure function of (seed, i, stage): worker processes build batches ahead of the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import sys
import time
import dataclasses
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bpe import ByteLevelBPE  # noqa: E402
from needle_data import Generator  # noqa: E402

BOS, EOS, PAD = 2045, 2046, 2047
PREFIX_WEIGHT = 0.25
AUX_WEIGHT = 1.0
COPIES = 0  # max repeated haystack spans per sample (set by --copies)
LM_WEIGHT = 0.0  # weight of next-token loss on the other tokens (set by --lm-weight)

ALL_TASKS = {"niah_single": 0.25, "niah_multikey": 0.25, "niah_multivalue": 0.1,
             "niah_multiquery": 0.15, "vt": 0.15, "copy": 0.1}
SHORT_TASKS = {"niah_single": 0.35, "niah_multikey": 0.25, "niah_multiquery": 0.1,
               "niah_multivalue": 0.1, "copy": 0.2}
COPY_ONLY = {"copy": 1.0}
# The evaluated lengths 4K-32K, longer ones weighted up (the last stage of a long run).
EVAL_MIX = {4096: 0.15, 8192: 0.15, 16384: 0.3, 32768: 0.4}


@dataclass
class Stage:
    until: float      # the stage ends at this fraction of the training time at the latest
    lengths: dict     # {length: probability}
    tasks: dict = field(default_factory=lambda: dict(ALL_TASKS))  # {task: probability}
    gate: dict = field(default_factory=dict)  # {task: accuracy}: advance early when all pass
    tokens: int = 0   # tokens per step in this stage (0: --tokens-per-step)
    seconds: float = 0  # also ends after this many seconds in the stage (0: no limit)
    lr: float = 0     # peak learning rate in this stage (0: --lr)


# Advance early once single-needle retrieval works at this length. (Run 5's call A also asked
# multikey >= 0.7: it stayed at 0.2-0.55, so every stage ran to its time limit.)
GATE = {"niah_single": 0.95}
GATE_RUN4 = {"niah_single": 0.95, "niah_multikey": 0.85}

STAGES_SETS = {
    # Induction warm-up (copy task only), then the tasks from 128-256 tokens up, each stage
    # ending early once retrieval works at its lengths.
    "gated": [
        # Run 4 (2026-11-30): the copy loss fell from 6.4 to 3.6 nats in ~2K steps (~60 s) of
        # 128 x 256 tokens; retrieval followed after ~2.2K more steps of short tasks (niah_single
        # 0.95 at 256-512 tokens, 0.92 at 512-1K, 0.84 at 1K-2K), then stages of ~27 s each from
        # 2K tokens on were too short and it collapsed at 4K. So the limits are seconds per stage
        # (a run that ends early continues with --init and --start-stage), the short phase keeps
        # run 4's durations, and the later stages get 2-3x run 4's time with larger batches.
        Stage(1.0, {256: 1.0}, COPY_ONLY, {"copy": 0.5}, seconds=70),
        # (run 4's retrieval appeared ~62 s into this stage: 100 s leaves room for a later one)
        Stage(1.0, {128: 0.4, 256: 0.6}, SHORT_TASKS, GATE, seconds=100),
        Stage(1.0, {256: 0.3, 512: 0.7}, SHORT_TASKS, GATE, seconds=60),
        Stage(1.0, {512: 0.3, 1024: 0.7}, gate=GATE, seconds=60),
        Stage(1.0, {512: 0.2, 1024: 0.3, 2048: 0.5}, gate=GATE, seconds=60),
        # Lower rates from here on: run 5's call B (1.5e-3 from 4K-16K on) lost at 16K-32K what
        # call C (1e-3) kept.
        Stage(1.0, {1024: 0.2, 2048: 0.3, 4096: 0.5}, gate=GATE, tokens=65536, seconds=70,
              lr=1.5e-3),
        Stage(1.0, {2048: 0.2, 4096: 0.3, 8192: 0.5}, gate=GATE, tokens=65536, seconds=80,
              lr=1.5e-3),
        Stage(1.0, {4096: 0.2, 8192: 0.3, 16384: 0.5}, gate=GATE, tokens=65536, seconds=90,
              lr=1e-3),
        Stage(1.0, {4096: 0.15, 16384: 0.35, 32768: 0.5}, gate=GATE, tokens=65536, seconds=100,
              lr=1e-3),
        # The evaluated lengths 4K-32K to the end (run 5's call C also drew 10% of 64K samples:
        # ~20% of its time, and 0% right at 64K after it).
        Stage(1.0, EVAL_MIX, tokens=65536, lr=1e-3),
    ],
    # Continuing a model that retrieves up to 32K (run 5's): the evaluated lengths 4K-32K only
    # (run 5's final stage spent ~20% of its time on 64K samples it never got right).
    "polish": [
        Stage(1.0, EVAL_MIX, tokens=65536),
    ],
    # run 4's schedule (run 4's checkpoint; replay with --stage-steps
    # 2273,4496,5567,6508,7490,8372,9178,10010,10761 --tokens-per-step 32768)
    "run4": [
        Stage(0.18, {256: 1.0}, COPY_ONLY, {"copy": 0.5}),
        Stage(0.36, {128: 0.4, 256: 0.6}, SHORT_TASKS, GATE_RUN4),
        Stage(0.44, {256: 0.3, 512: 0.7}, SHORT_TASKS, GATE_RUN4),
        Stage(0.51, {512: 0.3, 1024: 0.7}),
        Stage(0.58, {1024: 0.3, 2048: 0.7}),
        Stage(0.65, {1024: 0.2, 2048: 0.3, 4096: 0.5}),
        Stage(0.72, {2048: 0.2, 4096: 0.3, 8192: 0.5}),
        Stage(0.80, {4096: 0.2, 8192: 0.3, 16384: 0.5}),
        Stage(0.90, {4096: 0.15, 16384: 0.35, 32768: 0.5}),
        Stage(1.00, {8192: 0.2, 16384: 0.2, 32768: 0.4, 65536: 0.2}),
    ],
    # run 1's schedule (wall-clock stages, L >= 512 from the start)
    "default": [
        Stage(0.15, {512: 0.5, 1024: 0.5}),
        Stage(0.35, {1024: 0.3, 2048: 0.4, 4096: 0.3}),
        Stage(0.55, {2048: 0.2, 4096: 0.4, 8192: 0.4}),
        Stage(0.75, {4096: 0.2, 8192: 0.3, 16384: 0.5}),
        Stage(1.00, {4096: 0.15, 16384: 0.25, 32768: 0.4, 65536: 0.2}),
    ],
    # a short continuation run
    "fast": [
        Stage(0.35, {512: 0.5, 1024: 0.5}),
        Stage(0.55, {1024: 0.3, 2048: 0.4, 4096: 0.3}),
        Stage(0.75, {2048: 0.2, 4096: 0.3, 8192: 0.3, 16384: 0.2}),
        Stage(1.00, {4096: 0.2, 16384: 0.3, 32768: 0.5}),
    ],
}
# The whole curriculum in 900 s of H200 time (the 15 minutes), run as two calls:
# stages 0-6 (<= 395 s, `--stop-after-stage 6`), then 7-9 continuing it. Against `gated`
# (runs 5A + 6a: 874 s, 93-97 %): the short stages never passed their gates in 5A, so they
# are 10-20 s shorter; 2K-8K runs at 1e-3 (run 6b diverged there at 1.5e-3); 4K-16K and
# 4K-32K are 20 s shorter; the time saved goes to the 4K-32K mix, where run 6a's accuracy
# at 16K-32K came only while the rate decayed (run it with --decay-start ~0.3). Run 7 (the
# committed model): every stage to 2K-8K passed its gate early (147 s), then 495 s.
# `gated`'s stages and gates with these limits, and 1e-3 at 2K-8K.
G900_SECONDS = (60, 100, 40, 40, 45, 50, 60, 70, 80, 0)
STAGES_SETS["g900"] = [
    dataclasses.replace(st, seconds=sec, lr=1e-3 if i == 6 else st.lr)
    for i, (st, sec) in enumerate(zip(STAGES_SETS["gated"], G900_SECONDS, strict=True))]
STAGES = STAGES_SETS["gated"]
TASK_INDEX = {t: i for i, t in enumerate(ALL_TASKS)}


def model_config():
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=2048, hidden_size=256, intermediate_size=640, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, hidden_act="silu",
        max_position_embeddings=131072, rms_norm_eps=1e-5, initializer_range=0.02,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7}, attention_bias=False,
        mlp_bias=False, tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS,
        pad_token_id=PAD)


def random_sample(gen: Generator, rng: random.Random, length: int, tasks: dict):
    task = rng.choices(list(tasks), weights=list(tasks.values()))[0]
    if task == "vt":
        kw = dict(haystack="noise" if rng.random() < 0.7 else "essay",
                  num_chains=rng.randint(1, 2), num_hops=rng.randint(1, 4))
    else:
        kw = dict(haystack="essay" if rng.random() < 0.8 else "noise",
                  num_distractors=rng.randint(1, 6), num_values=rng.randint(2, 4),
                  num_queries=rng.randint(2, 4))
    if COPIES:
        kw["copies"] = rng.randint(0, COPIES)
    try:
        return task, gen.make_sample(rng, task, length, **kw)
    except ValueError:  # too short for this draw (e.g. 6 distractors in 128 tokens)
        return "niah_single", gen.make_sample(rng, "niah_single", length,
                                              haystack=kw["haystack"])


def copy_arrays(rng: random.Random, length: int):
    """The induction warm-up task: random tokens (a third of them digits) in which 2-6 spans of
    6-24 tokens reappear later; the loss is on predicting each copy from its first token on.
    Digit-heavy spans need more than the previous token to continue (digits repeat), as a
    7-digit needle value does."""
    digits = _GEN.digit_ids
    ids = np.full(length, PAD, dtype=np.int32)
    w = np.zeros(length, dtype=np.float32)
    n = length - 1  # BOS first
    body = [rng.choice(digits) if rng.random() < 0.33 else rng.randrange(256, BOS)
            for _ in range(n)]
    taken = []
    for _ in range(rng.randint(2, 6)):
        m = rng.randint(6, min(24, n // 4))
        src = rng.randrange(0, n - 2 * m)
        dst = rng.randrange(src + m, n - m + 1)
        if any(dst < b + 1 and a < dst + m + 1 for a, b in taken):
            continue
        body[dst:dst + m] = body[src:src + m]
        taken.append((dst, dst + m))
        # ids index of body[i] is i + 1; weight at t applies to predicting ids[t + 1].
        w[dst + 1:dst + m] = 1.0
    ids[0] = BOS
    ids[1:] = body
    return ids, w


def sample_arrays(s, prefix_len: int, length: int):
    """ids [length] and weights [length] (weight[t] applies to predicting ids[t + 1])."""
    seq = [BOS] + s.ids + s.answer_ids + [EOS]
    ids = np.full(length, PAD, dtype=np.int32)
    ids[:len(seq)] = seq
    w = np.zeros(length, dtype=np.float32)
    p0 = 1 + len(s.ids)  # index of the first answer token in seq
    w[:p0 - 1] = LM_WEIGHT
    w[p0 - 1 - prefix_len:p0 - 1] = PREFIX_WEIGHT
    w[p0 - 1:len(seq) - 1] = 1.0
    for k in s.aux_pos:  # ids[k] is seq[k + 1], predicted at position k
        w[k] = AUX_WEIGHT
    return ids, w


_GEN: Generator | None = None
MODEL_FILES = ("model.safetensors", "config.json", "generation_config.json")  # save_pretrained's


def build_batch(args):
    """Worker: batch `index` -> (index, stage, L, ids [B, L], weights [B, L], tasks [B]).
    A fixed length `force_len` replaces the stage's length draw (throughput checks)."""
    index, stage, seed, tokens_per_step, force_len, stages, copies, lm_weight = args
    global STAGES, COPIES, LM_WEIGHT
    STAGES, COPIES, LM_WEIGHT = stages, copies, lm_weight
    rng = random.Random(f"train/{seed}/{index}")
    lengths = STAGES[stage].lengths
    L = rng.choices(list(lengths), weights=list(lengths.values()))[0]
    if force_len:
        L = force_len[index % len(force_len)]
    B = max(1, (STAGES[stage].tokens or tokens_per_step) // L)
    ids = np.empty((B, L), dtype=np.int32)
    w = np.empty((B, L), dtype=np.float32)
    tasks = np.empty(B, dtype=np.int64)
    for b in range(B):
        task = "copy" if rng.random() < STAGES[stage].tasks.get("copy", 0) else ""
        if task:
            ids[b], w[b] = copy_arrays(rng, L)
        else:
            niah = {t: p for t, p in STAGES[stage].tasks.items() if t != "copy"}
            task, s = random_sample(_GEN, rng, L, niah)
            ids[b], w[b] = sample_arrays(s, s.n_prefix, L)
        tasks[b] = TASK_INDEX[task]
    return index, stage, L, ids, w, tasks


def init_generator(tokenizer_path: str, essays_path: str) -> None:
    global _GEN
    if _GEN is None:
        _GEN = Generator(ByteLevelBPE.from_file(tokenizer_path), essays_path)
        _GEN.digit_ids = [_GEN.enc(str(d))[0] for d in range(10)]


def save_model(model, out_dir: str, tokenizer_dir: str | None = None,
               copy_to: str | None = None) -> None:
    """bf16 copy in the HF layout, written to a temp folder then moved in place."""
    import torch
    tmp = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    m = copy.deepcopy(model).to(torch.bfloat16)
    m.config.dtype = torch.bfloat16
    m.save_pretrained(tmp)
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(tmp):
        os.replace(os.path.join(tmp, f), os.path.join(out_dir, f))
    shutil.rmtree(tmp, ignore_errors=True)
    if tokenizer_dir:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(out_dir, f))
    if copy_to:  # the model files only (a checkpoint that survives a time-out)
        os.makedirs(copy_to, exist_ok=True)
        for f in MODEL_FILES:
            if os.path.exists(os.path.join(out_dir, f)):
                shutil.copy(os.path.join(out_dir, f), os.path.join(copy_to, f + ".tmp"))
                os.replace(os.path.join(copy_to, f + ".tmp"), os.path.join(copy_to, f))


def lr_at(frac: float, step: int, peak: float, warmup: int, decay_start: float = 0.7,
          stage_step: int | None = None, stage_ramp: int = 0) -> float:
    """Linear warm-up, constant, then cosine to 0.1x from `decay_start` (a fraction of the
    training time; >= 1: no decay, for a run another call continues). After a stage change
    (`stage_step` steps into the stage) the rate ramps from 0.3x over `stage_ramp` steps: the
    first batches of a longer length gave gradient-norm spikes of 160-960 in run 4."""
    if step < warmup:
        return peak * (step + 1) / warmup
    ramp = 1.0
    if stage_step is not None and stage_ramp and stage_step < stage_ramp:
        ramp = 0.3 + 0.7 * stage_step / stage_ramp
    if frac < decay_start:
        return peak * ramp
    t = min(1.0, (frac - decay_start) / max(1e-9, 1.0 - decay_start))
    return peak * ramp * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def build_model(a, dev):
    """transformers' LlamaForCausalLM (fp32 master weights), new or from `a.init`."""
    import torch
    from transformers import LlamaForCausalLM
    if a.init:
        return LlamaForCausalLM.from_pretrained(a.init, attn_implementation="sdpa",
                                                dtype=torch.float32).to(dev)
    return LlamaForCausalLM._from_config(model_config(), attn_implementation="sdpa",
                                         dtype=torch.float32).to(dev)


class AccuracyTracker:
    """Running per-task sequence accuracy of the training batches since the stage began."""

    def __init__(self, window: int = 400):
        self.window = window
        self.hist = {t: [] for t in TASK_INDEX}

    def reset(self):
        self.hist = {t: [] for t in TASK_INDEX}

    def add(self, rows_ok, tasks):
        for ok, ti in zip(rows_ok, tasks):
            h = self.hist[list(TASK_INDEX)[ti]]
            h.append(bool(ok))
            if len(h) > self.window:
                del h[0]

    def acc(self, task: str):
        h = self.hist[task]
        return (sum(h) / len(h), len(h)) if h else (0.0, 0)

    def passes(self, gate: dict) -> bool:
        for t, need in gate.items():
            v, n = self.acc(t)
            if n < self.window // 2 or v < need:
                return False
        return bool(gate)

    def summary(self) -> dict:
        return {t: round(self.acc(t)[0], 3) for t in TASK_INDEX if self.hist[t]}


def train(a, log=print, model_factory=build_model) -> dict:
    import torch
    import torch.nn.functional as F

    global STAGES, COPIES, LM_WEIGHT
    STAGES = STAGES_SETS[a.stages]
    if a.start_stage:
        # Continuing a run that reached stage k: the time caps of stages k.. are rescaled to
        # this run's training time.
        base = STAGES[a.start_stage - 1].until
        if base < 1.0:
            STAGES = [dataclasses.replace(st, until=max(0.0, (st.until - base) / (1 - base)))
                      for st in STAGES]
    COPIES, LM_WEIGHT = a.copies, a.lm_weight
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    model = model_factory(a, dev)
    if a.init:
        log(f"initialized from {a.init}")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters ({n_params * 2 / 1e6:.2f} MB in bf16)")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))
    # A call continuing another on the same machine picks up its float32 weights and AdamW
    # moments (--resume-state), so two calls train as one run; without the state file it
    # continues the bf16 checkpoint (--init) with fresh moments and a warm-up.
    resumed = bool(a.resume_state) and os.path.exists(a.resume_state)
    warmup = a.warmup
    if resumed:
        state = torch.load(a.resume_state, map_location=dev, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        warmup = 0
        log(f"resumed float32 weights and optimizer state from {a.resume_state} "
            f"(after {state['step']} steps)")
    elif a.resume_state:
        log(f"no state at {a.resume_state}: fresh optimizer moments")

    init_generator(a.tokenizer, a.essays)
    ctx = mp.get_context("fork")
    pool = ctx.Pool(a.workers)
    stage_steps = [int(x) for x in a.stage_steps.split(",")] if a.stage_steps else None
    tracker = AccuracyTracker(a.gate_window)

    t0 = time.time()
    pending = {}
    next_submit = 0
    stage_log = []
    step = 0
    last_save = t0
    cur_stage = a.start_stage
    stage_begin = 0
    stage_t0 = 0.0
    loss_ema = None
    # Spike skipping (--skip-spikes f): a step whose gradient norm is more than f times the
    # running geometric mean gets no gradient (the optimizer's momentum still moves). Kept on
    # the GPU: no host sync per step. Run 6b's divergence began with norms of 400-77,000 where
    # the median was 5-10.
    log_gn_ref = None  # running mean of log(grad norm), a 0-dim device tensor
    skipped = None     # steps skipped so far, a 0-dim device tensor
    stopped_before = None  # the stage a --stop-after-stage run ended before
    # SDPA kernels (bench_attention.py, H200, torch 2.11): cuDNN's takes 55 / 82 ms per 65,536-
    # token step at 16K / 32K tokens where flash takes 72 / 112; never the math fallback (it
    # materializes L x L scores). Dropped if this torch refuses the restriction.
    restrict_sdpa = cuda
    if cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        sdpa_order = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
        if a.attn == "cudnn":
            sdpa_order.insert(0, SDPBackend.CUDNN_ATTENTION)
        # The list is an order of preference where this torch can say so (>= 2.6).
        sdpa_kwargs = ({"set_priority": True}
                       if "set_priority" in inspect.signature(sdpa_kernel).parameters else {})

    def submit(i: int, st: int):
        pending[i] = pool.apply_async(build_batch, ((i, st, a.seed, a.tokens_per_step,
                                                     a.force_length, STAGES, COPIES, LM_WEIGHT),))

    tracker_at_end = {}

    def wanted_stage(frac: float) -> int:
        nonlocal tracker_at_end
        if stage_steps:
            return sum(1 for s in stage_steps if step >= s)
        st = cur_stage
        tracker_at_end = tracker.summary()
        # The stage's own time limit passed, or its gate after a minimum number of steps; then
        # any stage whose share of the training time is already over is skipped.
        last = len(STAGES) - 1
        in_stage = frac * a.train_seconds - stage_t0
        if st < last and ((STAGES[st].seconds and in_stage >= STAGES[st].seconds) or (
                step - stage_begin >= a.min_stage_steps and tracker.passes(STAGES[st].gate))):
            st += 1
        while st < last and frac >= STAGES[st].until:
            st += 1
        if st != cur_stage:
            tracker.reset()
        return st

    if cuda:
        log(f"SDPA: {a.attn} first" + (" (cuDNN " + str(torch.backends.cudnn.version()) + ")"
                                       if a.attn == "cudnn" else ""))
    stage_log.append({"stage": cur_stage, "step": 0, "time_s": 0.0})
    log(f"stage {cur_stage} from step 0 (0s)")
    while True:
        elapsed = time.time() - t0
        frac = elapsed / a.train_seconds
        if (a.max_steps and step >= a.max_steps) or (not a.max_steps and frac >= 1.0):
            break
        st = wanted_stage(frac)
        if st != cur_stage:
            if a.stage_checkpoints:  # the model as the finished stage left it
                save_model(model, os.path.join(a.stage_checkpoints, f"stage{cur_stage}"),
                           a.tokenizer_dir)
                log(f"stage {cur_stage} checkpoint: train acc {json.dumps(tracker_at_end)}")
            if 0 <= a.stop_after_stage < st:
                stopped_before = st
                log(f"stage {cur_stage} ended: stopping before stage {st} (--stop-after-stage); "
                    f"train acc {json.dumps(tracker_at_end)}")
                break
            # Batches built ahead for the old stage are dropped: rebuild for the new one.
            for i in list(pending):
                pending.pop(i)
            next_submit = step
            cur_stage, stage_begin, stage_t0 = st, step, elapsed
            stage_log.append({"stage": st, "step": step, "time_s": round(elapsed, 1)})
            log(f"stage {st} from step {step} ({elapsed:.0f}s)")
        while next_submit < step + a.prefetch:
            submit(next_submit, cur_stage)
            next_submit += 1
        index, bst, L, ids_np, w_np, tasks_np = pending.pop(step).get()
        ids = torch.from_numpy(ids_np).to(dev, non_blocking=True).long()
        w = torch.from_numpy(w_np).to(dev, non_blocking=True)
        for g in opt.param_groups:
            # A resumed run begins with a stage change: the same ramp as inside one run.
            g["lr"] = lr_at(frac, step, STAGES[cur_stage].lr or a.lr, warmup, a.decay_start,
                            step - stage_begin if stage_begin or resumed else None,
                            a.stage_ramp)
        try:
            with contextlib.ExitStack() as stack:
                if cuda:
                    stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
                    if restrict_sdpa:
                        stack.enter_context(sdpa_kernel(sdpa_order, **sdpa_kwargs))
                h = model.model(input_ids=ids, use_cache=False).last_hidden_state  # [B, L, H]
                sel = w[:, :-1] > 0  # [B, L-1]
                hs = h[:, :-1][sel]  # [N, H]
                logits = model.lm_head(hs).float()  # [N, vocab]
        except RuntimeError as e:
            if not restrict_sdpa:
                raise
            log(f"WARNING: flash/efficient SDPA refused ({e}); allowing all SDPA backends")
            restrict_sdpa = False
            submit(step, bst)
            continue
        tgt = ids[:, 1:][sel]
        wt = w[:, :-1][sel]
        ce = F.cross_entropy(logits, tgt, reduction="none")
        loss = (ce * wt).sum() / wt.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if a.skip_spikes > 0:
            lg = torch.log(gn.float().clamp_min(1e-6))
            if log_gn_ref is None:
                log_gn_ref, skipped = lg.clone(), torch.zeros((), device=dev)
            limit = log_gn_ref + math.log(a.skip_spikes)
            spike = (lg > limit) & (step >= a.warmup)  # the reference needs a few steps
            torch._foreach_mul_([p.grad for p in model.parameters() if p.grad is not None],
                                (~spike).float())
            skipped += spike.float()
            # A sustained rise (a longer stage) is followed within ~50 steps: spikes enter the
            # mean capped at the limit.
            log_gn_ref.mul_(0.98).add_(0.02 * torch.minimum(lg, limit))
        opt.step()
        if step % a.acc_every == 0 or step % a.log_every == 0:
            with torch.no_grad():
                # A sequence is right when every answer token (and EOS) is the argmax.
                wrong = ((logits.argmax(-1) != tgt) & (wt == 1.0)).float()
                row = torch.nonzero(sel)[:, 0]
                bad = torch.zeros(ids.shape[0], device=dev).index_add_(0, row, wrong)
                tracker.add((bad == 0).tolist(), tasks_np.tolist())
        if step % a.log_every == 0 or step < 3:
            lv = loss.item()
            loss_ema = lv if loss_ema is None else 0.9 * loss_ema + 0.1 * lv
            log(f"step {step} t={elapsed:.0f}s st={cur_stage} L={L} B={ids.shape[0]} "
                f"loss={lv:.4f} ema={loss_ema:.4f} gnorm={gn.item():.2f} "
                f"lr={opt.param_groups[0]['lr']:.2e} acc={json.dumps(tracker.summary())}"
                + (f" skipped={int(skipped.item())}" if skipped is not None else ""))
        step += 1
        if a.out and time.time() - last_save > a.save_every:
            save_model(model, a.out, a.tokenizer_dir, a.copy_to)
            last_save = time.time()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.time() - t0
    pool.terminate()
    if a.out:
        save_model(model, a.out, a.tokenizer_dir, a.copy_to)
    if a.save_state:
        os.makedirs(os.path.dirname(os.path.abspath(a.save_state)), exist_ok=True)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                   a.save_state + ".tmp")
        os.replace(a.save_state + ".tmp", a.save_state)
    # (a stopped run's tracker was reset for the stage it did not begin)
    final_acc = tracker_at_end if stopped_before is not None else tracker.summary()
    log(f"trained {step} steps in {elapsed:.0f}s; last stage {cur_stage}, "
        f"acc={json.dumps(final_acc)}")
    n_skipped = int(skipped.item()) if skipped is not None else 0
    if a.skip_spikes > 0:
        log(f"spike steps skipped: {n_skipped}")
    # next_stage: where a continuing call begins (--start-stage).
    return {"steps": step, "seconds": round(elapsed, 1), "stages": stage_log,
            "last_stage": cur_stage, "skipped_steps": n_skipped,
            "next_stage": stopped_before if stopped_before is not None else cur_stage,
            "params": n_params, "final_train_acc": final_acc, "model": model}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokenizer-dir", default=os.path.join(HERE, "../../models/needle"))
    ap.add_argument("--essays", default=os.path.join(HERE, "../../../shared/data/PaulGrahamEssays.json"))
    ap.add_argument("--out", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-seconds", type=float, default=390)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (tests)")
    ap.add_argument("--force-length", default="", help="comma list of lengths, cycled (tests)")
    ap.add_argument("--init", default="", help="continue from this checkpoint folder")
    ap.add_argument("--stages", choices=list(STAGES_SETS), default="gated")
    ap.add_argument("--lm-weight", type=float, default=0.0,
                    help="next-token loss weight on the non-answer tokens")
    ap.add_argument("--min-stage-steps", type=int, default=100,
                    help="steps in a stage before its accuracy gate may end it")
    ap.add_argument("--gate-window", type=int, default=400,
                    help="samples per task in the running training accuracy")
    ap.add_argument("--acc-every", type=int, default=5, help="steps between accuracy updates")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--attn", choices=("cudnn", "flash"), default="cudnn",
                    help="preferred SDPA kernel on CUDA (flash and mem-efficient follow)")
    ap.add_argument("--start-stage", type=int, default=0, help="begin at this stage")
    ap.add_argument("--stop-after-stage", type=int, default=-1,
                    help="end the run when this stage ends (a call that another continues)")
    ap.add_argument("--save-state", default="",
                    help="at the end, save float32 weights + optimizer state here (torch.save)")
    ap.add_argument("--resume-state", default="",
                    help="continue from this --save-state file if it exists (with --init)")
    ap.add_argument("--skip-spikes", type=float, default=0,
                    help="drop the gradient of a step whose norm exceeds this many times the "
                         "running geometric mean (0: off)")
    ap.add_argument("--summary-out", default="", help="write the training summary (JSON) here")
    ap.add_argument("--stage-checkpoints", default="",
                    help="save the model here (stageK/) each time stage K ends")
    ap.add_argument("--copies", type=int, default=0,
                    help="up to this many repeated haystack spans per sample (copy targets)")
    ap.add_argument("--copy-to", default="", help="also copy the model files here at each save")
    ap.add_argument("--stage-steps", default="", help="replay: first step of stages 1..4")
    ap.add_argument("--tokens-per-step", type=int, default=65536)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--decay-start", type=float, default=0.7,
                    help="cosine decay from this fraction of the training time (>= 1: none)")
    ap.add_argument("--stage-ramp", type=int, default=40,
                    help="steps over which the rate ramps from 0.3x after a stage change")
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--prefetch", type=int, default=24)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--save-every", type=float, default=60)
    return ap


def main() -> None:
    a = parser().parse_args()
    finish_args(a)
    info = train(a)
    info.pop("model")
    if a.summary_out:
        with open(a.summary_out, "w") as f:
            json.dump(info, f, indent=1)


def finish_args(a) -> None:
    a.tokenizer = os.path.join(a.tokenizer_dir, "tokenizer.json")
    a.force_length = [int(x) for x in a.force_length.split(",")] if a.force_length else []


if __name__ == "__main__":
    main()
