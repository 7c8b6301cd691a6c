#!/usr/bin/env python3
"""An independent reading of `longctx quantize`'s output (standard library only).

For each format the tool writes, this decodes the packed tensors from the published layouts
(written here from the format descriptions, not from longctx's code) and checks every dequantized
weight against the dense checkpoint it came from: within the round-to-nearest bound of its
format, config.json carrying the format's quantization_config, and every other tensor copied
byte for byte.

usage: quant_reference.py LONGCTX_BINARY DENSE_CHECKPOINT_DIR SCRATCH_DIR
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

DTYPE_SIZE = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4, "F8_E4M3": 1}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], v["shape"], data[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in header.items()}


def values(entry):
    """A flat list of Python numbers."""
    dtype, shape, raw = entry
    count = len(raw) // DTYPE_SIZE[dtype]
    if dtype == "F32":
        return list(struct.unpack("<%df" % count, raw))
    if dtype == "BF16":
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0]
                for h in struct.unpack("<%dH" % count, raw)]
    if dtype == "F16":
        return list(struct.unpack("<%de" % count, raw))
    if dtype == "I32":
        return [v & 0xffffffff for v in struct.unpack("<%di" % count, raw)]
    if dtype == "F8_E4M3":
        return [e4m3(b) for b in raw]
    raise ValueError(dtype)


def e4m3(b):
    """OCP FP8 E4M3: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities."""
    sign = -1.0 if b & 0x80 else 1.0
    exp, mant = (b >> 3) & 0xF, b & 0x7
    if exp == 0xF and mant == 0x7:
        return math.nan
    if exp == 0:
        return sign * mant / 8.0 * 2.0 ** -6
    return sign * (1 + mant / 8.0) * 2.0 ** (exp - 7)


def nib(word, k):
    return (word >> (4 * k)) & 0xF


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble k of a word holds column 8p + AWQ_ORDER[k]


def decode(method, q, t, m, out, inp):
    """[(dequantized value, its quantization step)] in row-major [out, in] order."""
    res = [None] * (out * inp)
    if method in ("fp8", "ct-fp8"):
        w = values(t[m + ".weight"])
        if method == "fp8":
            bo, bi = q["weight_block_size"]
            s = values(t[m + ".weight_scale_inv"])
            assert t[m + ".weight_scale_inv"][1] == [-(-out // bo), -(-inp // bi)]
            cols = -(-inp // bi)
            scale = lambda o, i: s[(o // bo) * cols + i // bi]
        else:
            s = values(t[m + ".weight_scale"])
            assert t[m + ".weight_scale"][1] == [out, 1]
            scale = lambda o, i: s[o]
        for o in range(out):
            for i in range(inp):
                res[o * inp + i] = (w[o * inp + i] * scale(o, i), scale(o, i))
        return res
    g = q["group_size"]
    qw, qz, sc = values(t[m + ".qweight"]), values(t[m + ".qzeros"]), values(t[m + ".scales"])
    assert t[m + ".qzeros"][1] == [inp // g, out // 8]
    assert t[m + ".scales"][1] == [inp // g, out] and t[m + ".scales"][2] and t[m + ".scales"][0] == "F16"
    if method == "awq":
        assert t[m + ".qweight"][1] == [inp, out // 8]
        pos = {c: k for k, c in enumerate(AWQ_ORDER)}
        for i in range(inp):
            for o in range(out):
                qv = nib(qw[i * (out // 8) + o // 8], pos[o % 8])
                zv = nib(qz[(i // g) * (out // 8) + o // 8], pos[o % 8])
                s = sc[(i // g) * out + o]
                res[o * inp + i] = ((qv - zv) * s, s)
        return res
    assert t[m + ".qweight"][1] == [inp // 8, out]
    gidx = values(t[m + ".g_idx"])
    assert gidx == [i // g for i in range(inp)]
    offset = 1 if q["checkpoint_format"] == "gptq" else 0
    for i in range(inp):
        for o in range(out):
            qv = nib(qw[(i // 8) * out + o], i % 8)
            zv = nib(qz[gidx[i] * (out // 8) + o // 8], o % 8) + offset
            if q["sym"]:
                assert zv == 8, (m, zv)
            s = sc[gidx[i] * out + o]
            res[o * inp + i] = ((qv - zv) * s, s)
    return res


def check(binary, dense_dir, scratch, method, flags, expect_config):
    out_dir = os.path.join(scratch, method + "".join(flags).replace("-", "_"))
    shutil.rmtree(out_dir, ignore_errors=True)
    subprocess.run([binary, "quantize", "--model", dense_dir, "--output", out_dir,
                    "--method", method] + flags, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "config.json")) as f:
        q = json.load(f)["quantization_config"]
    for k, v in expect_config.items():
        assert q.get(k) == v, (method, flags, k, q.get(k), v)
    dense = read_safetensors(os.path.join(dense_dir, "model.safetensors"))
    quant = read_safetensors(os.path.join(out_dir, "model.safetensors"))
    linears = 0
    worst = 0.0
    for name, entry in dense.items():
        m = name[:-len(".weight")]
        is_linear = ".layers." in name and name.endswith("_proj.weight")
        if not is_linear:
            assert quant[name] == entry, ("copied tensor differs", name)
            continue
        linears += 1
        out, inp = entry[1]
        orig = values(entry)
        for o_i, (dq, step) in enumerate(decode(method, q, quant, m, out, inp)):
            w = orig[o_i]
            if method in ("fp8", "ct-fp8"):
                # Three mantissa bits: half a step of w's binade (relative 2^-4), or half the
                # subnormal spacing (2^-9 x scale) near zero.
                bound = abs(w) * 2 ** -4 + step * 2 ** -10
            else:
                bound = step  # within one step: round to nearest, the group's end values clamped
            err = abs(dq - w)
            assert err <= bound * (1 + 1e-6), (method, flags, name, o_i, w, dq, bound)
            worst = max(worst, err / bound if bound else 0)
    assert linears == 21, linears
    assert worst > 0.1, ("suspiciously exact", method, worst)
    print("%-8s %-24s %d linears, worst error / bound %.3f" % (method, " ".join(flags), linears, worst))
    shutil.rmtree(out_dir)


def main():
    binary, dense_dir, scratch = sys.argv[1:4]
    os.makedirs(scratch, exist_ok=True)
    check(binary, dense_dir, scratch, "fp8", [],
          {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
           "weight_block_size": [128, 128]})
    check(binary, dense_dir, scratch, "ct-fp8", [],
          {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"]})
    check(binary, dense_dir, scratch, "awq", [],
          {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
           "version": "gemm"})
    for flags, sym, fmt in (([], True, "gptq"), (["--asym"], False, "gptq"),
                            (["--asym", "--gptq-v2"], False, "gptq_v2")):
        check(binary, dense_dir, scratch, "gptq", flags,
              {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
               "sym": sym, "checkpoint_format": fmt})
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
