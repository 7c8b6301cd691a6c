"""One GPU-machine call: checks, smoke test, training, evaluation, reference logits.

  PYTHONUNBUFFERED=1 python3 tools/needle_model/gpu_run.py --out $OUT --budget 560

Phases (each logged to $OUT/log.txt):
  1. the tokenizer: HF `tokenizers` / `AutoTokenizer` encode the generator's texts (every task,
     RULER variant, value and key kind and haystack) to the same ids as the generator (which
     joins pre-tokenized pieces), chat template, decode;
  2. smoke: a few training steps of the last stage's task mix at 1K and 64K tokens
     (`--smoke-lengths`), save, a 2-sample eval and the reference path on the smoke model (any
     failure stops here, before the long run);
  3. with --population: several training recipes run side by side on the GPU for
     --population-seconds (a 4.7M-parameter model leaves the H200 mostly idle, so they cost little
     more than one); the one that got furthest through the accuracy-gated curriculum (stage,
     then training accuracy) continues;
  4. training for what the budget leaves after evaluation (checkpoints copied to $OUT), saving
     the model at the end of every curriculum stage; the final model and the stage checkpoints
     from 4K tokens on are scored on 25 niah_single samples at 4K/16K/32K and the best one is
     evaluated (and copied to $OUT) — a late collapse does not cost the run;
  5. evaluation (eval_results.json) and reference logits for tests (logits_1k.npy,
     logits_1k_bf16rope.npy, reference.json). `--skip-train DIR` makes a call of this phase
     alone.
"""

import argparse
import dataclasses
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import eval as needle_eval  # noqa: E402
import train as needle_train  # noqa: E402
from bpe import ByteLevelBPE  # noqa: E402
from needle_data import EVAL_SETTINGS, HAYSTACKS, TASKS, VARIANTS, Generator  # noqa: E402


