"""RULER with Hugging Face transformers on the samples `longctx ruler` reads, as its reference.

Reads RULER's layout DIR/<length>/<task>/validation.jsonl (fields index, input, outputs,
answer_prefix, length) and, for each sample, builds the same prompt as `longctx ruler`:
input + answer_prefix, encoded by the model's tokenizer with its special tokens (the needle
model's post-processor adds BOS; longctx's text encoding does the same). It decodes greedily (one
sample at a time, no padding) for RULER's tokens_to_generate of the task, stops at the model's
EOS, decodes without special tokens, applies RULER's postprocess_pred and scores with RULER's
metric of the task (string_match_all, or string_match_part for qa), case-insensitive.

Weights run in float32 by default (the closest to longctx's fp32 CPU reference; --dtype
bfloat16 for the GPU's numerics), on CUDA. Writes --out as JSON: run settings, one record per
sample (length, task, index, prediction, outputs, score, prompt_tokens, generated_tokens) and the
table in percent; the samples also go to stdout, one JSON line each, and the table to stderr.

  python3 tools/needle_model/ruler_hf.py --model models/needle --data tests/data/ruler \
      --out tests/data/ruler/expected_hf.json

--self-test checks the metrics and the reader on hand cases (standard library only, no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Task name (RULER's scripts/synthetic.yaml) -> (family, tokens_to_generate, metric).
# tokens_to_generate: RULER's scripts/data/synthetic/constants.py; metrics:
# scripts/eval/synthetic/constants.py. Kept equal to src/eval/ruler.cpp.
TASKS = {
    "niah_single_1": ("niah", 128, "string_match_all"),
    "niah_single_2": ("niah", 128, "string_match_all"),
    "niah_single_3": ("niah", 128, "string_match_all"),
    "niah_multikey_1": ("niah", 128, "string_match_all"),
    "niah_multikey_2": ("niah", 128, "string_match_all"),
    "niah_multikey_3": ("niah", 128, "string_match_all"),
    "niah_multivalue": ("niah", 128, "string_match_all"),
    "niah_multiquery": ("niah", 128, "string_match_all"),
    "vt": ("variable_tracking", 30, "string_match_all"),
    "cwe": ("common_words_extraction", 120, "string_match_all"),
    "fwe": ("freq_words_extraction", 50, "string_match_all"),
    "qa_1": ("qa", 32, "string_match_part"),
    "qa_2": ("qa", 32, "string_match_part"),
}


def postprocess(pred: str) -> str:
    """RULER's postprocess_pred (scripts/eval/evaluate.py)."""
    return re.sub(r"[\x00-\x1f]", "\n", pred.strip()).strip()


def string_match_all(pred: str, refs: list[str]) -> float:
    """One sample of RULER's string_match_all: the fraction of references found."""
    return sum(r.lower() in pred.lower() for r in refs) / len(refs)


def string_match_part(pred: str, refs: list[str]) -> float:
    """One sample of RULER's string_match_part: 1 when any reference is found."""
    return max(1.0 if r.lower() in pred.lower() else 0.0 for r in refs)


def score(task: str, raw_pred: str, refs: list[str]) -> float:
    metric = string_match_part if TASKS[task][2] == "string_match_part" else string_match_all
    return metric(postprocess(raw_pred), refs)


