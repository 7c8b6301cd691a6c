"""Reference fixtures for the model families of issues 44-46 (Gemma 3, Mistral sliding window,
Qwen3-MoE, Qwen2-MoE's shared expert, Qwen3-Next, Qwen3.5), made with transformers + torch on a
machine that has them (the GPU machine: no internet, so every config is built here and every
weight is random). Same layout, weights and cases as make_rope_fixtures.py (whose helpers this
reuses): config.json, generation_config.json, model.safetensors (bf16), reference.json and
logits_<n>.npy for prompts of 1, 7, 64, 515, 2048 tokens, greedy continuations at 7 and 515.

  tiny-gemma3         Gemma3ForCausalLM: 6 layers, five sliding (window 48) to one global, as
                      Gemma 3's pattern; query_pre_attn_scalar 24 (not head_dim 32), local rope
                      base 1e4, global 1e6 with linear scaling 8 (Gemma 3 4B-27B's), tied head
  tiny-mistral-sw     MistralForCausalLM with sliding_window 48
  tiny-qwen3-moe      Qwen3MoeForCausalLM: 8 experts, top-2 with norm_topk_prob, layer 1 dense
                      (mlp_only_layers)
  tiny-qwen2-moe      Qwen2MoeForCausalLM: 8 experts, top-2 without norm_topk_prob, a shared
                      expert with its sigmoid gate
  tiny-qwen3-next     Qwen3NextForCausalLM: 3 Gated DeltaNet layers to 1 gated full-attention
                      layer, partial rope 0.25, MoE with a shared expert (transformers' torch
                      fallback for the delta rule when flash-linear-attention is not installed)
  tiny-qwen3.5        Qwen3_5ForCausalLM (Qwen3_5TextConfig): tiny-qwen3-next's layers with the
                      Gated DeltaNet projections stored apart (in_proj_qkv, _z, _b, _a) and a
                      dense MLP on every layer; rope_parameters with Qwen3-VL's multimodal
                      sections (mrope_section, mrope_interleaved: text positions on all axes)
  tiny-qwen3.5-moe    Qwen3_5MoeForCausalLM (Qwen3_5MoeTextConfig): 8 experts top-2 (always
                      renormalized) and a shared expert on every layer
  tiny-qwen3.5-vl     Qwen3_5ForConditionalGeneration: tiny-qwen3.5's text model (under
                      model.language_model.*) with a one-block vision tower (model.visual.*);
                      the logits from text-only input_ids

A family whose class this transformers lacks is reported and skipped; the log lists the Qwen3*
classes it has. Usage (on the GPU machine, from the repository root):
  python3 tests/data/make_family_fixtures.py --out /tmp/family-fixtures
  python3 tests/data/make_family_fixtures.py --out /tmp/ff --only tiny-qwen3.5 tiny-qwen3.5-moe \
      tiny-qwen3.5-vl
"""

import argparse
import inspect
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_rope_fixtures as mrf  # noqa: E402  (the shared helpers)

import transformers  # noqa: E402

VOCAB = mrf.VOCAB
COMMON = dict(vocab_size=VOCAB, hidden_size=64, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)


def takes(cls, name):
    return name in inspect.signature(cls.__init__).parameters


