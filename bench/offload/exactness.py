"""Offload exactness on the GPU machine: `longctx needle` over the same samples with the KV cache
resident and offloaded (a tiny GPU cache, so most blocks stream from the host), then the greedy
token ids of every sample compared. Prints a table per file and exits 1 on any difference.

  python3 bench/offload/exactness.py --longctx build-cuda/longctx --out DIR FILE.jsonl ...
  (--common-flags for both runs, --offload-flags for the offload run, --env K=V for both runs'
  environment)

--reference-flags='--attention-kernel generic' adds a third run, resident with those flags (the
generic kernel: P and every sum in fp32), and says for each sample where the two runs part which
of them agrees with it: the tie-breaker of which one is nearer exact
attention. --control runs two resident configurations instead of resident vs offload.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def env_of(pairs):
    return dict(p.split("=", 1) for p in pairs or [])


def run(longctx, samples, out, extra, env):
    cmd = [longctx, "needle", "--model", "models/needle", "--device", "cuda", "--samples",
           samples, "--out", out] + extra
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       env={**os.environ, **env})
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}\nfailed ({p.returncode}): {p.stderr[-2000:]}")
    return time.perf_counter() - t0


def first_difference(x, y):
    return next((k for k, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--longctx", required=True)
    ap.add_argument("--out", required=True)
    # Both runs batch alike (bf16 GEMMs round by batch shape); the offload run adds its flags.
    ap.add_argument("--common-flags", nargs="*", default=[
        "--max-num-seqs", "8", "--max-num-batched-tokens", "4096", "--max-tokens", "16"])
    ap.add_argument("--offload-flags", nargs="*", default=[
        "--kv-offload", "--gpu-kv-budget", "32MiB", "--host-kv-budget", "8GiB"])
    ap.add_argument("--env", action="append", help="K=V for both runs' environment")
    ap.add_argument("--reference-flags", default="",
                    help="a third, resident run with these flags (one string) breaks ties, e.g. "
                         "--reference-flags='--attention-kernel generic'")
    ap.add_argument("--control", choices=["chunk", "batch"],
                    help="instead of offload, a resident run with another prefill chunk size "
                         "(4096 vs 2048) or batch size (8 vs 3 sequences per step, so the "
                         "decode kernel splits the keys differently)")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    res_flags = []
    if a.control == "chunk":
        a.common_flags = ["--max-num-seqs", "8", "--max-tokens", "16"]
        a.offload_flags = ["--max-num-batched-tokens", "2048"]
        res_flags = ["--max-num-batched-tokens", "4096"]
    elif a.control == "batch":
        a.common_flags = ["--max-num-batched-tokens", "4096", "--max-tokens", "16"]
        a.offload_flags = ["--max-num-seqs", "3"]
        res_flags = ["--max-num-seqs", "8"]
    env = env_of(a.env)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    bad = 0
    print(f"{'samples':28s} {'n':>3s} {'same':>5s} {'exact% res':>10s} {'exact% off':>10s} "
          f"{'s res':>6s} {'s off':>6s}")
    for f in a.files:
        name = Path(f).stem
        res, off = f"{a.out}/{name}.resident.json", f"{a.out}/{name}.offload.json"
        t_res = run(a.longctx, f, res, a.common_flags + res_flags, env)
        t_off = run(a.longctx, f, off, a.common_flags + a.offload_flags, env)
        r, o = json.load(open(res)), json.load(open(off))
        ref = None
        if a.reference_flags:
            path = f"{a.out}/{name}.reference.json"
            run(a.longctx, f, path, a.common_flags + res_flags + a.reference_flags.split(), env)
            ref = json.load(open(path))
        same = sum(x["token_ids"] == y["token_ids"] for x, y in zip(r, o))
        sides = {"resident": 0, "offload": 0, "neither": 0}
        for i, (x, y) in enumerate(zip(r, o)):
            if x["token_ids"] == y["token_ids"]:
                continue
            k = first_difference(x["token_ids"], y["token_ids"])
            m = x.get("top2_margins", [])
            line = (f"  {name} sample {i}: token {k} differs; the resident run's top-2 logprob "
                    f"margin there {m[k] if k < len(m) else float('nan'):.4f}")
            if ref is not None:
                z = ref[i]["token_ids"]
                dr, do = first_difference(z, x["token_ids"]), first_difference(z, y["token_ids"])
                side = "resident" if dr > do else "offload" if do > dr else "neither"
                sides[side] += 1
                line += f"; the reference agrees longer with: {side}"
            print(line)
        bad += len(r) - same
        er = 100 * sum(x["exact"] for x in r) / len(r)
        eo = 100 * sum(x["exact"] for x in o) / len(o)
        print(f"{name:28s} {len(r):3d} {same:5d} {er:10.1f} {eo:10.1f} {t_res:6.1f} {t_off:6.1f}",
              flush=True)
        if ref is not None:
            ez = 100 * sum(x["exact"] for x in ref) / len(ref)
            sr = sum(x["token_ids"] == z["token_ids"] for x, z in zip(r, ref))
            so = sum(y["token_ids"] == z["token_ids"] for y, z in zip(o, ref))
            print(f"  reference ({a.reference_flags}): exact {ez:.1f}%, the same tokens "
                  f"as resident {sr}/{len(r)}, as offload {so}/{len(o)}; where the runs part it "
                  f"sides with resident {sides['resident']}, offload {sides['offload']}, neither "
                  f"{sides['neither']}", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