class RunLog:
    """Timestamped lines on stdout and in a file (seconds since the call began)."""

    def __init__(self, path: str):
        self.path = path
        self.t0 = time.time()

    def __call__(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")

    def warn(self, ok: bool, msg: str) -> None:
        if not ok:
            self("WARNING: " + msg)

    def elapsed(self) -> float:
        return time.time() - self.t0


def check_tokenizer(tok_dir: str, gen: Generator, log: RunLog) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    hf = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    try:
        auto = AutoTokenizer.from_pretrained(tok_dir)
    except Exception as e:  # noqa: BLE001
        log.warn(False, f"AutoTokenizer failed: {e}")
        auto = None
    # Every task on every haystack it takes (RULER's settings otherwise), and RULER's variants.
    cases = [(task, {**EVAL_SETTINGS[task], "haystack": hs}) for task in TASKS
             for hs in HAYSTACKS if not (task == "vt" and hs == "needle")]
    cases += [(name, dict(EVAL_SETTINGS[name])) for name in VARIANTS]
    cases += [(name, {**EVAL_SETTINGS[name], "haystack": "heldout"})
              for name in ("niah_single_3", "niah_single_word")]
    n = 0
    for task, settings in cases:
        for length in (512, 2048, 8192):
            rng = random.Random(f"tokcheck/{task}/{length}/{settings['haystack']}")
            s = gen.make_sample(rng, task, length, text=True, **settings)
            ids = hf.encode(s.text, add_special_tokens=False).ids
            assert ids == s.ids, f"tokenizers disagrees on {task} {length} {settings}"
            assert hf.encode(s.text + s.answer, add_special_tokens=False).ids == \
                s.ids + s.answer_ids
            n += 1
            if auto is not None and (n == 1 or length == 512):
                log.warn(auto(s.text).input_ids == [needle_train.BOS] + s.ids,
                         "AutoTokenizer ids != [BOS] + generator ids")
                log.warn(hf.decode(ids, skip_special_tokens=False) == s.text, "decode != text")
    try:
        assert auto is not None
        chat = auto.apply_chat_template([{"role": "user", "content": "Hi there."}],
                                        tokenize=False, add_generation_prompt=True)
        log.warn(chat == "<|bos|>Hi there.", f"chat template rendered {chat!r}")
    except Exception as e:  # noqa: BLE001
        log.warn(False, f"chat template failed: {e}")
    odd = "Tab\there, two  spaces, 3.14159 and 'quotes' don't\n\nnew lines  \n end."
    log.warn(hf.encode(odd, add_special_tokens=False).ids == gen.tok.encode(odd),
             "odd text differs")
    log(f"tokenizer: {n} samples encode to the generator's ids with HF tokenizers")


def race(a, targs: needle_train.TrainConfig, log: RunLog) -> needle_train.TrainConfig:
    """Runs the population's recipes side by side; returns targs continuing the winner."""
    recipes = [r.split(":", 1) for r in a.population.split(";") if r.strip()]
    workers = max(2, (os.cpu_count() or 8) // len(recipes) - 1)
    procs = {}
    for name, extra in recipes:
        d = f"/tmp/needle_pop/{name}"
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        cmd = [sys.executable, os.path.join(HERE, "train.py"), "--out", d + "/model",
               "--essays", targs.essays, "--tokenizer-dir", targs.tokenizer_dir,
               "--stages", a.stages, "--model-shape", a.model_shape,
               "--train-seconds", str(a.population_seconds), "--workers", str(workers),
               "--summary-out", d + "/summary.json", "--log-every", "100",
               "--tokens-per-step", str(a.tokens_per_step), "--seed", "1"] + shlex.split(extra)
        log(f"population {name}: {' '.join(cmd[2:])}")
        procs[name] = (subprocess.Popen(cmd, stdout=open(d + "/log.txt", "w"),
                                        stderr=subprocess.STDOUT), d, extra)
    best = None
    for name, (p, d, extra) in procs.items():
        rc = p.wait()
        with open(d + "/log.txt") as f:
            tail = f.read().splitlines()[-3:]
        shutil.copy(d + "/log.txt", os.path.join(a.out, f"pop_{name}_log.txt"))
        if rc != 0 or not os.path.exists(d + "/summary.json"):
            log(f"population {name}: failed (rc {rc}): {tail}")
            continue
        with open(d + "/summary.json") as f:
            info = json.load(f)
        acc = info["final_train_acc"]
        score = (info["last_stage"], acc.get("niah_single", 0) + acc.get("niah_multikey", 0))
        log(f"population {name}: {info['steps']} steps, stage {info['last_stage']}, acc {acc}")
        if best is None or score > best[0]:
            best = (score, name, d, extra, info["last_stage"])
    if best is None:
        raise RuntimeError("every population recipe failed")
    _, name, d, extra, stage = best
    log(f"population winner: {name} ({extra}) at stage {stage}")
    t = needle_train.config_from_args(shlex.split(extra))
    return dataclasses.replace(t, tokenizer_dir=targs.tokenizer_dir, essays=targs.essays,
                               stages=targs.stages, model_shape=targs.model_shape,
                               tokens_per_step=targs.tokens_per_step, init=d + "/model",
                               start_stage=stage)


def select_checkpoint(a, eargs, final_dir: str, stages_dir: str, log: RunLog) -> str:
    """The final model vs the stage checkpoints from stage 5 (1K-4K tokens) on: the one with the
    most niah_single answers right at 4K/16K/32K (25 samples each, eval seed) wins; ties go to
    the later model. Its files are copied to a.out."""
    stages = sorted((int(d[5:]), os.path.join(stages_dir, d)) for d in os.listdir(stages_dir)
                    if d.startswith("stage")) if os.path.isdir(stages_dir) else []
    # Latest first: when time runs out, the models trained longest have been scored.
    cands = [final_dir] + [d for k, d in reversed(stages) if k >= 5]
    deadline = time.time() + a.select_seconds
    best = (-1, final_dir)
    for d in cands:
        if time.time() > deadline:
            log(f"select: out of time before {d}")
            break
        e = argparse.Namespace(**vars(eargs))
        e.model, e.tasks, e.lengths = d, "niah_single", "4096,16384,32768"
        e.num = e.chunk = 25
        e.seconds, e.failure_seconds, e.generate_checks = 20, 0, 0
        r = needle_eval.evaluate(e, log=lambda m: None)["niah_single"]
        score = sum(v["correct"] for v in r.values())
        log(f"select: {d}: niah_single " +
            ", ".join(f"{L}: {v['correct']}/{v['n']}" for L, v in r.items()))
        if score > best[0]:
            best = (score, d)
    log(f"select: {best[1]}")
    # The final model also comes back (final/) whichever is selected: a later call may continue it.
    copy_model(final_dir, os.path.join(a.out, "final"))
    if best[1] != final_dir:
        copy_model(best[1], a.out)
    return best[1]


def copy_model(src: str, dst: str) -> None:
    os.makedirs(dst, exist_ok=True)
    for f in needle_train.MODEL_FILES:
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))