def gemma3():
    from transformers import Gemma3TextConfig
    kw = dict(COMMON, intermediate_size=128, num_hidden_layers=6, num_attention_heads=2,
              num_key_value_heads=1, head_dim=32, max_position_embeddings=4096,
              query_pre_attn_scalar=24, sliding_window=48, tie_word_embeddings=True,
              hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
              attn_logit_softcapping=None, pad_token_id=0)
    types = ["sliding_attention"] * 5 + ["full_attention"]
    if takes(Gemma3TextConfig, "layer_types"):
        kw["layer_types"] = types
    else:
        kw["sliding_window_pattern"] = 6
    glob = {"rope_type": "linear", "factor": 8.0}
    if takes(Gemma3TextConfig, "rope_local_base_freq"):  # 4.x spelling
        return Gemma3TextConfig(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling=glob, **kw)
    return Gemma3TextConfig(rope_parameters={
        "full_attention": dict(glob, rope_theta=1e6),
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, **kw)


def mistral_sw():
    from transformers import MistralConfig
    return mrf.make_config(MistralConfig, {"rope_type": "default"}, 1e6, **dict(
        COMMON, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, sliding_window=48,
        tie_word_embeddings=False))


def qwen3_moe():
    from transformers import Qwen3MoeConfig
    return mrf.make_config(Qwen3MoeConfig, {"rope_type": "default"}, 1e6, **dict(
        COMMON, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=4096, tie_word_embeddings=False, use_sliding_window=False))


def qwen2_moe():
    from transformers import Qwen2MoeConfig
    return mrf.make_config(Qwen2MoeConfig, {"rope_type": "default"}, 1e6, **dict(
        COMMON, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[], num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, tie_word_embeddings=False, use_sliding_window=False))


def qwen3_next():
    from transformers import Qwen3NextConfig
    kw = dict(COMMON, intermediate_size=96, moe_intermediate_size=32,
              shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              max_position_embeddings=4096, tie_word_embeddings=False,
              linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4)
    types = ["linear_attention"] * 3 + ["full_attention"]
    if takes(Qwen3NextConfig, "layer_types"):
        kw["layer_types"] = types
    else:
        kw["full_attention_interval"] = 4
    return mrf.make_config(Qwen3NextConfig, {"rope_type": "default"}, 1e4, partial=0.25, **kw)


# Qwen3.5's text config: tiny-qwen3-next's sizes (4 layers: 3 linear, 1 full; head_dim 32 with a
# quarter rotated: 4 frequencies, split 2 / 1 / 1 over the multimodal axes).
QWEN3_5_TEXT = dict(COMMON, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, max_position_embeddings=4096, tie_word_embeddings=False,
                    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                    linear_num_key_heads=2, linear_num_value_heads=4)
MROPE = {"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True}


def qwen3_5_text_config(cls, **extra):
    kw = dict(QWEN3_5_TEXT, **extra)
    if takes(cls, "layer_types"):
        kw["layer_types"] = ["linear_attention"] * 3 + ["full_attention"]
    else:
        kw["full_attention_interval"] = 4
    return mrf.make_config(cls, MROPE, 1e4, partial=0.25, **kw)


def qwen3_5():
    from transformers import Qwen3_5TextConfig
    return qwen3_5_text_config(Qwen3_5TextConfig, intermediate_size=96)


def qwen3_5_moe():
    # No intermediate_size, norm_topk_prob, decoder_sparse_step or mlp_only_layers: the class
    # deletes them (every layer sparse, the top-k always renormalized).
    from transformers import Qwen3_5MoeTextConfig
    return qwen3_5_text_config(Qwen3_5MoeTextConfig, moe_intermediate_size=32,
                               shared_expert_intermediate_size=48, num_experts=8,
                               num_experts_per_tok=2)


def qwen3_5_vl():
    # The vision tower at its smallest: one block of 32 wide (2 heads), patches of 4, a 4 x 4
    # grid of position embeddings, merged 2 x 2 into the text model's width. Image token ids
    # stay at their defaults, outside the 512-token vocabulary, so no prompt holds one.
    from transformers import Qwen3_5Config, Qwen3_5TextConfig, Qwen3_5VisionConfig
    text = qwen3_5()
    vision = Qwen3_5VisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                 in_channels=3, patch_size=4, spatial_merge_size=2,
                                 temporal_patch_size=2, out_hidden_size=text.hidden_size,
                                 num_position_embeddings=16)
    assert isinstance(text, Qwen3_5TextConfig)
    return Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)


def model_class(name):
    return getattr(transformers, name)


# (name, config maker, seed, model class: None for AutoModelForCausalLM's)
FAMILIES = [("tiny-gemma3", gemma3, 4501, None), ("tiny-mistral-sw", mistral_sw, 4502, None),
            ("tiny-qwen3-moe", qwen3_moe, 4503, None), ("tiny-qwen2-moe", qwen2_moe, 4504, None),
            ("tiny-qwen3-next", qwen3_next, 4505, None),
            ("tiny-qwen3.5", qwen3_5, 4506, "Qwen3_5ForCausalLM"),
            ("tiny-qwen3.5-moe", qwen3_5_moe, 4507, "Qwen3_5MoeForCausalLM"),
            ("tiny-qwen3.5-vl", qwen3_5_vl, 4508, "Qwen3_5ForConditionalGeneration")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="family-fixtures")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", nargs="*", help="names of FAMILIES to make (default: all)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print("transformers", transformers.__version__,
          "Qwen3*/Gemma3* classes:", [n for n in dir(transformers)
                                     if n.startswith(("Qwen3", "Gemma3"))
                                     and n.endswith(("ForCausalLM", "ForConditionalGeneration"))])
    names = [f[0] for f in FAMILIES]
    unknown = [n for n in args.only or [] if n not in names]
    if unknown:
        ap.error(f"unknown --only names {unknown} (known: {names})")
    failed = []
    for name, make, seed, cls in FAMILIES:
        if args.only and name not in args.only:
            continue
        try:
            mrf.make_model(args.out, name, make(), None, seed, args.device,
                           model_class(cls) if cls else None)
        except Exception:  # report and go on: one missing class must not lose the others
            traceback.print_exc()
            failed.append(name)
    if failed:
        print("FAILED:", failed)
        sys.exit(1)


if __name__ == "__main__":
    main()
