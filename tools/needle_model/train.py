"""Trains the needle model (LlamaForCausalLM, ~4.7M parameters) on RULER-style retrieval tasks
with a context-length curriculum. Runs on one GPU with PyTorch + transformers.

Data: every step holds `tokens_per_step` tokens: B = tokens_per_step // L sequences of length L
(right-padded; causal attention makes padding at the end harmless, so no mask is needed and SDPA
runs its flash kernel). L is drawn from the current curriculum stage. The loss is cross-entropy
on the answer tokens and EOS (weight 1) and on the answer prefix (weight 0.25, it copies the
query key from the question); the haystack is not trained on.

Batch i is a pure function of (seed, i, stage): worker processes build batches ahead of the GPU.
Stages advance by wall-clock fraction of the training time (the step at which each stage began
is logged; `--stage-steps` replays a logged schedule exactly).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bpe import ByteLevelBPE  # noqa: E402
from needle_data import Generator  # noqa: E402

BOS, EOS, PAD = 2045, 2046, 2047
PREFIX_WEIGHT = 0.25
AUX_WEIGHT = 1.0
COPIES = 0  # max repeated haystack spans per sample (set by --copies)

# (end as a fraction of the training time, {length: probability})
STAGES_DEFAULT = [
    (0.15, {512: 0.5, 1024: 0.5}),
    (0.35, {1024: 0.3, 2048: 0.4, 4096: 0.3}),
    (0.55, {2048: 0.2, 4096: 0.4, 8192: 0.4}),
    (0.75, {4096: 0.2, 8192: 0.3, 16384: 0.5}),
    (1.00, {4096: 0.15, 16384: 0.25, 32768: 0.4, 65536: 0.2}),
]

# For a short continuation run.
STAGES_FAST = [
    (0.35, {512: 0.5, 1024: 0.5}),
    (0.55, {1024: 0.3, 2048: 0.4, 4096: 0.3}),
    (0.75, {2048: 0.2, 4096: 0.3, 8192: 0.3, 16384: 0.2}),
    (1.00, {4096: 0.2, 16384: 0.3, 32768: 0.5}),
]
STAGES = STAGES_DEFAULT

TASK_WEIGHTS = {"niah_single": 0.2, "niah_multikey": 0.25, "niah_multivalue": 0.15,
                "niah_multiquery": 0.15, "vt": 0.25}
TASK_INDEX = {t: i for i, t in enumerate(TASK_WEIGHTS)}


def model_config():
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=2048, hidden_size=256, intermediate_size=640, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, hidden_act="silu",
        max_position_embeddings=131072, rms_norm_eps=1e-5, initializer_range=0.02,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7}, attention_bias=False,
        mlp_bias=False, tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS,
        pad_token_id=PAD)


def random_sample(gen: Generator, rng: random.Random, length: int):
    task = rng.choices(list(TASK_WEIGHTS), weights=list(TASK_WEIGHTS.values()))[0]
    if task == "vt":
        kw = dict(haystack="noise" if rng.random() < 0.7 else "essay",
                  num_chains=rng.randint(1, 2), num_hops=rng.randint(1, 4))
    else:
        kw = dict(haystack="essay" if rng.random() < 0.8 else "noise",
                  num_distractors=rng.randint(1, 6), num_values=rng.randint(2, 4),
                  num_queries=rng.randint(2, 4))
    if COPIES:
        kw["copies"] = rng.randint(0, COPIES)
    return task, gen.make_sample(rng, task, length, **kw)


def sample_arrays(s, prefix_len: int, length: int):
    """ids [length] and weights [length] (weight[t] applies to predicting ids[t + 1])."""
    seq = [BOS] + s.ids + s.answer_ids + [EOS]
    ids = np.full(length, PAD, dtype=np.int32)
    ids[:len(seq)] = seq
    w = np.zeros(length, dtype=np.float32)
    p0 = 1 + len(s.ids)  # index of the first answer token in seq
    w[p0 - 1 - prefix_len:p0 - 1] = PREFIX_WEIGHT
    w[p0 - 1:len(seq) - 1] = 1.0
    for k in s.aux_pos:  # ids[k] is seq[k + 1], predicted at position k
        w[k] = AUX_WEIGHT
    return ids, w


_GEN: Generator | None = None


def build_batch(args):
    """Worker: batch `index` -> (index, stage, L, ids [B, L], weights [B, L], tasks [B]).
    A fixed length `force_len` replaces the stage's length draw (throughput checks)."""
    index, stage, seed, tokens_per_step, force_len = args
    rng = random.Random(f"train/{seed}/{index}")
    lengths = STAGES[stage][1]
    L = rng.choices(list(lengths), weights=list(lengths.values()))[0]
    if force_len:
        L = force_len[index % len(force_len)]
    B = max(1, tokens_per_step // L)
    ids = np.empty((B, L), dtype=np.int32)
    w = np.empty((B, L), dtype=np.float32)
    tasks = np.empty(B, dtype=np.int64)
    for b in range(B):
        task, s = random_sample(_GEN, rng, L)
        ids[b], w[b] = sample_arrays(s, s.n_prefix, L)
        tasks[b] = TASK_INDEX[task]
    return index, stage, L, ids, w, tasks


def init_generator(tokenizer_path: str, essays_path: str) -> None:
    global _GEN
    if _GEN is None:
        _GEN = Generator(ByteLevelBPE.from_file(tokenizer_path), essays_path)


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
        for f in ("model.safetensors", "config.json", "generation_config.json"):
            if os.path.exists(os.path.join(out_dir, f)):
                shutil.copy(os.path.join(out_dir, f), os.path.join(copy_to, f + ".tmp"))
                os.replace(os.path.join(copy_to, f + ".tmp"), os.path.join(copy_to, f))


def lr_at(frac: float, step: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    if frac < 0.7:
        return peak
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (frac - 0.7) / 0.3))))


