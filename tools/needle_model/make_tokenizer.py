"""Trains the needle model's byte-level BPE on the essays + task templates and writes
tokenizer.json / tokenizer_config.json (pure standard-library Python, ~10 s).

Vocab: 256 byte tokens + 1789 merges + 3 special tokens (<|bos|>, <|eos|>, <|pad|>) = 2048.
No merge contains a digit, so every digit is a token of its own (see bpe.py)."""

import argparse
import json
import os
import random
import re

from bpe import ByteLevelBPE, sanitize, train_bpe
from needle_data import ADJECTIVES, NOISE_LINE, NOUNS, TEMPLATES

NUM_MERGES = 2048 - 256 - 3


def corpus(essays_path: str) -> list:
    with open(essays_path, encoding="utf-8") as f:
        text = re.sub(r"\s+", " ", sanitize(json.load(f)["text"]))
    rng = random.Random(0)
    # Task text, weighted like ~2% of the corpus, so template words get their own tokens.
    extra = []
    for _ in range(2000):
        key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
        t = rng.choice(list(TEMPLATES.values()))
        extra.append(" ".join(x.format(query=key, n=5) for x in t))
        extra.append(f"One of the special magic numbers for {key} is: 1234567.")
        extra.append(NOISE_LINE)
    return [text, "\n".join(extra)]


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--essays", default=os.path.join(here, "../../../shared/data/PaulGrahamEssays.json"))
    ap.add_argument("--out", default=os.path.join(here, "../../models/needle"))
    ap.add_argument("--model-max-length", type=int, default=131072)
    args = ap.parse_args()
    merges = train_bpe(corpus(args.essays), NUM_MERGES)
    tok = ByteLevelBPE.from_merges(merges)
    assert tok.vocab_size == 2048, tok.vocab_size
    os.makedirs(args.out, exist_ok=True)
    tok.save(args.out, args.model_max_length)
    print(f"wrote {args.out}/tokenizer.json: vocab {tok.vocab_size}, {len(merges)} merges")


if __name__ == "__main__":
    main()
