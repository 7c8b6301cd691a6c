"""Reference fixtures for the RoPE variants (issue 44, item 1), made with transformers + torch on
a machine that has them (the GPU machine: no internet, so every config is built here and every
weight is random). Writes, under OUT (default ./rope-fixtures):

  tiny-qwen3-yarn/       Qwen3ForCausalLM, rope yarn factor 4 over original_max_position_embeddings
                         64 (max_position_embeddings 4096, so prompts past 4 x 64 stay in range)
  tiny-llama-dynamic/    LlamaForCausalLM, rope dynamic (NTK) factor 16 over
                         max_position_embeddings 128
  tiny-phi3-longrope/    Phi3ForCausalLM, rope longrope (short/long lists), original 64 of 4096,
                         partial_rotary_factor 0.75 (Phi-4-mini's), fused qkv / gate_up weights
  rope_reference.json    transformers' own inv_freq and attention_scaling for a set of configs
                         (ROPE_INIT_FUNCTIONS called directly), read by tests/ops

Each model folder holds config.json, generation_config.json, model.safetensors (bf16, a few
hundred KB) and reference.json + logits_<n>.npy in the format of tests/data/fixtures/README.md:
cases of prompt_len 1, 7, 64, 515, 2048 (positions 0..n-1, one forward, eager attention, float32
logits of the bf16 weights upcast), the stored rows in logits_positions, and for 7 and 515 tokens
24 greedy tokens with their top-1 minus top-2 margins. Unlike the older fixtures, the model is
loaded with from_pretrained(dtype=float32) and never cast with .to(bfloat16), so inv_freq is exact
float32 (test with ModelBuildOptions::rope_inv_freq_dtype = F32); reference.json says so in
"rope_inv_freq_dtype". Greedy tokens are decoded one forward per token with the KV cache, as
longctx decodes: keys already cached keep the rotation of the forward that made them
(transformers' Phi3ForCausalLM.generate() would instead drop the cache once when the input first
crosses original_max_position_embeddings; no case here crosses it while decoding). Each
reference.json also records the model's rotary buffers ("rope": inv_freq, attention_scaling, and
longrope's long table / dynamic's recomputed tables at the case lengths).

The forward runs on the CPU by default (--device cuda to use the GPU): dynamic NTK recomputes its
base at forward time on the activations' device, and the float32 division torch does on the CPU
is the one longctx's CPU reference mirrors.

Usage (on the GPU machine, from the repository root):
  python3 tests/data/make_rope_fixtures.py --out /tmp/rope-fixtures
  cp -r /tmp/rope-fixtures/* tests/data/fixtures/
Then add the tests that read them (tests/data/fixtures/README.md, "RoPE variants").
"""

import argparse
import inspect
import json
import math
import os

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

VOCAB = 512
LENGTHS = [1, 7, 64, 515, 2048]
GREEDY_LENGTHS = {7, 515}
GREEDY_NEW = 24


def make_config(cls, rope: dict, theta: float, partial: float = None, **kw):
    """A config of `cls` with rope parameters `rope` (rope_type + options) and rope_theta `theta`,
    in whichever spelling this transformers takes (rope_parameters in 5.x, rope_scaling +
    rope_theta in 4.x); partial_rotary_factor at the top level where the class takes it, else in
    the rope parameters."""
    params = inspect.signature(cls.__init__).parameters
    rope = dict(rope)
    if partial is not None:
        # Both places, equal: whichever this version reads (the top level in 4.x, the rope
        # parameters or the top level in 5.x) sees the same value; longctx reads either.
        kw["partial_rotary_factor"] = partial
    if "rope_parameters" in params:
        rp = dict(rope)
        rp["rope_theta"] = theta
        rp.setdefault("rope_type", "default")
        if partial is not None:
            rp["partial_rotary_factor"] = partial
        if rp["rope_type"] == "longrope" and "original_max_position_embeddings" in kw:
            rp["original_max_position_embeddings"] = kw["original_max_position_embeddings"]
        return cls(rope_parameters=rp, **kw)
    # 4.x: rope_scaling spells the type "type" for Phi3Config's validation (exactly type,
    # short_factor, long_factor); the other configs accept it too.
    scaling = None
    if rope.get("rope_type", "default") != "default":
        scaling = dict(rope)
        scaling["type"] = scaling.pop("rope_type")
    return cls(rope_theta=theta, rope_scaling=scaling, **kw)