def find_cells(data: str, tasks: list[str], lengths: list[int]) -> list[tuple[int, str, str]]:
    """(length, task, path) under DATA, by length then in TASKS order, as longctx ruler."""
    for t in tasks:
        if t not in TASKS:
            sys.exit(f"unknown RULER task {t!r} (known: {', '.join(TASKS)})")
    if not os.path.isdir(data):
        sys.exit(f"RULER data folder {data} does not exist")
    present = sorted(int(d) for d in os.listdir(data)
                     if os.path.isdir(os.path.join(data, d)) and d.isdigit())
    for L in lengths:
        if L not in present:
            sys.exit(f"{data}: no folder for length {L} (lengths there: {present})")
    order = list(TASKS)
    cells = []
    for L in present:
        if lengths and L not in lengths:
            continue
        ldir = os.path.join(data, str(L))
        names = [d for d in os.listdir(ldir) if os.path.isdir(os.path.join(ldir, d))]
        for t in sorted(names, key=lambda n: order.index(n) if n in TASKS else len(order)):
            if tasks and t not in tasks:
                continue
            if t not in TASKS:
                sys.exit(f"{ldir}/{t}: unknown RULER task {t!r}")
            path = os.path.join(ldir, t, "validation.jsonl")
            if not os.path.isfile(path):
                sys.exit(f"{ldir}/{t}: no validation.jsonl")
            cells.append((L, t, path))
    if not cells:
        sys.exit(f"{data}: no <length>/<task>/validation.jsonl found")
    return cells


def read_samples(path: str, limit: int) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                s = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")
            for k in ("index", "input", "outputs", "answer_prefix"):
                if k not in s:
                    sys.exit(f'{path}:{n}: sample has no "{k}" field')
            if not s["outputs"]:
                sys.exit(f'{path}:{n}: "outputs" is empty')
            out.append(s)
            if limit > 0 and len(out) >= limit:
                break
    if not out:
        sys.exit(f"{path}: no samples")
    return out


def table(records: list[dict]) -> tuple[str, dict]:
    """The `longctx ruler` table (tasks x lengths in percent, avg column, average row) and the
    cell percentages as {task: {length: percent}}."""
    cells: dict[tuple[str, int], list[float]] = {}
    for r in records:
        cells.setdefault((r["task"], r["length"]), []).append(r["score"])
    tasks = sorted({t for t, _ in cells}, key=list(TASKS).index)
    lengths = sorted({L for _, L in cells})
    pct = {k: round(100 * sum(v) / len(v), 2) for k, v in cells.items()}
    w = max(len("average"), *(len(t) for t in tasks))

    def mean(vals):
        vals = [v for v in vals if v is not None]
        return f"{sum(vals) / len(vals):.2f}" if vals else "-"

    def row(name, vals, last):
        return (f"{name:<{w}}" + "".join(f" {'-' if v is None else format(v, '.2f'):>8}"
                                         for v in vals) + f" {last:>8}")

    lines = [f"{'task':<{w}}" + "".join(f" {L:>8}" for L in lengths) + f" {'avg':>8}"]
    for t in tasks:
        vals = [pct.get((t, L)) for L in lengths]
        lines.append(row(t, vals, mean(vals)))
    per_length = [mean([pct.get((t, L)) for t in tasks]) for L in lengths]
    lines.append(f"{'average':<{w}}" + "".join(f" {v:>8}" for v in per_length)
                 + f" {mean(list(pct.values())):>8}")
    return "\n".join(lines) + "\n", {t: {str(L): pct[(t, L)] for L in lengths if (t, L) in pct}
                                      for t in tasks}


