"""Evaluates the needle model with Hugging Face transformers (GPU) and writes reference logits.

Accuracy: a sample is correct when greedy decoding reproduces the expected answer text (all
expected values, in the trained format) -- RULER's string_match_all is then 1. It is computed
exactly and cheaply by one teacher-forced forward over prompt + expected answer: greedy decoding
emits the expected answer iff at every answer position the argmax is the expected token (greedy
is deterministic; only fp rounding between a full forward and incremental decoding can differ,
so a subset is re-run with `generate()` and the agreement is reported). Whether EOS follows is
reported separately. Failed samples are re-run with `generate()` while time allows, to give
RULER's partial score (fraction of expected strings found in the output).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bpe import ByteLevelBPE  # noqa: E402
from needle_data import EVAL_SETTINGS, TASKS, Generator, eval_rng, resolve_task  # noqa: E402

BOS, EOS = 2045, 2046


def load_model(model_dir: str, dtype, attn: str = "sdpa"):
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn)
    return m.to(torch.device("cuda")).eval()


def teacher_forced(model, samples, max_batch_tokens: int):
    """Per sample: (answer all argmax-correct, EOS argmax-correct)."""
    import torch
    out = []
    dev = next(model.parameters()).device
    L = max(2 + len(s.ids) + len(s.answer_ids) for s in samples)
    bs = max(1, max_batch_tokens // L)
    for i in range(0, len(samples), bs):
        chunk = samples[i:i + bs]
        Lc = max(2 + len(s.ids) + len(s.answer_ids) for s in chunk)
        ids = torch.full((len(chunk), Lc), EOS, dtype=torch.long)
        rows, pos, tgt = [], [], []
        for b, s in enumerate(chunk):
            seq = [BOS] + s.ids + s.answer_ids + [EOS]
            ids[b, :len(seq)] = torch.tensor(seq)
            p0 = 1 + len(s.ids)
            for t in range(p0 - 1, len(seq) - 1):
                rows.append(b)
                pos.append(t)
                tgt.append(seq[t + 1])
        with torch.no_grad():
            h = model.model(input_ids=ids.to(dev), use_cache=False).last_hidden_state
            hs = h[torch.tensor(rows, device=dev), torch.tensor(pos, device=dev)]
            pred = model.lm_head(hs).float().argmax(-1).cpu().tolist()
        k = 0
        for b, s in enumerate(chunk):
            n = len(s.answer_ids) + 1
            p = pred[k:k + n]
            t = tgt[k:k + n]
            k += n
            out.append((p[:-1] == t[:-1], p[-1] == t[-1]))
    return out


def greedy_generate(model, s, max_new: int):
    import torch
    dev = next(model.parameters()).device
    ids = torch.tensor([[BOS] + s.ids], device=dev)
    with torch.no_grad():
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                           do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
    new = g[0, ids.shape[1]:].tolist()
    if EOS in new:
        new = new[:new.index(EOS)]
    return new


def ruler_score(text: str, outputs) -> float:
    return sum(o.lower() in text.lower() for o in outputs) / len(outputs)


# The worker process's generator, set once by the pool's initializer (fork: inherited, not
# pickled); the main process never reads it.
_WORKER_GEN: Generator | None = None


def _init_worker(gen: Generator) -> None:
    global _WORKER_GEN
    _WORKER_GEN = gen


def build_samples(gen: Generator, seed: int, cell: str, length: int, indices) -> list:
    """The evaluation samples `indices` of a cell (a task, variant or 'task@haystack')."""
    name, kw = resolve_task(cell)
    return [gen.make_sample(eval_rng(seed, cell, length, i), name, length, **kw)
            for i in indices]


def _build_in_worker(seed: int, cell: str, length: int, indices) -> list:
    return build_samples(_WORKER_GEN, seed, cell, length, indices)


def evaluate(a, log=print) -> dict:
    import multiprocessing as mp
    import torch
    tok = ByteLevelBPE.from_file(os.path.join(a.model, "tokenizer.json"))
    gen = Generator(tok, a.essays)
    model = load_model(a.model, torch.bfloat16)
    lengths = [int(x) for x in a.lengths.split(",")]
    # Cells: a task, a RULER variant (niah_single_3, ...) or 'task@haystack' (its RULER
    # settings on another haystack, e.g. 'niah_multikey_1@heldout'); each cell's samples come
    # from eval_rng(seed, cell name, length, i).
    tasks = a.tasks.split(",") if a.tasks else TASKS
    for t in tasks:
        resolve_task(t)  # an unknown name fails here, not after the first cells
    deadline = time.time() + a.seconds
    res = {t: {str(L): {"n": 0, "correct": 0, "eos": 0, "generate_checked": 0,
                         "generate_agree": 0, "failed_generated": 0, "failed_ruler_sum": 0.0}
               for L in lengths} for t in tasks}
    failures = []  # (task, length, index)
    # Passes of `chunk` samples over every (length, task) cell, so a time-out still leaves
    # every cell with samples. Worker processes build the next chunks while the GPU runs (a
    # 128K-token sample of the needle or held-out haystack takes 0.1-0.15 s to build).
    chunks = [(start, L, task) for start in range(0, a.num, a.chunk) for L in lengths
              for task in tasks]
    pool = mp.get_context("fork").Pool(a.workers, initializer=_init_worker, initargs=(gen,))
    pending = {}
    try:
        for k, (start, L, task) in enumerate(chunks):
            if time.time() > deadline:
                break
            for j in range(k, min(len(chunks), k + 2 * a.workers)):
                if j not in pending:
                    s0, Lj, tj = chunks[j]
                    pending[j] = pool.apply_async(
                        _build_in_worker, (a.seed, tj, Lj, range(s0, min(a.num, s0 + a.chunk))))
            ss = pending.pop(k).get()
            t1 = time.time()
            tf = teacher_forced(model, ss, a.batch_tokens)
            r = res[task][str(L)]
            r["n"] += len(ss)
            r["correct"] += sum(c for c, _ in tf)
            r["eos"] += sum(e for _, e in tf)
            for i, (c, _) in enumerate(tf):
                if not c:
                    failures.append((task, L, start + i))
            # Spot-check the teacher-forced verdict against real greedy decoding.
            if L <= a.generate_max_len and start == 0:
                for s, (c, _) in list(zip(ss, tf))[:a.generate_checks]:
                    new = greedy_generate(model, s, len(s.answer_ids) + 4)
                    r["generate_checked"] += 1
                    r["generate_agree"] += int((new[:len(s.answer_ids)] == s.answer_ids) == c)
            log(f"eval L={L} {task}: {r['correct']}/{r['n']} correct, eos {r['eos']}/{r['n']} "
                f"({time.time() - t1:.1f}s)")
    finally:
        pool.terminate()
    replay_failures(model, gen, tok, a, failures, res, deadline + a.failure_seconds, log)
    return res


def replay_order(failures, per_cell: int):
    """Failures to replay with generate(), round-robin over the cells (shortest lengths first
    within a round), at most `per_cell` of each: every cell with failures gets some replays
    before any cell gets many, so a time-out leaves an estimate for each."""
    by_cell = {}
    for task, L, i in failures:
        by_cell.setdefault((L, task), []).append((task, L, i))
    cells = sorted(by_cell, key=lambda c: c[0])
    order = []
    for k in range(per_cell):
        order += [by_cell[c][k] for c in cells if k < len(by_cell[c])]
    return order


def replay_failures(model, gen, tok, a, failures, res, deadline, log=print) -> None:
    """RULER's partial score of failed samples (greedy generate()) while time allows."""
    for task, L, i in replay_order(failures, a.failure_per_cell):
        if time.time() > deadline:
            break
        s = build_samples(gen, a.seed, task, L, [i])[0]
        new = greedy_generate(model, s, len(s.answer_ids) + 8)
        r = res[task][str(L)]
        r["failed_generated"] += 1
        r["failed_ruler_sum"] += ruler_score(tok.decode(new), s.outputs)
        if r["failed_generated"] <= 2:
            log(f"failure {task} L={L}: expected {s.answer!r} got {tok.decode(new)!r}")


