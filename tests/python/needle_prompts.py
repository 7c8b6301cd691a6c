"""Needle prompts from tools/needle_model/needle_data.py (standard library only)."""

import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def needle_samples(length: int, num: int, seed: int = 1234):
    """[(prompt text, expected answer)] of RULER's niah_single on the noise haystack."""
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "needle_model", "needle_data.py"), "--task",
         "niah_single", "--haystack", "noise", "--length", str(length), "--num", str(num),
         "--seed", str(seed)],
        check=True, capture_output=True, text=True).stdout
    samples = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [(s["input"] + s["answer_prefix"], s["answer"]) for s in samples]
