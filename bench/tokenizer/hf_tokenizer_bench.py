#!/usr/bin/env python3
"""Times Hugging Face tokenizers on the files bench_tokenizer uses, on one thread, and checks
that its ids equal the ones bench_tokenizer dumped (--dump).

RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false python3 hf_tokenizer_bench.py \
    --tokenizer qwen3=DIR --text english=FILE --ids-dir DUMPDIR [--ours bench_output.txt]

MB/s counts input bytes (UTF-8), 1 MB = 1e6 bytes; "first" is the first pass of a freshly
loaded tokenizer, "best" the best of --repeats more passes. With --ours (the stdout of
bench_tokenizer) it prints longctx / HF throughput ratios.
"""
import argparse
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402


def fnv1a(ids):
    h = 1469598103934665603
    for i in ids:
        h ^= i
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def pair(s):
    name, _, path = s.partition("=")
    return name, path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", action="append", type=pair, required=True)
    ap.add_argument("--text", action="append", type=pair, required=True)
    ap.add_argument("--piece-chars", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ids-dir", default="")
    ap.add_argument("--ours", default="")
    a = ap.parse_args()
    ours = {}
    if a.ours:
        for line in open(a.ours):
            f = line.split()
            if len(f) == 8 and not line.startswith("#") and f[0] != "tokenizer":
                ours[(f[0], f[1], f[2])] = (float(f[4]), float(f[5]), int(f[6]), f[7])
    print("tokenizers", tokenizers.__version__)
    print(f"{'tokenizer':8} {'text':8} {'mode':7} {'bytes':>9} {'first MB/s':>11} "
          f"{'best MB/s':>10} {'tokens':>8} {'ids==longctx':>12} {'ratio first':>11} "
          f"{'ratio best':>10}")
    all_ok = True
    for tname, tdir in a.tokenizer:
        path = os.path.join(tdir, "tokenizer.json") if os.path.isdir(tdir) else tdir
        for xname, xpath in a.text:
            with open(xpath, encoding="utf-8", newline="") as f:
                text = f.read()
            nbytes = len(text.encode("utf-8"))
            for mode in ("whole", "pieces"):
                parts = [text] if mode == "whole" else [
                    text[i:i + a.piece_chars] for i in range(0, len(text), a.piece_chars)]
                tok = tokenizers.Tokenizer.from_file(path)
                first, best, ids = None, None, []
                for r in range(a.repeats + 1):
                    out = []
                    s = time.perf_counter()
                    for p in parts:
                        out.extend(tok.encode(p, add_special_tokens=False).ids)
                    e = time.perf_counter() - s
                    if r == 0:
                        first, ids = e, out
                    elif best is None or e < best:
                        best = e
                best = best or first
                same = "n/a"
                if a.ids_dir:
                    fn = os.path.join(a.ids_dir, f"{tname}.{xname}.{mode}.ids")
                    if os.path.exists(fn):
                        with open(fn) as f:
                            theirs = [int(x) for x in f.read().split()]
                        same = "yes" if theirs == ids else "NO"
                        if theirs != ids:
                            all_ok = False
                            k = next((i for i, (u, v) in enumerate(zip(theirs, ids)) if u != v),
                                     min(len(theirs), len(ids)))
                            print(f"  MISMATCH at id #{k}: longctx {theirs[k:k + 8]} "
                                  f"hf {ids[k:k + 8]} (lengths {len(theirs)} vs {len(ids)})")
                rf = rb = ""
                o = ours.get((tname, xname, mode))
                if o:
                    rf = f"{o[0] / (nbytes / first / 1e6):.1f}x"
                    rb = f"{o[1] / (nbytes / best / 1e6):.1f}x"
                    if o[2] != len(ids) or int(o[3], 16) != fnv1a(ids):
                        same = same + "/hash-NO"
                        all_ok = False
                print(f"{tname:8} {xname:8} {mode:7} {nbytes:9d} {nbytes / first / 1e6:11.2f} "
                      f"{nbytes / best / 1e6:10.2f} {len(ids):8d} {same:>12} {rf:>11} {rb:>10}",
                      flush=True)
    print("ALL IDS IDENTICAL" if all_ok else "IDS DIFFER")


if __name__ == "__main__":
    main()