def continuation(prev_out: str) -> tuple:
    """(--init, --start-stage) continuing the model a previous call left in prev_out."""
    with open(os.path.join(prev_out, "train_info.json")) as f:
        info = json.load(f)
    sel = info.get("selected", "final")
    # next_stage: the stage after the last one (--stop-after-stage), or the one time ran out in.
    stage = (info.get("next_stage", info["last_stage"]) if sel == "final"
             else int(sel[len("stage"):]) + 1)
    return prev_out, stage


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=560, help="seconds for everything")
    ap.add_argument("--eval-seconds", type=float, default=110,
                    help="evaluation time after training (0: no evaluation, no reference)")
    ap.add_argument("--max-train-seconds", type=float, default=400)
    ap.add_argument("--skip-train", default="", help="evaluate this model folder instead")
    ap.add_argument("--smoke-only", action="store_true")
    ap.add_argument("--skip-smoke", action="store_true")
    ap.add_argument("--smoke-lengths", default="1024,65536",
                    help="the smoke test's training lengths (the longest sets the peak memory)")
    ap.add_argument("--init", default="", help="continue training from this checkpoint")
    ap.add_argument("--continue-from", default="",
                    help="a previous call's output folder (model + train_info.json): continue "
                         "its selected model at the stage after it (sets --init/--start-stage)")
    ap.add_argument("--start-stage", type=int, default=0,
                    help="with --init: the curriculum stage to continue at (train_info.json's "
                         "last_stage of the run that made the checkpoint)")
    ap.add_argument("--stages", default="gated", choices=list(needle_train.STAGES_SETS))
    ap.add_argument("--model-shape", default="v1", choices=list(needle_train.MODEL_SHAPES),
                    help="train.py's (a new model's shape)")
    ap.add_argument("--copies", type=int, default=0)
    ap.add_argument("--lm-weight", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--decay-start", type=float, default=0.7,
                    help="train.py's: cosine decay from this fraction (>= 1: none, for a call "
                         "that another continues)")
    ap.add_argument("--attn", choices=("cudnn", "flash"), default="cudnn",
                    help="train.py's preferred SDPA kernel")
    ap.add_argument("--stop-after-stage", type=int, default=-1,
                    help="train.py's: end training when this stage ends")
    ap.add_argument("--skip-spikes", type=float, default=0, help="train.py's (0: off)")
    ap.add_argument("--seed", type=int, default=0,
                    help="train.py's (batches are a function of seed and step: a continuing "
                         "call takes another seed)")
    ap.add_argument("--save-state", default="", help="train.py's (float32 weights + AdamW)")
    ap.add_argument("--resume-state", default="", help="train.py's (used if the file exists)")
    ap.add_argument("--population", default="",
                    help="recipes to race, 'name:train.py args;name:args' (e.g. "
                         "'a:--lm-weight 0;b:--lm-weight 0.1')")
    ap.add_argument("--population-seconds", type=float, default=90)
    ap.add_argument("--select-seconds", type=float, default=30,
                    help="time to score the stage checkpoints (0: keep the final model)")
    ap.add_argument("--tokens-per-step", type=int, default=65536)
    ap.add_argument("--eval-num", type=int, default=100)
    ap.add_argument("--eval-tasks", default="",
                    help="eval.py's --tasks (tasks, RULER variants, 'task@haystack'; default the "
                         "five tasks)")
    ap.add_argument("--eval-lengths", default="", help="eval.py's --lengths (default 4K-64K)")
    ap.add_argument("--eval-seed", type=int, default=1234, help="eval.py's --seed")
    ap.add_argument("--failure-seconds", type=float, default=15,
                    help="at most this long replaying failures with generate() (RULER's score)")
    ap.add_argument("--failure-per-cell", type=int, default=10,
                    help="failures replayed per cell at most (round-robin over the cells)")
    ap.add_argument("--essays", default=os.path.join(HERE, "../../../shared/data/PaulGrahamEssays.json"))
    return ap