def from_config(config, model_cls=None):
    """The model of `config`: AutoModelForCausalLM's, or `model_cls`'s (a class the causal-LM
    auto mapping does not hold, e.g. a multimodal wrapper)."""
    if model_cls is not None:
        return model_cls(config).to(torch.float32)
    try:
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except TypeError:  # transformers 4.x
        return AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)


def from_pretrained(d, model_cls=None):
    cls = model_cls or AutoModelForCausalLM
    try:
        return cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    except TypeError:  # transformers 4.x
        return cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")


def default_rope(config, device, seq_len=None):
    """transformers 5 keeps "default" out of ROPE_INIT_FUNCTIONS: each model's rotary class
    computes it (compute_default_rope_parameters); Llama's is the one every model copies."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    return LlamaRotaryEmbedding.compute_default_rope_parameters(config, device)


def rope_init(config, rope_type, seq_len=None):
    fn = ROPE_INIT_FUNCTIONS.get(rope_type, default_rope if rope_type == "default" else None)
    if fn is None:
        raise KeyError(f"transformers {transformers.__version__} has no rope type {rope_type}")
    if seq_len is None:
        inv, scale = fn(config, "cpu")
    else:
        # As dynamic_rope_update passes it: torch.max(position_ids) + 1, an int64 tensor.
        inv, scale = fn(config, "cpu", seq_len=torch.tensor(seq_len, dtype=torch.int64))
    return [float(v) for v in inv.float().tolist()], float(scale)


def original_max(config):
    """longrope's switch length: the top-level field (Phi3Config) or the rope parameters'."""
    v = getattr(config, "original_max_position_embeddings", None)
    if v is None:
        v = getattr(config, "rope_parameters", {}).get("original_max_position_embeddings")
    return v


def longrope_lists(half: int):
    # Shaped like Phi-3's: short near 1, long growing over the low frequencies.
    short = [1.0 + 0.05 * (i / (half - 1)) ** 2 for i in range(half)]
    long = [1.0 + 40.0 * (i / (half - 1)) ** 3 for i in range(half)]
    return short, long


# --- the tiny checkpoints -------------------------------------------------------------------

def qwen3_yarn():
    from transformers import Qwen3Config
    return make_config(
        Qwen3Config,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        10000.0,
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
        use_sliding_window=False)


def llama_dynamic():
    from transformers import LlamaConfig
    return make_config(
        LlamaConfig, {"rope_type": "dynamic", "factor": 16.0}, 10000.0,
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def phi3_longrope():
    from transformers import Phi3Config
    head_dim, partial = 32, 0.75
    half = int(head_dim * partial) // 2
    short, long = longrope_lists(half)
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
              original_max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, sliding_window=None)
    return make_config(Phi3Config, {"rope_type": "longrope", "short_factor": short,
                                    "long_factor": long}, 10000.0, partial=partial, **kw)


def randomize(model, seed):
    """Random weights rounded to bf16 (what the checkpoint holds); norms and biases moved off
    their defaults so a missing one shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.2 * (torch.rand(p.shape, generator=g) - 0.5))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=g))
            p.copy_(p.to(torch.bfloat16).float())


def logits_positions(n):
    if n <= 64:
        return list(range(n))
    return sorted(set(range(0, n, 97)) | set(range(n - 8, n)))


def greedy(model, ids, device):
    """24 greedy tokens, one forward per token over the KV cache; margins = top1 - top2."""
    # No cache passed in: each model makes its own kind (a hybrid model's linear-attention state,
    # a sliding-window model's layers), as generate() would.
    x = torch.tensor([ids], device=device)
    out = model(input_ids=x, use_cache=True)
    tokens, margins = [], []
    pos = len(ids)
    for _ in range(GREEDY_NEW):
        last = out.logits[0, -1].float()
        top2 = last.topk(2).values
        t = int(last.argmax())
        tokens.append(t)
        margins.append(float(top2[0] - top2[1]))
        out = model(input_ids=torch.tensor([[t]], device=device), past_key_values=out.past_key_values,
                    position_ids=torch.tensor([[pos]], device=device), use_cache=True)
        pos += 1
    return tokens, margins