def ruler_estimate(r: dict):
    """RULER's string_match_all over a cell's samples: exact answers score 1, failures the mean
    score of those replayed (the first ones by sample index: samples are drawn independently, so
    they are a random subset). None when failures exist and none was replayed."""
    failed = r["n"] - r["correct"]
    if failed and not r["failed_generated"]:
        return None
    mean_failed = r["failed_ruler_sum"] / r["failed_generated"] if failed else 0.0
    return (r["correct"] + failed * mean_failed) / r["n"] if r["n"] else None


def summarize(res: dict, log=print) -> None:
    """A table of the results: exact-match % (samples) per cell and length, and RULER's
    string_match_all estimated over all samples (`ruler_estimate`; `r   -` where no failure
    was replayed, `/k` the failures replayed when not all were)."""
    lengths = list(next(iter(res.values())))
    log(f"{'task':32s}" + "".join(f"{L:>26s}" for L in lengths))
    for task, cells in res.items():
        row = []
        for L in lengths:
            r = cells[L]
            if not r["n"]:
                row.append(f"{'-':>26s}")
                continue
            est = ruler_estimate(r)
            failed = r["n"] - r["correct"]
            part = "r    -" if est is None else f"r{100 * est:5.1f}%"
            if est is not None and r["failed_generated"] < failed:
                part += f"/{r['failed_generated']}"
            row.append(f"{100 * r['correct'] / r['n']:6.1f}% ({r['n']:3d}) {part}".rjust(26))
        log(f"{task:32s}" + "".join(row))


