"""Sparse-policy accuracy on the GPU machine: `longctx needle` over the same samples once per
policy, then a markdown table per (task, length): exact match, its difference from full
attention, how many samples generate full attention's token ids, and the density (the fraction
of KV pages a decode step reads, per KV head, averaged over every decode step of every sample;
computed from each sample's prompt and generated lengths by Quest's rule, kernels/quest_params.h;
for xattention the fraction of causal key blocks the prefill read, per q head, over every layer
and chunk, as `longctx needle` reports it).

  python3 bench/sparse/accuracy.py --longctx build-cuda/longctx --out DIR FILE.jsonl ... \
      --policies full quest:1024 quest:1024:avg quest:4096
A policy is `full`, `quest:BUDGET[:avg]` (avg: head-averaged scores) or
`xattn:THRESHOLD[:STRIDE][:q]` (q: one mask per q head instead of per KV head);
--common-flags='...' go to every run (defaults: batching and 16 new tokens as
bench/offload/exactness.py; e.g. add --kv-offload and its budgets).
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path


def quest_count(kv_len, page, budget, sink, window):
    """(pages read per KV head, pages held) for a decode step over kv_len keys."""
    num_pages = (kv_len + page - 1) // page
    budget_pages = max(1, budget // page)
    if budget >= kv_len or budget_pages >= num_pages:
        return num_pages, num_pages
    sink_pages = min(num_pages, (sink + page - 1) // page)
    window_first = (kv_len - window) // page if kv_len > window else 0
    forced = sink_pages + (num_pages - max(window_first, sink_pages))
    free = max(0, budget_pages - forced)
    return forced + min(free, num_pages - forced), num_pages


def policy_flags(spec, page, sink, window):
    if spec == "full":
        return []
    parts = spec.split(":")
    if parts[0] == "xattn" and 2 <= len(parts) <= 4:
        flags = ["--sparse-policy", "xattention", "--xattn-threshold", parts[1]]
        for extra in parts[2:]:
            flags += ["--xattn-per-q-head"] if extra == "q" else ["--xattn-stride", extra]
        return flags
    if parts[0] != "quest" or len(parts) not in (2, 3):
        sys.exit(f"policy {spec!r}: want full, quest:BUDGET[:avg] or xattn:THRESHOLD[:STRIDE][:q]")
    flags = ["--sparse-policy", "quest", "--sparse-budget", parts[1], "--sparse-page", str(page),
             "--sparse-sink", str(sink), "--sparse-window", str(window)]
    if len(parts) == 3:
        if parts[2] != "avg":
            sys.exit(f"policy {spec!r}: the third field can only be avg")
        flags.append("--sparse-head-averaged")
    return flags


def density(spec, rows, page, sink, window, stdout):
    if spec == "full":
        return 1.0
    if spec.startswith("xattn"):
        m = re.search(r"sparse prefill density ([0-9.]+)", stdout)
        if not m:
            sys.exit(f"{spec}: longctx needle printed no sparse prefill density")
        return float(m.group(1))
    budget = int(spec.split(":")[1])
    read = held = 0
    for r in rows:
        prompt, n = r["prompt_tokens"], len(r["token_ids"])
        for kv in range(prompt + 1, prompt + n):  # the first token came from the prefill
            a, b = quest_count(kv, page, budget, sink, window)
            read += a
            held += b
    return read / held if held else 1.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--longctx", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--policies", nargs="+", default=["full", "quest:1024", "quest:2048",
                                                      "quest:4096", "quest:1024:avg",
                                                      "quest:2048:avg", "quest:4096:avg"])
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--sink", type=int, default=64)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--common-flags",
                    default="--max-num-seqs 8 --max-num-batched-tokens 8192 --max-tokens 16",
                    help="flags for every run, one string given as --common-flags='...' "
                         "(argparse takes a value that starts with -- only after =)")
    ap.add_argument("samples", nargs="+")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.policies[0] != "full":
        sys.exit("the first policy must be full (the reference)")
    for samples in a.samples:
        name = Path(samples).stem
        results = {}
        for spec in a.policies:
            path = out / f"{name}.{spec.replace(':', '_')}.json"
            cmd = [a.longctx, "needle", "--model", "models/needle", "--device", "cuda",
                   "--samples", samples, "--out", str(path)] + shlex.split(a.common_flags) + policy_flags(
                       spec, a.page, a.sink, a.window)
            t0 = time.perf_counter()
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=os.environ)
            if p.returncode != 0:
                sys.exit(f"{' '.join(cmd)}\nfailed ({p.returncode}): {p.stderr[-2000:]}")
            rows = json.loads(path.read_text())
            rows = rows["samples"] if isinstance(rows, dict) else rows
            results[spec] = (rows, time.perf_counter() - t0, p.stdout)
        full_rows = results["full"][0]
        full_exact = 100.0 * sum(r["exact"] for r in full_rows) / len(full_rows)
        print(f"\n{name} ({len(full_rows)} samples)\n")
        print("| policy | exact % | vs full | same tokens as full | density | run s |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for spec in a.policies:
            rows, secs, stdout = results[spec]
            exact = 100.0 * sum(r["exact"] for r in rows) / len(rows)
            same = sum(r["token_ids"] == f["token_ids"] for r, f in zip(rows, full_rows))
            d = density(spec, rows, a.page, a.sink, a.window, stdout)
            print(f"| {spec} | {exact:.1f} | {exact - full_exact:+.1f} | {same}/{len(rows)} | "
                  f"{d:.3f} | {secs:.0f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
