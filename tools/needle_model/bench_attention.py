"""Times one training step of the needle model per SDPA backend (GPU), to pick train.py's --attn.

  python3 tools/needle_model/bench_attention.py [--lengths 4096,16384,32768] [--steps 8]

At 16K-32K tokens attention is most of a step's work (the model has 4.7M parameters), so the
attention kernel sets the training speed of the long-context stages. For each backend and
length: a step = forward, loss on the last 16 positions of each row, backward, AdamW, on 65,536
tokens, bf16 autocast as in train.py; median of --steps timed steps after 3 warm-up steps.
`gqa` = SDPA's enable_gqa (transformers' default on CUDA), `repeat` = K/V repeated to the query
heads first (some backends refuse enable_gqa); registered flash-attention implementations (FA3,
FA4 on torch >= 2.9) are tried where their modules are installed. Also checks that the backends
agree: loss and gradient norm of one batch from the same weights, relative to flash.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


@contextlib.contextmanager
def kv_mode(mode: str):
    """mode 'repeat': transformers repeats K/V to the query heads instead of enable_gqa."""
    import transformers.integrations.sdpa_attention as sa
    keep = sa.use_gqa_in_sdpa
    if mode == "repeat":
        sa.use_gqa_in_sdpa = lambda *args, **kwargs: False
    try:
        yield
    finally:
        sa.use_gqa_in_sdpa = keep


@contextlib.contextmanager
def flash_impl(name: str, impls: list):
    """A registered flash-attention implementation (torch >= 2.9: 'FA3', 'FA4') for FLASH."""
    import torch
    if name not in impls:
        yield
        return
    torch.nn.attention.activate_flash_attention_impl(name)
    try:
        yield
    finally:
        torch.nn.attention.restore_flash_attention_impl()


def step_fn(model, opt, ids):
    import torch
    import torch.nn.functional as F
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = model.model(input_ids=ids, use_cache=False).last_hidden_state  # [B, L, H]
        logits = model.lm_head(h[:, -17:-1]).float()  # [B, 16, vocab]
    loss = F.cross_entropy(logits.flatten(0, 1), ids[:, -16:].flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss, gn


def main() -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import train as needle_train
    from transformers import LlamaForCausalLM

    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="4096,16384,32768")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--model-shape", choices=list(needle_train.MODEL_SHAPES), default="v1",
                    help="train.py's model shapes")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, cuDNN "
          f"{torch.backends.cudnn.version()}", flush=True)
    try:  # torch >= 2.9: other flash-attention implementations can be registered (e.g. FA3)
        print("flash impls:", torch.nn.attention.list_flash_attention_impls(),
              "current:", torch.nn.attention.current_flash_attention_impl())
    except AttributeError:
        pass
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION}
    torch.manual_seed(0)
    base = LlamaForCausalLM._from_config(
        needle_train.model_config(needle_train.MODEL_SHAPES[a.model_shape]),
        attn_implementation="sdpa", dtype=torch.float32).cuda()
    state = {k: v.clone() for k, v in base.state_dict().items()}

    def fresh():
        base.load_state_dict(state)
        opt = torch.optim.AdamW(base.parameters(), lr=0.0, fused=True)  # lr 0: weights stay
        return base, opt

    # Agreement: one batch, the same weights, per backend.
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 2045, (4, 4096), generator=g).cuda()
    ref = None
    for name, be in backends.items():
        for mode in ("gqa", "repeat"):
            model, opt = fresh()
            try:
                with sdpa_kernel([be]), kv_mode(mode):
                    loss, gn = step_fn(model, opt, ids)
                lv, gv = loss.item(), gn.item()
            except RuntimeError as e:
                print(f"agree {name}/{mode}: refused ({str(e).splitlines()[0][:100]})")
                continue
            if ref is None:
                ref = (lv, gv)
            print(f"agree {name}/{mode}: loss {lv:.6f} (rel {abs(lv - ref[0]) / ref[0]:.2e}) "
                  f"grad norm {gv:.6f} (rel {abs(gv - ref[1]) / ref[1]:.2e})", flush=True)

    impls = []
    try:
        impls = torch.nn.attention.list_flash_attention_impls()
    except AttributeError:
        pass
    for L in [int(x) for x in a.lengths.split(",")]:
        B = max(1, a.tokens // L)
        ids = torch.randint(0, 2045, (B, L), generator=g).cuda()
        runs = [(n, be, m) for n, be in backends.items() for m in ("gqa", "repeat")]
        runs += [(impl, SDPBackend.FLASH_ATTENTION, "gqa") for impl in impls]
        for name, be, mode in runs:
            model, opt = fresh()
            try:
                with sdpa_kernel([be]), kv_mode(mode), flash_impl(name, impls):
                    for _ in range(3):
                        step_fn(model, opt, ids)
                    torch.cuda.synchronize()
                    times = []
                    for _ in range(a.steps):
                        t = time.perf_counter()
                        step_fn(model, opt, ids)
                        torch.cuda.synchronize()
                        times.append(time.perf_counter() - t)
            except Exception as e:  # noqa: BLE001 (a backend or impl this machine lacks)
                print(f"L={L} B={B} {name}/{mode}: refused ({str(e).splitlines()[0][:100]})")
                continue
            ms = statistics.median(times) * 1e3
            print(f"L={L} B={B} {name}/{mode}: {ms:.1f} ms/step "
                  f"({B * L / ms / 1e3:.2f} M tokens/s)", flush=True)


if __name__ == "__main__":
    main()