def run(a) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tasks = [t for t in a.tasks.split(",") if t] if a.tasks else []
    lengths = [int(x) for x in a.lengths.split(",") if x] if a.lengths else []
    cells = [(L, t, read_samples(p, a.limit)) for L, t, p in find_cells(a.data, tasks, lengths)]
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.dtype]
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation=a.attn)
    model = model.to(torch.device(a.device)).eval()
    eos = model.generation_config.eos_token_id
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else (eos[0] if isinstance(eos, list) else eos)
    records = []
    t_start = time.time()
    for i, (L, task, samples) in enumerate(cells):
        t0 = time.time()
        max_new = a.max_tokens or TASKS[task][1]
        for s in samples:
            ids = tok(s["input"] + s["answer_prefix"], add_special_tokens=True,
                      return_tensors="pt").input_ids.to(model.device)
            with torch.no_grad():
                g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad,
                                   temperature=None, top_p=None, top_k=None)
            new = g[0, ids.shape[1]:].tolist()
            pred = tok.decode(new, skip_special_tokens=True)
            r = {"length": L, "task": task, "index": s["index"], "prediction": pred,
                 "outputs": s["outputs"], "score": score(task, pred, s["outputs"]),
                 "sample_length": s.get("length", -1), "prompt_tokens": ids.shape[1],
                 "generated_tokens": len(new)}
            records.append(r)
            print(json.dumps(r), flush=True)
        got = [r["score"] for r in records[-len(samples):]]
        print(f"ruler_hf: [{i + 1}/{len(cells)}] {L} {task}: {len(samples)} samples, "
              f"{100 * sum(got) / len(got):.2f}%, {time.time() - t0:.1f} s", file=sys.stderr)
    text, pct = table(records)
    sys.stderr.write(text)
    print(f"ruler_hf: {len(records)} samples in {time.time() - t_start:.1f} s", file=sys.stderr)
    if a.out:
        result = {
            "source": "tools/needle_model/ruler_hf.py (transformers)",
            "model": os.path.basename(os.path.normpath(a.model)),
            "transformers": transformers.__version__, "torch": torch.__version__,
            "dtype": a.dtype, "attn_implementation": a.attn,
            "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else a.device,
            "prompt": "input + answer_prefix, tokenizer(add_special_tokens=True)",
            "decoding": "greedy, RULER's tokens_to_generate per task, stop at EOS",
            "limit": a.limit, "table_percent": pct, "samples": records,
        }
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


def self_test() -> None:
    refs = ["1234567", "7654321", "1111111", "2222222"]
    assert string_match_all("7654321, 1234567 and 3333333.", refs) == 0.5
    assert string_match_all(" JFITJ, tvgca", ["jfitj", "TVGCA"]) == 1.0
    assert string_match_all("L'ÉCOLE", ["école"]) == 1.0
    assert string_match_part("It is PARIS.", ["Paris", "the city of Paris, France"]) == 1.0
    assert string_match_part("Lyon", ["Paris"]) == 0.0
    assert string_match_all("", ["1234567"]) == 0.0
    assert postprocess("  \n 123\x01456\t7 \r\n") == "123\n456\n7"
    assert postprocess("\u00a0 42 \u3000") == "42"
    assert score("vt", "AB\tCD", ["AB\nCD"]) == 1.0 and score("vt", "AB\tCD", ["AB\tCD"]) == 0.0
    assert score("qa_1", " paris ", ["Paris", "Lyon"]) == 1.0
    assert score("niah_multivalue", " paris ", ["Paris", "Lyon"]) == 0.5
    data = os.path.join(HERE, "../../tests/data/ruler")
    cells = find_cells(data, [], [])
    assert [t for _, t, _ in cells] == [t for t in TASKS if not t.startswith("qa")], cells
    s = read_samples(cells[0][2], 2)
    assert len(s) == 2 and s[0]["index"] == 1179 and s[0]["outputs"] == ["5437923"]
    text, pct = table([{"task": "vt", "length": 4096, "score": 1.0},
                       {"task": "niah_single_1", "length": 4096, "score": 0.5},
                       {"task": "niah_single_1", "length": 32768, "score": 0.0}])
    assert text == ("task              4096    32768      avg\n"
                    "niah_single_1    50.00     0.00    25.00\n"
                    "vt              100.00        -   100.00\n"
                    "average          75.00     0.00    50.00\n"), text
    assert pct == {"niah_single_1": {"4096": 50.0, "32768": 0.0}, "vt": {"4096": 100.0}}
    print("ruler_hf self-test: ok")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(HERE, "../../models/needle"))
    ap.add_argument("--data", help="RULER folder: DATA/<length>/<task>/validation.jsonl")
    ap.add_argument("--tasks", default="", help="comma separated (default: all found)")
    ap.add_argument("--lengths", default="", help="comma separated (default: all found)")
    ap.add_argument("--limit", type=int, default=0, help="first N samples per cell (0 = all)")
    ap.add_argument("--max-tokens", type=int, default=0, help="override RULER's per-task value")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", help="write the JSON result here")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return
    if not a.data:
        ap.error("--data DIR is required")
    run(a)


if __name__ == "__main__":
    main()
