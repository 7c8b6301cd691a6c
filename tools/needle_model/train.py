"""Trains the needle model (LlamaForCausalLM, 4.7M parameters for v1, 6.8M for v2) on RULER-style
retrieval tasks with a context-length curriculum. Runs on one GPU with PyTorch + transformers
(the loop also runs on the CPU, for small dry runs; `smoke_cpu.py` runs it without
transformers).

Data: every step holds `tokens_per_step` tokens: B = tokens_per_step // L sequences of length L
(right-padded; causal attention makes padding at the end harmless, so no mask is needed and SDPA
runs its flash kernel). L is drawn from the current curriculum stage. The loss is cross-entropy
on the answer tokens and EOS (weight 1), on the answer prefix (weight 0.25, it copies the query
key from the question) and, with `--lm-weight w`, on every other token of the sample (weight w:
plain next-token prediction over haystack, needles and question, which gives every position a
gradient while the sparse answer loss alone sits on a long plateau).

Curriculum (`--stages gated`, v1; `--stages v2`): stages of growing length, from 128-256 tokens
(where a needle is a large part of the context and the find-and-copy circuit forms quickly) to
32K-128K. A stage ends when the running sequence accuracy of the training batches (fresh
samples, so it measures generalization) passes its gate, or when its time is spent, whichever
comes first. The step at which each stage began is logged; `--stage-steps` replays a schedule.
What varies between samples (tasks, haystacks, value and key kinds, needle counts) is the
stage's `SampleMix`.

Batch i is a pure function of (seed, i, stage): worker processes build batches ahead of the GPU.
Everything a run needs is in its `TrainConfig`; the workers get theirs (a `BatchBuilder`) once,
when the pool starts.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import inspect
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bpe import ByteLevelBPE  # noqa: E402
from curriculum import STAGES_SETS, TAGS, TASK_INDEX, SampleMix  # noqa: E402,F401
from needle_data import Generator  # noqa: E402

BOS, EOS, PAD = 2045, 2046, 2047
PREFIX_WEIGHT = 0.25
AUX_WEIGHT = 1.0
MODEL_FILES = ("model.safetensors", "config.json", "generation_config.json")  # save_pretrained's


# ---- the model ----
@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    rope_theta: float
    head_dim: int = 64
    max_positions: int = 131072


MODEL_SHAPES = {
    # models/needle v1 (runs 1-7): 4,656,384 parameters.
    "v1": ModelShape(hidden=256, layers=6, heads=4, kv_heads=2, intermediate=640,
                     rope_theta=1e7),
    # v2: two more layers for the composed circuits of multi-key / multi-value / multi-query
    # (match the key, then find the next needle or the next query key, then copy), the same
    # width and heads (attention, most of a 32K-128K step, grows by 8/6 only), a wider MLP;
    # 6,820,096 parameters, 13.6 MB of bf16: one safetensors file under the 16 MiB a GPU call
    # can return. RoPE base 1e8 for 128K (tools/needle_model/README.md, "v2 plan").
    "v2": ModelShape(hidden=256, layers=8, heads=4, kv_heads=2, intermediate=768,
                     rope_theta=1e8),
}


def shape_name(config) -> str:
    """The MODEL_SHAPES name of a transformers config (a continued run trains the shape of the
    model it continues, whatever --model-shape says), or "custom"."""
    rope = getattr(config, "rope_parameters", None) or {}
    have = tuple(getattr(config, k, None) for k in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "intermediate_size")) + (rope.get("rope_theta"),)
    for name, s in MODEL_SHAPES.items():
        if have == (s.hidden, s.layers, s.heads, s.kv_heads, s.intermediate, s.rope_theta):
            return name
    return "custom"


def model_config(shape: ModelShape = MODEL_SHAPES["v1"]):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=2048, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, hidden_act="silu",
        max_position_embeddings=shape.max_positions, rms_norm_eps=1e-5, initializer_range=0.02,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        attention_bias=False, mlp_bias=False, tie_word_embeddings=True, bos_token_id=BOS,
        eos_token_id=EOS, pad_token_id=PAD)


# ---- the run's configuration ----
@dataclass
class TrainConfig:
    """Everything a training run reads (the CLI's options; `parser()` documents them)."""
    tokenizer_dir: str = os.path.join(HERE, "../../models/needle")
    essays: str = os.path.join(HERE, "../../../shared/data/PaulGrahamEssays.json")
    out: str = ""
    seed: int = 0
    train_seconds: float = 390
    max_steps: int = 0
    force_length: tuple = ()
    init: str = ""
    stages: str = "gated"
    model_shape: str = "v1"
    lm_weight: float = 0.0
    min_stage_steps: int = 100
    gate_window: int = 400
    acc_every: int = 5
    device: str = "cuda"
    attn: str = "cudnn"
    start_stage: int = 0
    stop_after_stage: int = -1
    save_state: str = ""
    resume_state: str = ""
    skip_spikes: float = 0
    summary_out: str = ""
    stage_checkpoints: str = ""
    copies: int = 0
    copy_to: str = ""
    stage_steps: str = ""
    tokens_per_step: int = 65536
    lr: float = 2e-3
    warmup: int = 50
    decay_start: float = 0.7
    stage_ramp: int = 40
    weight_decay: float = 0.05
    workers: int = 12
    prefetch: int = 24
    log_every: int = 25
    save_every: float = 60

    @property
    def tokenizer(self) -> str:
        return os.path.join(self.tokenizer_dir, "tokenizer.json")

    def stage_list(self) -> tuple:
        """The stages of this run. Continuing a run that reached stage k (--start-stage), the
        time caps (`until`) of stages k.. are rescaled to this run's training time."""
        stages = STAGES_SETS[self.stages]
        if self.start_stage:
            base = stages[self.start_stage - 1].until
            if base < 1.0:
                stages = [dataclasses.replace(st, until=max(0.0, (st.until - base) / (1 - base)))
                          for st in stages]
        return tuple(stages)


@dataclass(frozen=True)
class DataConfig:
    """What a batch is a function of, besides (index, stage)."""
    stages: tuple
    seed: int
    tokens_per_step: int
    copies: int = 0         # max repeated haystack spans per sample
    lm_weight: float = 0.0  # weight of next-token loss on the other tokens
    force_length: tuple = ()  # lengths cycled instead of the stage's draw (throughput checks)


def pick(rng: random.Random, choices: dict):
    """One key of {key: probability}; a single key takes nothing from the rng."""
    if len(choices) == 1:
        return next(iter(choices))
    return rng.choices(list(choices), weights=list(choices.values()))[0]


def random_sample(gen: Generator, rng: random.Random, length: int, tasks: dict,
                  mix: SampleMix, copies: int = 0):
    """(task, sample, tags) drawn from the stage's tasks and mix."""
    task = rng.choices(list(tasks), weights=list(tasks.values()))[0]
    if task == "vt":
        kw = dict(haystack=pick(rng, mix.vt_haystacks), num_chains=rng.randint(*mix.chains),
                  num_hops=rng.randint(*mix.hops))
    else:
        kw = dict(haystack=pick(rng, mix.haystacks),
                  num_distractors=rng.randint(*mix.distractors),
                  num_values=rng.randint(*mix.values), num_queries=rng.randint(*mix.queries),
                  value_kind=pick(rng, mix.value_kinds), key_kind=pick(rng, mix.key_kinds),
                  key_words=pick(rng, mix.key_words))
    if copies:
        kw["copies"] = rng.randint(0, copies)
    # Too short for this draw (e.g. 6 distractors or UUID keys in 128 tokens): the same task
    # with number values and word keys, then (shrink_to_fit) with the fewest needles, then a
    # single needle.
    attempts = [(task, kw)]
    if kw.get("value_kind", "number") != "number" or kw.get("key_kind", "word") != "word":
        attempts.append((task, {**kw, "value_kind": "number", "key_kind": "word"}))
    if mix.shrink_to_fit:
        fewest = (dict(num_chains=1, num_hops=1) if task == "vt" else
                  dict(num_distractors=1, num_values=2, num_queries=2, value_kind="number",
                       key_kind="word"))
        attempts.append((task, {**kw, **fewest}))
    attempts.append(("niah_single", dict(haystack=kw["haystack"])))
    for i, (t, k) in enumerate(attempts):
        try:
            s = gen.make_sample(rng, t, length, **k)
            break
        except ValueError:
            if i == len(attempts) - 1:
                raise
    m = s.meta
    tags = [tag for tag, on in (("word", m.get("value_kind") == "word"),
                                ("uuid", m.get("value_kind") == "uuid"),
                                ("uuid_key", m.get("key_kind") == "uuid"),
                                ("needle_hay", m.get("haystack") == "needle")) if on]
    return t, s, tags


def copy_arrays(rng: random.Random, length: int, digit_ids: list):
    """The induction warm-up task: random tokens (a third of them digits) in which 2-6 spans of
    6-24 tokens reappear later; the loss is on predicting each copy from its first token on.
    Digit-heavy spans need more than the previous token to continue (digits repeat), as a
    7-digit needle value does."""
    ids = np.full(length, PAD, dtype=np.int32)
    w = np.zeros(length, dtype=np.float32)
    n = length - 1  # BOS first
    body = [rng.choice(digit_ids) if rng.random() < 0.33 else rng.randrange(256, BOS)
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


def sample_arrays(s, length: int, lm_weight: float = 0.0):
    """ids [length] and weights [length] (weight[t] applies to predicting ids[t + 1])."""
    seq = [BOS] + s.ids + s.answer_ids + [EOS]
    ids = np.full(length, PAD, dtype=np.int32)
    ids[:len(seq)] = seq
    w = np.zeros(length, dtype=np.float32)
    p0 = 1 + len(s.ids)  # index of the first answer token in seq
    w[:p0 - 1] = lm_weight
    w[p0 - 1 - s.n_prefix:p0 - 1] = PREFIX_WEIGHT
    w[p0 - 1:len(seq) - 1] = 1.0
    for k in s.aux_pos:  # ids[k] is seq[k + 1], predicted at position k
        w[k] = AUX_WEIGHT
    return ids, w


class BatchBuilder:
    """Builds batch `index` of `stage` (in the worker processes): the generator and the data
    configuration it needs."""

    def __init__(self, tokenizer_path: str, essays_path: str, data: DataConfig):
        self.gen = Generator(ByteLevelBPE.from_file(tokenizer_path), essays_path)
        self.digit_ids = [self.gen.enc(str(d))[0] for d in range(10)]
        self.data = data

    def build(self, index: int, stage: int):
        """-> (index, stage, L, ids [B, L], weights [B, L], tasks [B], tags [B] lists)."""
        d = self.data
        st = d.stages[stage]
        rng = random.Random(f"train/{d.seed}/{index}")
        L = rng.choices(list(st.lengths), weights=list(st.lengths.values()))[0]
        if d.force_length:
            L = d.force_length[index % len(d.force_length)]
        B = max(1, (st.tokens or d.tokens_per_step) // L)
        ids = np.empty((B, L), dtype=np.int32)
        w = np.empty((B, L), dtype=np.float32)
        tasks = np.empty(B, dtype=np.int64)
        tags = []
        niah = {t: p for t, p in st.tasks.items() if t != "copy"}
        for b in range(B):
            task = "copy" if rng.random() < st.tasks.get("copy", 0) else ""
            if task:
                ids[b], w[b] = copy_arrays(rng, L, self.digit_ids)
                tags.append([])
            else:
                task, s, t = random_sample(self.gen, rng, L, niah, st.mix, d.copies)
                ids[b], w[b] = sample_arrays(s, L, d.lm_weight)
                tags.append(t)
            tasks[b] = TASK_INDEX[task]
        return index, stage, L, ids, w, tasks, tags


# The worker process's builder, set once by the pool's initializer (the main process never
# reads it); with the fork start method the builder is inherited, not pickled.
_WORKER_BUILDER: BatchBuilder | None = None


def _init_worker(builder: BatchBuilder) -> None:
    global _WORKER_BUILDER
    _WORKER_BUILDER = builder


def _build_in_worker(index: int, stage: int):
    return _WORKER_BUILDER.build(index, stage)


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


def build_model(c: TrainConfig, dev):
    """transformers' LlamaForCausalLM (fp32 master weights), new or from `c.init`."""
    import torch
    from transformers import LlamaForCausalLM
    if c.init:
        return LlamaForCausalLM.from_pretrained(c.init, attn_implementation="sdpa",
                                                dtype=torch.float32).to(dev)
    return LlamaForCausalLM._from_config(model_config(MODEL_SHAPES[c.model_shape]),
                                         attn_implementation="sdpa",
                                         dtype=torch.float32).to(dev)


class AccuracyTracker:
    """Running per-task (and per-tag) sequence accuracy of the training batches since the
    stage began."""

    def __init__(self, window: int = 400):
        self.window = window
        self.reset()

    def reset(self):
        self.hist = {t: [] for t in list(TASK_INDEX) + list(TAGS)}

    def _push(self, name: str, ok: bool):
        h = self.hist[name]
        h.append(ok)
        if len(h) > self.window:
            del h[0]

    def add(self, rows_ok, tasks, tags=None):
        names = list(TASK_INDEX)
        for i, (ok, ti) in enumerate(zip(rows_ok, tasks)):
            self._push(names[ti], bool(ok))
            for tag in (tags[i] if tags else ()):
                self._push(tag, bool(ok))

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
        return {t: round(self.acc(t)[0], 3) for t in self.hist if self.hist[t]}


def train(c: TrainConfig, log=print, model_factory=build_model) -> dict:
    import torch
    import torch.nn.functional as F

    stages = c.stage_list()
    data = DataConfig(stages=stages, seed=c.seed, tokens_per_step=c.tokens_per_step,
                      copies=c.copies, lm_weight=c.lm_weight,
                      force_length=tuple(c.force_length))
    torch.manual_seed(c.seed)
    dev = torch.device(c.device)
    cuda = dev.type == "cuda"
    model = model_factory(c, dev)
    if c.init:
        log(f"initialized from {c.init}")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters ({n_params * 2 / 1e6:.2f} MB in bf16)")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=c.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))
    # A call continuing another on the same machine picks up its float32 weights and AdamW
    # moments (--resume-state), so two calls train as one run; without the state file it
    # continues the bf16 checkpoint (--init) with fresh moments and a warm-up.
    resumed = bool(c.resume_state) and os.path.exists(c.resume_state)
    warmup = c.warmup
    if resumed:
        state = torch.load(c.resume_state, map_location=dev, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        warmup = 0
        log(f"resumed float32 weights and optimizer state from {c.resume_state} "
            f"(after {state['step']} steps)")
    elif c.resume_state:
        log(f"no state at {c.resume_state}: fresh optimizer moments")

    builder = BatchBuilder(c.tokenizer, c.essays, data)
    pool = mp.get_context("fork").Pool(c.workers, initializer=_init_worker, initargs=(builder,))
    stage_steps = [int(x) for x in c.stage_steps.split(",")] if c.stage_steps else None
    tracker = AccuracyTracker(c.gate_window)

    t0 = time.time()
    pending = {}
    next_submit = 0
    stage_log = []
    step = 0
    last_save = t0
    cur_stage = c.start_stage
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
        if c.attn == "cudnn":
            sdpa_order.insert(0, SDPBackend.CUDNN_ATTENTION)
        # The list is an order of preference where this torch can say so (>= 2.6).
        sdpa_kwargs = ({"set_priority": True}
                       if "set_priority" in inspect.signature(sdpa_kernel).parameters else {})

    def submit(i: int, st: int):
        pending[i] = pool.apply_async(_build_in_worker, (i, st))

    tracker_at_end = {}

    def wanted_stage(frac: float) -> int:
        nonlocal tracker_at_end
        if stage_steps:
            return sum(1 for s in stage_steps if step >= s)
        st = cur_stage
        tracker_at_end = tracker.summary()
        # The stage's own time limit passed, or its gate after a minimum number of steps; then
        # any stage whose share of the training time is already over is skipped.
        last = len(stages) - 1
        in_stage = frac * c.train_seconds - stage_t0
        if st < last and ((stages[st].seconds and in_stage >= stages[st].seconds) or (
                step - stage_begin >= c.min_stage_steps and tracker.passes(stages[st].gate))):
            st += 1
        while st < last and frac >= stages[st].until:
            st += 1
        if st != cur_stage:
            tracker.reset()
        return st

    if cuda:
        log(f"SDPA: {c.attn} first" + (" (cuDNN " + str(torch.backends.cudnn.version()) + ")"
                                       if c.attn == "cudnn" else ""))
    stage_log.append({"stage": cur_stage, "step": 0, "time_s": 0.0})
    log(f"stage {cur_stage} from step 0 (0s)")
    while True:
        elapsed = time.time() - t0
        frac = elapsed / c.train_seconds
        if (c.max_steps and step >= c.max_steps) or (not c.max_steps and frac >= 1.0):
            break
        st = wanted_stage(frac)
        if st != cur_stage:
            if c.stage_checkpoints:  # the model as the finished stage left it
                save_model(model, os.path.join(c.stage_checkpoints, f"stage{cur_stage}"),
                           c.tokenizer_dir)
                log(f"stage {cur_stage} checkpoint: train acc {json.dumps(tracker_at_end)}")
            if 0 <= c.stop_after_stage < st:
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
        while next_submit < step + c.prefetch:
            submit(next_submit, cur_stage)
            next_submit += 1
        index, bst, L, ids_np, w_np, tasks_np, tags = pending.pop(step).get()
        ids = torch.from_numpy(ids_np).to(dev, non_blocking=True).long()
        w = torch.from_numpy(w_np).to(dev, non_blocking=True)
        for g in opt.param_groups:
            # A resumed run begins with a stage change: the same ramp as inside one run.
            g["lr"] = lr_at(frac, step, stages[cur_stage].lr or c.lr, warmup, c.decay_start,
                            step - stage_begin if stage_begin or resumed else None,
                            c.stage_ramp)
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
        if c.skip_spikes > 0:
            lg = torch.log(gn.float().clamp_min(1e-6))
            if log_gn_ref is None:
                log_gn_ref, skipped = lg.clone(), torch.zeros((), device=dev)
            limit = log_gn_ref + math.log(c.skip_spikes)
            spike = (lg > limit) & (step >= c.warmup)  # the reference needs a few steps
            torch._foreach_mul_([p.grad for p in model.parameters() if p.grad is not None],
                                (~spike).float())
            skipped += spike.float()
            # A sustained rise (a longer stage) is followed within ~50 steps: spikes enter the
            # mean capped at the limit.
            log_gn_ref.mul_(0.98).add_(0.02 * torch.minimum(lg, limit))
        opt.step()
        # Every step from 16K tokens on (a few sequences per step, each step 60+ ms: the
        # gates need their samples, and the host sync costs little there).
        if step % c.acc_every == 0 or step % c.log_every == 0 or L >= 16384:
            with torch.no_grad():
                # A sequence is right when every answer token (and EOS) is the argmax.
                wrong = ((logits.argmax(-1) != tgt) & (wt == 1.0)).float()
                row = torch.nonzero(sel)[:, 0]
                bad = torch.zeros(ids.shape[0], device=dev).index_add_(0, row, wrong)
                tracker.add((bad == 0).tolist(), tasks_np.tolist(), tags)
        if step % c.log_every == 0 or step < 3:
            lv = loss.item()
            loss_ema = lv if loss_ema is None else 0.9 * loss_ema + 0.1 * lv
            log(f"step {step} t={elapsed:.0f}s st={cur_stage} L={L} B={ids.shape[0]} "
                f"loss={lv:.4f} ema={loss_ema:.4f} gnorm={gn.item():.2f} "
                f"lr={opt.param_groups[0]['lr']:.2e} acc={json.dumps(tracker.summary())}"
                + (f" skipped={int(skipped.item())}" if skipped is not None else ""))
        step += 1
        if c.out and time.time() - last_save > c.save_every:
            save_model(model, c.out, c.tokenizer_dir, c.copy_to)
            last_save = time.time()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.time() - t0
    pool.terminate()
    if c.out:
        save_model(model, c.out, c.tokenizer_dir, c.copy_to)
    if c.save_state:
        os.makedirs(os.path.dirname(os.path.abspath(c.save_state)), exist_ok=True)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                   c.save_state + ".tmp")
        os.replace(c.save_state + ".tmp", c.save_state)
    # (a stopped run's tracker was reset for the stage it did not begin)
    final_acc = tracker_at_end if stopped_before is not None else tracker.summary()
    log(f"trained {step} steps in {elapsed:.0f}s; last stage {cur_stage}, "
        f"acc={json.dumps(final_acc)}")
    n_skipped = int(skipped.item()) if skipped is not None else 0
    if c.skip_spikes > 0:
        log(f"spike steps skipped: {n_skipped}")
    # next_stage: where a continuing call begins (--start-stage).
    return {"steps": step, "seconds": round(elapsed, 1), "stages": stage_log,
            "last_stage": cur_stage, "skipped_steps": n_skipped,
            "next_stage": stopped_before if stopped_before is not None else cur_stage,
            "params": n_params, "model_shape": shape_name(model.config), "stages_set": c.stages,
            "final_train_acc": final_acc, "model": model}


def parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokenizer-dir", default=d.tokenizer_dir)
    ap.add_argument("--essays", default=d.essays)
    ap.add_argument("--out", default="")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--train-seconds", type=float, default=d.train_seconds)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (tests)")
    ap.add_argument("--force-length", default="", help="comma list of lengths, cycled (tests)")
    ap.add_argument("--init", default="", help="continue from this checkpoint folder")
    ap.add_argument("--stages", choices=list(STAGES_SETS), default=d.stages)
    ap.add_argument("--model-shape", choices=list(MODEL_SHAPES), default=d.model_shape,
                    help="the new model's shape (not with --init)")
    ap.add_argument("--lm-weight", type=float, default=d.lm_weight,
                    help="next-token loss weight on the non-answer tokens")
    ap.add_argument("--min-stage-steps", type=int, default=d.min_stage_steps,
                    help="steps in a stage before its accuracy gate may end it")
    ap.add_argument("--gate-window", type=int, default=d.gate_window,
                    help="samples per task in the running training accuracy")
    ap.add_argument("--acc-every", type=int, default=d.acc_every,
                    help="steps between accuracy updates (below 16K tokens)")
    ap.add_argument("--device", default=d.device)
    ap.add_argument("--attn", choices=("cudnn", "flash"), default=d.attn,
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
    ap.add_argument("--tokens-per-step", type=int, default=d.tokens_per_step)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--warmup", type=int, default=d.warmup)
    ap.add_argument("--decay-start", type=float, default=d.decay_start,
                    help="cosine decay from this fraction of the training time (>= 1: none)")
    ap.add_argument("--stage-ramp", type=int, default=d.stage_ramp,
                    help="steps over which the rate ramps from 0.3x after a stage change")
    ap.add_argument("--weight-decay", type=float, default=d.weight_decay)
    ap.add_argument("--workers", type=int, default=d.workers)
    ap.add_argument("--prefetch", type=int, default=d.prefetch)
    ap.add_argument("--log-every", type=int, default=d.log_every)
    ap.add_argument("--save-every", type=float, default=d.save_every)
    return ap


def config_from_args(argv=None) -> TrainConfig:
    """A TrainConfig from command-line arguments (train.py's, or gpu_run.py's forwarded)."""
    ns = vars(parser().parse_args(argv))
    ns["force_length"] = tuple(int(x) for x in ns["force_length"].split(",")
                               if x) if ns["force_length"] else ()
    return TrainConfig(**ns)


def main() -> None:
    c = config_from_args()
    info = train(c)
    info.pop("model")
    if c.summary_out:
        with open(c.summary_out, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