def train(a, log=print) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import LlamaForCausalLM

    global STAGES, COPIES
    STAGES = STAGES_FAST if a.stages == "fast" else STAGES_DEFAULT
    COPIES = a.copies
    torch.manual_seed(a.seed)
    dev = torch.device("cuda")
    if a.init:
        model = LlamaForCausalLM.from_pretrained(a.init, attn_implementation="sdpa",
                                                 dtype=torch.float32).to(dev)
        log(f"initialized from {a.init}")
    else:
        model = LlamaForCausalLM._from_config(model_config(), attn_implementation="sdpa",
                                              dtype=torch.float32).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters ({n_params * 2 / 1e6:.2f} MB in bf16)")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)

    init_generator(a.tokenizer, a.essays)
    ctx = mp.get_context("fork")
    pool = ctx.Pool(a.workers)
    stage_steps = [int(x) for x in a.stage_steps.split(",")] if a.stage_steps else None

    def stage_for(step: int, frac: float) -> int:
        if stage_steps:
            return sum(1 for s in stage_steps if step >= s)
        return next(i for i, (end, _) in enumerate(STAGES) if frac < end or i == len(STAGES) - 1)

    t0 = time.time()
    pending = {}
    next_submit = 0
    stage_log = []
    step = 0
    last_save = t0
    cur_stage = -1
    loss_ema = None
    restrict_sdpa = True  # flash / mem-efficient only; dropped if this torch refuses
    while True:
        elapsed = time.time() - t0
        frac = elapsed / a.train_seconds
        if (a.max_steps and step >= a.max_steps) or (not a.max_steps and frac >= 1.0):
            break
        # Keep `prefetch` batches in flight, each built for the stage current at submission.
        while next_submit < step + a.prefetch:
            st = stage_for(next_submit, (time.time() - t0) / a.train_seconds)
            pending[next_submit] = pool.apply_async(
                build_batch, ((next_submit, st, a.seed, a.tokens_per_step, a.force_length),))
            next_submit += 1
        index, st, L, ids_np, w_np, tasks_np = pending.pop(step).get()
        if st != cur_stage:
            cur_stage = st
            stage_log.append({"stage": st, "step": step, "time_s": round(elapsed, 1)})
            log(f"stage {st} from step {step} ({elapsed:.0f}s)")
        ids = torch.from_numpy(ids_np).to(dev, non_blocking=True).long()
        w = torch.from_numpy(w_np).to(dev, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(frac, step, a.lr, a.warmup)
        backends = ([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION] if restrict_sdpa
                    else list(SDPBackend))
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel(backends):
                h = model.model(input_ids=ids, use_cache=False).last_hidden_state  # [B, L, H]
                sel = w[:, :-1] > 0  # [B, L-1]
                hs = h[:, :-1][sel]  # [N, H]
                logits = model.lm_head(hs).float()  # [N, vocab]
        except RuntimeError as e:
            if not restrict_sdpa:
                raise
            log(f"WARNING: flash/efficient SDPA refused ({e}); allowing all SDPA backends")
            restrict_sdpa = False
            pending[step] = pool.apply_async(
                build_batch, ((step, st, a.seed, a.tokens_per_step, a.force_length),))
            continue
        tgt = ids[:, 1:][sel]
        wt = w[:, :-1][sel]
        ce = F.cross_entropy(logits, tgt, reduction="none")
        loss = (ce * wt).sum() / wt.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % a.log_every == 0 or step < 3:
            with torch.no_grad():
                # A sequence is right when every answer token (and EOS) is the argmax.
                wrong = ((logits.argmax(-1) != tgt) & (wt == 1.0)).float()
                row = torch.nonzero(sel)[:, 0]
                bad = torch.zeros(ids.shape[0], device=dev).index_add_(0, row, wrong)
                rows_ok = (bad == 0).float()
            lv = loss.item()
            loss_ema = lv if loss_ema is None else 0.9 * loss_ema + 0.1 * lv
            per_task = {}
            for t, ti in TASK_INDEX.items():
                m = torch.from_numpy(tasks_np == ti).to(dev)
                if m.any():
                    per_task[t] = round(rows_ok[m].mean().item(), 3)
            log(f"step {step} t={elapsed:.0f}s L={L} B={ids.shape[0]} loss={lv:.4f} "
                f"ema={loss_ema:.4f} gnorm={gn.item():.2f} lr={opt.param_groups[0]['lr']:.2e} "
                f"seq_acc={json.dumps(per_task)}")
        step += 1
        if a.out and time.time() - last_save > a.save_every:
            save_model(model, a.out, a.tokenizer_dir, a.copy_to)
            last_save = time.time()
    torch.cuda.synchronize()
    elapsed = time.time() - t0
    pool.terminate()
    if a.out:
        save_model(model, a.out, a.tokenizer_dir, a.copy_to)
    log(f"trained {step} steps in {elapsed:.0f}s")
    return {"steps": step, "seconds": round(elapsed, 1), "stages": stage_log,
            "params": n_params, "model": model}


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
    ap.add_argument("--stages", choices=["default", "fast"], default="default")
    ap.add_argument("--copies", type=int, default=0,
                    help="up to this many repeated haystack spans per sample (copy targets)")
    ap.add_argument("--copy-to", default="", help="also copy the model files here at each save")
    ap.add_argument("--stage-steps", default="", help="replay: first step of stages 1..4")
    ap.add_argument("--tokens-per-step", type=int, default=65536)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--prefetch", type=int, default=24)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--save-every", type=float, default=60)
    return ap


def main() -> None:
    a = parser().parse_args()
    finish_args(a)
    train(a)


def finish_args(a) -> None:
    a.tokenizer = os.path.join(a.tokenizer_dir, "tokenizer.json")
    a.force_length = [int(x) for x in a.force_length.split(",")] if a.force_length else []


if __name__ == "__main__":
    main()
