"""Offload exactness on the GPU machine: `longctx needle` over the same samples with the KV cache
resident and offloaded (a tiny GPU cache, so most blocks stream from the host), then the greedy
token ids of every sample compared. Prints a table per file and exits 1 on any difference.

  python3 bench/offload/exactness.py --longctx build-cuda/longctx --out DIR FILE.jsonl ...
  (--common-flags for both runs, --offload-flags for the offload run)
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def run(longctx, samples, out, extra):
    cmd = [longctx, "needle", "--model", "models/needle", "--device", "cuda", "--samples",
           samples, "--out", out] + extra
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\nfailed ({p.returncode}): {p.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--longctx", required=True)
    ap.add_argument("--out", required=True)
    # Both runs batch alike (bf16 GEMMs round by batch shape); the offload run adds its flags.
    ap.add_argument("--common-flags", nargs="*", default=[
        "--max-num-seqs", "8", "--max-num-batched-tokens", "4096", "--max-tokens", "16"])
    ap.add_argument("--offload-flags", nargs="*", default=[
        "--kv-offload", "--gpu-kv-budget", "32MiB", "--host-kv-budget", "8GiB"])
    ap.add_argument("--control", choices=["chunk", "batch"],
                    help="instead of offload, a resident run with another prefill chunk size "
                         "(4096 vs 2048) or batch size (8 vs 3 sequences per step, so the "
                         "decode kernel splits the keys differently)")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    if a.control == "chunk":
        a.common_flags = ["--max-num-seqs", "8", "--max-tokens", "16"]
        a.offload_flags = ["--max-num-batched-tokens", "2048"]
        a.common_flags_res = ["--max-num-batched-tokens", "4096"]
    elif a.control == "batch":
        a.common_flags = ["--max-num-batched-tokens", "4096", "--max-tokens", "16"]
        a.offload_flags = ["--max-num-seqs", "3"]
        a.common_flags_res = ["--max-num-seqs", "8"]
    else:
        a.common_flags_res = []
    Path(a.out).mkdir(parents=True, exist_ok=True)
    bad = 0
    print(f"{'samples':28s} {'n':>3s} {'same':>5s} {'exact% res':>10s} {'exact% off':>10s} "
          f"{'s res':>6s} {'s off':>6s}")
    for f in a.files:
        name = Path(f).stem
        res, off = f"{a.out}/{name}.resident.json", f"{a.out}/{name}.offload.json"
        t_res = run(a.longctx, f, res, a.common_flags + a.common_flags_res)
        t_off = run(a.longctx, f, off, a.common_flags + a.offload_flags)
        r, o = json.load(open(res)), json.load(open(off))
        same = sum(x["token_ids"] == y["token_ids"] for x, y in zip(r, o))
        for i, (x, y) in enumerate(zip(r, o)):
            if x["token_ids"] == y["token_ids"]:
                continue
            k = next(k for k, (u, v) in enumerate(zip(x["token_ids"], y["token_ids"])) if u != v)
            m = x.get("top2_margins", [])
            print(f"  {name} sample {i}: token {k} differs; the reference's top-2 logprob margin "
                  f"there {m[k] if k < len(m) else float('nan'):.4f} (smallest of the sample "
                  f"{min(m) if m else float('nan'):.4f})")
        bad += len(r) - same
        er = 100 * sum(x["exact"] for x in r) / len(r)
        eo = 100 * sum(x["exact"] for x in o) / len(o)
        print(f"{name:28s} {len(r):3d} {same:5d} {er:10.1f} {eo:10.1f} {t_res:6.1f} {t_off:6.1f}",
              flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