def reference(a, out_dir: str, log=print) -> None:
    """float32 transformers logits (eager attention, bf16 weights upcast) for a ~1K prompt."""
    import torch
    tok = ByteLevelBPE.from_file(os.path.join(a.model, "tokenizer.json"))
    gen = Generator(tok, a.essays)
    import random
    s = gen.make_sample(random.Random("reference/1k"), "niah_single", 1024, text=True,
                        **EVAL_SETTINGS["niah_single"])
    ids = [BOS] + s.ids
    model = load_model(a.model, torch.float32, attn="eager")
    with torch.no_grad():
        logits = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy()
        g = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=12,
                           do_sample=False, eos_token_id=EOS, pad_token_id=EOS,
                           output_scores=True, return_dict_in_generate=True)
    # The variant the fixtures use (bf16 load, then upcast): RoPE's inv_freq buffer is then
    # rounded to bf16, which is longctx's default for a bf16 checkpoint.
    model = load_model(a.model, torch.bfloat16, attn="eager").float()
    with torch.no_grad():
        logits_bf16rope = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy()
    n = len(ids)
    positions = sorted(set(list(range(0, n, 61)) + list(range(n - 8, n))))
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, "logits_1k.npy"), logits[positions].astype(np.float32))
    np.save(os.path.join(out_dir, "logits_1k_bf16rope.npy"),
            logits_bf16rope[positions].astype(np.float32))
    new = g.sequences[0, n:].tolist()
    margins = []
    for sc in g.scores:
        top = torch.topk(sc[0].float(), 2).values
        margins.append(float(top[0] - top[1]))
    import transformers
    ref = {"model": "needle", "transformers": transformers.__version__,
           "torch": torch.__version__, "dtype": "float32 (bf16 weights upcast), eager attention",
           "prompt_len": n, "input_ids": ids, "logits_file": "logits_1k.npy",
           "logits_file_bf16rope": "logits_1k_bf16rope.npy",
           "logits_positions": positions, "greedy_new_tokens": new, "greedy_margins": margins,
           "greedy_text": tok.decode([t for t in new if t != EOS]),
           "expected_answer": s.answer, "prompt_text": s.text}
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f)
    log(f"reference: {n} tokens, greedy {tok.decode(new)!r} (expected {s.answer!r}), "
        f"max |logit| {np.abs(logits).max():.2f}, bf16-rope variant differs by "
        f"{np.abs(logits - logits_bf16rope).max():.3g}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=os.path.join(HERE, "../../models/needle"))
    ap.add_argument("--essays", default=os.path.join(HERE, "../../../shared/data/PaulGrahamEssays.json"))
    ap.add_argument("--lengths", default="4096,8192,16384,32768,65536")
    ap.add_argument("--tasks", default="",
                    help="comma list of tasks, RULER variants or task@haystack (default: the "
                         "five tasks)")
    ap.add_argument("--num", type=int, default=100)
    ap.add_argument("--chunk", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--failure-seconds", type=float, default=15)
    ap.add_argument("--failure-per-cell", type=int, default=10,
                    help="failures replayed per cell at most (round-robin over the cells)")
    ap.add_argument("--batch-tokens", type=int, default=262144)
    ap.add_argument("--generate-checks", type=int, default=3)
    ap.add_argument("--generate-max-len", type=int, default=8192)
    ap.add_argument("--workers", type=int, default=12, help="processes building samples")
    ap.add_argument("--out", default="")
    ap.add_argument("--reference-out", default="")
    return ap


def main() -> None:
    a = parser().parse_args()
    res = evaluate(a)
    print(json.dumps(res, indent=1))
    summarize(res)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    if a.reference_out:
        reference(a, a.reference_out)


if __name__ == "__main__":
    main()
