"""Compares `longctx needle --out` predictions with transformers' greedy answers on the same
samples (GPU machine): for each sample of the JSONL files, transformers (bf16, sdpa) generates
greedily from BOS + input + answer_prefix and the decoded text is compared with longctx's
prediction. Prints agreement per length and overall:
  python3 tools/needle_model/compare_answers.py --model models/needle --predictions gpu.json \
      samples_4k.jsonl samples_16k.jsonl ...
"""

import argparse
import json
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bpe import ByteLevelBPE  # noqa: E402

BOS, EOS = 2045, 2046


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--predictions", required=True, help="longctx needle --out file")
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("samples", nargs="+")
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    tok = ByteLevelBPE.from_file(os.path.join(a.model, "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").cuda().eval()
    samples = [json.loads(line) for p in a.samples for line in open(p) if line.strip()]
    with open(a.predictions) as f:
        preds = json.load(f)
    preds = preds["samples"] if isinstance(preds, dict) else preds
    assert len(preds) == len(samples), f"{len(preds)} predictions for {len(samples)} samples"
    cells = defaultdict(lambda: [0, 0, 0])  # length -> [n, same as transformers, hf correct]
    for s, p in zip(samples, preds):
        ids = [BOS] + tok.encode(s["input"] + s["answer_prefix"])
        x = torch.tensor([ids], device="cuda")
        with torch.no_grad():
            g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=a.max_new,
                               do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
        new = g[0, x.shape[1]:].tolist()
        if EOS in new:
            new = new[:new.index(EOS)]
        hf = tok.decode(new)
        c = cells[s["length"]]
        c[0] += 1
        c[1] += hf == p["prediction"]
        c[2] += hf == s["answer"]
        if hf != p["prediction"]:
            print(f"differs ({s['length']}): transformers {hf!r} longctx {p['prediction']!r}")
    tot = [0, 0, 0]
    print(f"{'length':>8} {'n':>5} {'same%':>7} {'hf_exact%':>9}")
    for L in sorted(cells):
        n, same, ok = cells[L]
        tot = [tot[0] + n, tot[1] + same, tot[2] + ok]
        print(f"{L:>8} {n:>5} {100 * same / n:7.1f} {100 * ok / n:9.1f}")
    print(f"{'all':>8} {tot[0]:>5} {100 * tot[1] / tot[0]:7.1f} {100 * tot[2] / tot[0]:9.1f}")


if __name__ == "__main__":
    main()