def rope_record(model, config, rope_type, lengths):
    if rope_type is None:  # a family fixture: its rope is checked through its logits
        return None
    rot = model.model.rotary_emb
    rec = {"rope_type": rope_type, "inv_freq": [float(v) for v in rot.inv_freq.float().tolist()],
           "attention_scaling": float(rot.attention_scaling)}
    if rope_type == "longrope":
        rec["long_inv_freq"], _ = rope_init(config, "longrope", original_max(config) + 1)
    if rope_type == "dynamic":
        rec["dynamic"] = [{"seq_len": n, "inv_freq": rope_init(config, "dynamic", n)[0]}
                          for n in lengths if n > config.max_position_embeddings]
    return rec


def make_model(out_dir, name, config, rope_type, seed, device, model_cls=None):
    from safetensors.torch import load_file
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = from_config(config, model_cls)
    randomize(model, seed)
    model = model.to(torch.bfloat16)  # saved in bf16 (the values are already bf16)
    model.save_pretrained(d)  # safetensors, config.json, generation_config.json
    # What the engine loads: from disk, upcast to float32, inv_freq made in float32.
    ref = from_pretrained(d, model_cls).to(device).eval()
    assert all(t.dtype == torch.bfloat16 for t in load_file(os.path.join(d, "model.safetensors")).values())
    rng = np.random.default_rng(seed)
    cases = []
    with torch.no_grad():
        for n in LENGTHS:
            ids = [int(v) for v in rng.integers(3, VOCAB, size=n)]
            logits = ref(input_ids=torch.tensor([ids], device=device)).logits[0].float().cpu()
            rows = logits_positions(n)
            f = f"logits_{n}.npy"
            np.save(os.path.join(d, f), logits[rows].numpy().astype(np.float32))
            case = {"prompt_len": n, "input_ids": ids, "logits_file": f, "logits_positions": rows}
            if n in GREEDY_LENGTHS:
                case["greedy_new_tokens"], case["greedy_margins"] = greedy(ref, ids, device)
            cases.append(case)
    reference = {"model": name, "transformers": transformers.__version__,
                 "torch": torch.__version__, "device": device, "rope_inv_freq_dtype": "float32",
                 "rope": rope_record(ref, ref.config, rope_type, LENGTHS), "cases": cases}
    with open(os.path.join(d, "reference.json"), "w") as fh:
        json.dump(reference, fh)
    size = os.path.getsize(os.path.join(d, "model.safetensors"))
    keys = sorted(load_file(os.path.join(d, "model.safetensors")).keys())
    with open(os.path.join(d, "config.json")) as fh:
        arch = json.load(fh).get("architectures")
    print(f"{name} ({arch}): {size / 1024:.0f} KB of weights, {len(cases)} cases, rope "
          f"{reference['rope'] and reference['rope']['attention_scaling']}; tensors: {keys[:40]}")


# --- transformers' own frequencies for configs of real models' shapes -----------------------

