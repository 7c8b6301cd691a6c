#!/usr/bin/env python3
"""Writes the benchmark inputs into a git-ignored folder (default .devcarry/tokenizer/):
english.txt (the first 1,000,000 characters of the "text" field of PaulGrahamEssays.json,
default ../shared/data/PaulGrahamEssays.json beside the repository, as tools/needle_model/ reads
it; --essays FILE to name another), code.txt (the first 1,000,000 characters of the libstdc++
headers /usr/include/c++/12/bits/*.h concatenated in name order) and copies of the real
tokenizer folders from build/test-data/tokenizers/.

Usage: prepare_data.py [OUT] [--essays FILE]"""
import argparse
import glob
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("out", nargs="?", default=".devcarry/tokenizer")
ap.add_argument("--essays", default=os.path.join(HERE, "../../../shared/data/PaulGrahamEssays.json"))
a = ap.parse_args()
out = a.out
os.makedirs(out, exist_ok=True)
with open(a.essays, encoding="utf-8") as f:
    english = json.load(f)["text"][:1_000_000]
with open(os.path.join(out, "english.txt"), "w", encoding="utf-8", newline="") as f:
    f.write(english)
code = []
for path in sorted(glob.glob("/usr/include/c++/12/bits/*.h")):
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        code.append(f.read())
with open(os.path.join(out, "code.txt"), "w", encoding="utf-8", newline="") as f:
    f.write("".join(code)[:1_000_000])
for name in ("qwen3", "llama3"):
    dst = os.path.join(out, name)
    os.makedirs(dst, exist_ok=True)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join("build/test-data/tokenizers", name, fn), dst)
print("wrote", out)