def main() -> None:
    a = parser().parse_args()
    if a.continue_from:
        a.init, a.start_stage = continuation(a.continue_from)
    os.makedirs(a.out, exist_ok=True)
    log = RunLog(os.path.join(a.out, "log.txt"))
    tok_dir = os.path.join(HERE, "../../models/needle")
    import torch
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")

    if not a.skip_smoke:
        gen = Generator(ByteLevelBPE.from_file(os.path.join(tok_dir, "tokenizer.json")), a.essays)
        check_tokenizer(tok_dir, gen, log)

    work = "/tmp/needle_work"
    shutil.rmtree(work, ignore_errors=True)
    targs = needle_train.TrainConfig(
        tokenizer_dir=tok_dir, essays=a.essays, init=a.init, stages=a.stages,
        model_shape=a.model_shape, copies=a.copies, start_stage=a.start_stage,
        tokens_per_step=a.tokens_per_step, lm_weight=a.lm_weight, lr=a.lr,
        decay_start=a.decay_start, attn=a.attn, stop_after_stage=a.stop_after_stage,
        skip_spikes=a.skip_spikes, save_state=a.save_state, resume_state=a.resume_state,
        seed=a.seed)
    eargs = needle_eval.parser().parse_args([])
    eargs.essays = a.essays
    eargs.num = a.eval_num
    eargs.seed = a.eval_seed
    eargs.failure_per_cell = a.failure_per_cell
    if a.eval_tasks:
        eargs.tasks = a.eval_tasks
    if a.eval_lengths:
        eargs.lengths = a.eval_lengths

    model_dir = a.skip_train
    if not a.skip_train and not a.skip_smoke:
        # ---- smoke ----
        smoke = dataclasses.replace(
            targs, out=os.path.join(work, "smoke"), max_steps=4, log_every=1, copy_to="",
            force_length=tuple(int(x) for x in a.smoke_lengths.split(",")),
            # the last stage's task mix (the first is the copy task alone), without a model
            # to continue
            start_stage=len(needle_train.STAGES_SETS[a.stages]) - 1, init="",
            # logits at every position: the largest activation footprint
            lm_weight=0.1, save_state="", resume_state="")
        torch.cuda.reset_peak_memory_stats()
        needle_train.train(smoke, log=log)
        log(f"smoke peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB; files "
            f"{sorted(os.listdir(smoke.out))}")
        e = argparse.Namespace(**vars(eargs))
        e.model = smoke.out
        e.num, e.chunk, e.seconds, e.failure_seconds = 2, 2, 60, 5
        e.lengths = f"4096,{max(smoke.force_length)}"
        e.generate_checks = 1
        r = needle_eval.evaluate(e, log=log)
        log("smoke eval: " + json.dumps({t: {L: (v["correct"], v["n"]) for L, v in x.items()}
                                         for t, x in r.items()}))
        needle_eval.reference(e, os.path.join(work, "smoke_ref"), log=log)
        log("smoke ok")
        if a.smoke_only:
            return
    if not a.skip_train and a.population:
        targs = race(a, targs, log)
    if not a.skip_train:
        # ---- training ----
        left = a.budget - log.elapsed()
        targs = dataclasses.replace(
            targs, train_seconds=min(a.max_train_seconds,
                                     left - a.eval_seconds - a.select_seconds - 45),
            out=os.path.join(work, "model"), copy_to=a.out,
            # Not under $OUT: nine 9 MB checkpoints would not come back (16 MiB per file).
            stage_checkpoints=os.path.join(work, "stages"))
        log(f"training for {targs.train_seconds:.0f}s")
        info = needle_train.train(targs, log=log)
        info.pop("model")
        model_dir = targs.out
        if a.select_seconds > 0:
            model_dir = select_checkpoint(a, eargs, targs.out, targs.stage_checkpoints, log)
        # "selected": the model in $OUT ("final", or "stageK": the model as stage K ended; to
        # continue it, --init it with --start-stage K + 1, or last_stage for the final one).
        info["selected"] = os.path.basename(model_dir) if model_dir != targs.out else "final"
        with open(os.path.join(a.out, "train_info.json"), "w") as f:
            json.dump(info, f, indent=1)
    # ---- evaluation ----
    if a.eval_seconds <= 0:  # a training call that another continues: its model only
        log("done (no evaluation: --eval-seconds 0)")
        return
    eargs.model = model_dir
    left = a.budget - log.elapsed()
    eargs.seconds = max(20.0, min(a.eval_seconds, left - 35))
    eargs.failure_seconds = min(a.failure_seconds, max(0.0, left - eargs.seconds - 25))
    log(f"evaluating for {eargs.seconds:.0f}s (+{eargs.failure_seconds:.0f}s of failure replays)")
    needle_eval.reference(eargs, a.out, log=log)
    res = needle_eval.evaluate(eargs, log=log)
    with open(os.path.join(a.out, "eval_results.json"), "w") as f:
        json.dump(res, f, indent=1)
    needle_eval.summarize(res, log=log)
    log("done")


if __name__ == "__main__":
    main()