def rope_reference(out_dir):
    from transformers import LlamaConfig, Phi3Config, Qwen3Config
    entries = []

    def add(name, config, rope_type, seq_lens=()):
        inv, scale = rope_init(config, rope_type)
        e = {"name": name, "config": config.to_dict(), "inv_freq": inv, "attention_scaling": scale}
        # Our loader parses the rope of every supported architecture alike; Phi3 is not one yet.
        e["config"]["architectures"] = ["LlamaForCausalLM"]
        if rope_type == "longrope":
            e["long_inv_freq"], _ = rope_init(config, rope_type, original_max(config) + 1)
        if rope_type == "dynamic":
            e["dynamic"] = [{"seq_len": n, "inv_freq": rope_init(config, rope_type, n)[0]}
                            for n in seq_lens]
        entries.append(e)

    qwen3_8b = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                    num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                    head_dim=128)
    # Qwen's recipe as users apply it: max_position_embeddings left at 40960 (4 x 32768 =
    # 131072 is not 40960: shows whether transformers uses the explicit factor).
    add("qwen3-8b-yarn-recipe", make_config(
        Qwen3Config, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        1e6, max_position_embeddings=40960, **qwen3_8b), "yarn")
    add("qwen3-8b-yarn-128k", make_config(
        Qwen3Config, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        1e6, max_position_embeddings=131072, **qwen3_8b), "yarn")
    # DeepSeek-V3-style yarn (mscale pairs) on a Llama config of rotary head 64.
    llama = dict(vocab_size=1024, hidden_size=2048, intermediate_size=4096, num_hidden_layers=2,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=64)
    for ms, msa in ((1.0, 1.0), (1.0, 0.707), (0.707, 0.0)):
        add(f"yarn-deepseek-mscale-{ms}-{msa}", make_config(
            LlamaConfig, {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                          "beta_fast": 32, "beta_slow": 1, "mscale": ms, "mscale_all_dim": msa},
            10000.0, max_position_embeddings=163840, **llama), "yarn")
    # gpt-oss-style: no truncation, explicit attention_factor absent.
    add("yarn-untruncated", make_config(
        LlamaConfig, {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
        150000.0, max_position_embeddings=131072, **llama), "yarn")
    add("yarn-attention-factor", make_config(
        LlamaConfig, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                      "attention_factor": 1.25}, 500000.0, max_position_embeddings=65536, **llama),
        "yarn")
    # Phi-3-mini-128k shapes (head_dim 96) and Phi-4-mini (128 with partial 0.75).
    for name, hidden, heads, partial in (("phi3-mini-128k-like", 3072, 32, None),
                                         ("phi4-mini-like", 3072, 24, 0.75)):
        head_dim = hidden // heads
        half = int(head_dim * (partial or 1.0)) // 2
        short, long = longrope_lists(half)
        add(name, make_config(
            Phi3Config, {"rope_type": "longrope", "short_factor": short, "long_factor": long},
            10000.0, partial=partial, vocab_size=1024, hidden_size=hidden, intermediate_size=8192,
            num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=heads // 3 if partial else heads,
            max_position_embeddings=131072, original_max_position_embeddings=4096,
            pad_token_id=0, sliding_window=None), "longrope")
    add("llama-dynamic", make_config(
        LlamaConfig, {"rope_type": "dynamic", "factor": 2.0}, 500000.0,
        max_position_embeddings=8192, **llama), "dynamic", seq_lens=(8193, 10000, 16384, 100000))
    add("llama-dynamic-1.3-partial", make_config(
        LlamaConfig, {"rope_type": "dynamic", "factor": 1.3}, 10000.0, partial=0.5,
        max_position_embeddings=4096, **llama), "dynamic", seq_lens=(4097, 5000, 65536))
    add("default-partial-0.25", make_config(
        LlamaConfig, {"rope_type": "default"}, 10000.0, partial=0.25,
        max_position_embeddings=4096, **llama), "default")
    path = os.path.join(out_dir, "rope_reference.json")
    with open(path, "w") as fh:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "entries": entries}, fh)
    print(f"rope_reference.json: {len(entries)} configs")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="rope-fixtures")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import traceback
    failed = []
    for name, job in (
            ("tiny-qwen3-yarn", lambda: make_model(args.out, "tiny-qwen3-yarn", qwen3_yarn(),
                                                   "yarn", 4401, args.device)),
            ("tiny-llama-dynamic", lambda: make_model(args.out, "tiny-llama-dynamic",
                                                      llama_dynamic(), "dynamic", 4402,
                                                      args.device)),
            ("tiny-phi3-longrope", lambda: make_model(args.out, "tiny-phi3-longrope",
                                                      phi3_longrope(), "longrope", 4403,
                                                      args.device)),
            ("rope_reference.json", lambda: rope_reference(args.out))):
        try:  # one failure must not lose the others
            job()
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        raise SystemExit(f"FAILED: {failed}")


if __name__ == "__main__":
    main()
