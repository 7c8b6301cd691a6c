"""Calibration for the GPU-vs-CPU KL bound: how far transformers' own bf16 forward (sdpa) is
from its float32 forward on the fixtures' reference prompts (GPU machine):
  python3 tests/gpu_models/hf_bf16_kl.py tests/data/fixtures/tiny-qwen3 515 [bfloat16,float16]
Prints per-position KL(fp32 || bf16): max, mean, and top-1 agreement where the fp32 margin > 0.05.
"""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    model_dir, length = sys.argv[1], int(sys.argv[2])
    ref = json.load(open(os.path.join(model_dir, "reference.json")))
    ids = next(c["input_ids"] for c in ref["cases"] if c["prompt_len"] == length)
    x = torch.tensor([ids], device="cuda")
    out = {}
    low = [getattr(torch, n) for n in (sys.argv[3].split(",") if len(sys.argv) > 3 else ["bfloat16"])]
    for dt in [torch.float32] + low:
        m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="sdpa")
        m = m.to(dtype=dt).cuda().eval()  # .to() rounds inv_freq as the fixtures' reference did
        with torch.no_grad():
            out[dt] = m(x).logits[0].float()
    lp = torch.log_softmax(out[torch.float32], -1)
    top2 = out[torch.float32].topk(2, -1).values
    conf = (top2[:, 0] - top2[:, 1]) > 0.05
    for dt in low:
        lq = torch.log_softmax(out[dt], -1)
        kl = (lp.exp() * (lp - lq)).sum(-1)
        agree = (out[torch.float32].argmax(-1) == out[dt].argmax(-1))[conf]
        print(f"{os.path.basename(model_dir)}[{length}] transformers {str(dt)[6:]} vs fp32: KL max "
              f"{kl.max().item():.2e} mean {kl.mean().item():.2e}, top-1 "
              f"{agree.sum().item()}/{agree.numel()}")


if __name__ == "__main__":
    main()
