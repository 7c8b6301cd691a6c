"""Exact-match accuracy of a model on the needle tasks, run through the longctx CLI (the
engine's own tokenizer, model, sampler and detokenizer; greedy) instead of transformers.

  python3 tools/needle_model/longctx_eval.py --task niah_single --length 4096 --num 25

The samples are eval.py's (seed 1234, sample i of each (task, length)), so the numbers compare
with eval_results.json's first `num` samples of that cell.
"""

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bpe import ByteLevelBPE  # noqa: E402
from needle_data import EVAL_SETTINGS, TASKS, Generator, eval_rng  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--longctx", default=os.path.join(HERE, "../../build/longctx"))
    ap.add_argument("--model", default=os.path.join(HERE, "../../models/needle"))
    ap.add_argument("--essays",
                    default=os.path.join(HERE, "../../../shared/data/PaulGrahamEssays.json"))
    ap.add_argument("--task", choices=TASKS, default="niah_single")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--num", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--min-correct", type=int, default=0,
                    help="exit with status 1 when fewer samples are right (a test)")
    a = ap.parse_args()
    gen = Generator(ByteLevelBPE.from_file(os.path.join(a.model, "tokenizer.json")), a.essays)
    correct = 0
    t0 = time.time()
    for i in range(a.num):
        s = gen.make_sample(eval_rng(a.seed, a.task, a.length, i), a.task, a.length, text=True,
                            **EVAL_SETTINGS[a.task])
        r = subprocess.run([a.longctx, "generate", "--model", a.model, "--temperature", "0",
                            "--max-tokens", str(a.max_tokens), "--no-summary", "--prompt",
                            s.text], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"longctx failed on sample {i}: {r.stderr.strip()}")
        got = r.stdout.rstrip("\n")
        ok = got == s.answer
        correct += ok
        if not ok:
            print(f"sample {i}: expected {s.answer!r} got {got!r}", flush=True)
    print(f"{a.task} L={a.length}: {correct}/{a.num} correct (longctx CPU, greedy, "
          f"{time.time() - t0:.0f}s)")
    if correct < a.min_correct:
        sys.exit(f"FAILED: {correct} < {a.min_correct} correct")


if __name__ == "__main__":
    main()
