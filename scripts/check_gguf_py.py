#!/usr/bin/env python3
"""Cross-check our quantizers and dequantizers against the `gguf` Python
package (PyPI `gguf`, an independent numpy implementation of ggml's formats).

1. Dequantize every tensor of the SmolLM2 Q4_1 model with `cachefit quantize
   ... F32` and with `gguf.quants.dequantize`: bit-identical f32.
2. For every type, quantize the model with `cachefit quantize`, dequantize
   the result both ways: bit-identical f32 for every tensor.
3. Quantize the f32 model with `cachefit quantize` and with
   `gguf.quants.quantize` for every type gguf-py implements: byte-identical
   blocks.

Usage: scripts/check_gguf_py.py --bin target/release/cachefit --model FILE [--types Q4_0,...]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType as V, GGMLQuantizationType as T
from gguf import quants

ALL_TYPES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL",
             "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "TQ1_0", "TQ2_0"]
# Types whose quantizer gguf-py implements (besides F32/F16).
PY_QUANTIZE = {T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.TQ1_0, T.TQ2_0}


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")


def tensors(path):
    return {t.name: t for t in GGUFReader(path).tensors}


def without_vocab(src, dst):
    """Copy the f32 model without its tokenizer arrays. GGUFReader parses
    every metadata string in Python (~100k vocabulary and merge strings: seconds
    per file), and this script opens dozens of files derived from this one;
    the checks here are about tensors, not metadata."""
    r = GGUFReader(src)
    w = GGUFWriter(dst, r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name.startswith("tokenizer.ggml."):
            continue
        sub = f.types[-1] if f.types[0] == V.ARRAY else None
        w.add_key_value(name, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def py_dequant(t):
    return np.asarray(quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32).reshape(-1)


def ours_f32(t):
    assert t.tensor_type == T.F32, t.name
    return np.asarray(t.data, dtype=np.float32).reshape(-1)


def sampled(name, max_layer):
    """Keep non-layer tensors and layers below max_layer (None: keep all)."""
    if max_layer is None or not name.startswith("blk."):
        return True
    return int(name.split(".")[1]) < max_layer


def compare_dequant(label, q, f, max_layer=None):
    """Every tensor of q, dequantized by gguf-py, equals (bitwise) the same
    tensor in f (dequantized by cachefit). Both: name → tensor."""
    q = {k: v for k, v in q.items() if sampled(k, max_layer)}
    seen = {}
    bad = 0
    for name, t in q.items():
        ref = py_dequant(t)
        got = ours_f32(f[name])
        seen[t.tensor_type.name] = seen.get(t.tensor_type.name, 0) + 1
        if ref.shape != got.shape or not np.array_equal(ref.view(np.uint32), got.view(np.uint32)):
            diff = np.flatnonzero(ref.view(np.uint32) != got.view(np.uint32)) if ref.shape == got.shape else []
            print(f"  MISMATCH {label}: {name} ({t.tensor_type.name}) {len(diff)} elements differ, first at {diff[:5]}")
            bad += 1
    kinds = ", ".join(f"{k}×{v}" for k, v in sorted(seen.items()))
    print(f"  dequantize {label}: {len(q)} tensors ({kinds}): {'OK' if bad == 0 else f'{bad} MISMATCHED'}")
    return bad


def compare_quant(label, o, f, max_layer=None):
    """Tensors of o whose type gguf-py can quantize equal (bytewise) gguf-py's
    quantization of the same f32 data in f."""
    n = bad = 0
    for name, t in o.items():
        if t.tensor_type not in PY_QUANTIZE or not sampled(name, max_layer):
            continue
        src = ours_f32(f[name]).reshape(f[name].data.shape)
        ref = np.asarray(quants.quantize(src, t.tensor_type)).view(np.uint8).reshape(-1)
        got = np.asarray(t.data).view(np.uint8).reshape(-1)
        n += 1
        if not np.array_equal(ref, got):
            diff = np.flatnonzero(ref != got) if ref.shape == got.shape else []
            print(f"  MISMATCH {label}: {name} ({t.tensor_type.name}) {len(diff)} bytes differ, first at {diff[:5]}")
            bad += 1
    print(f"  quantize {label}: {n} tensors compared with gguf.quants.quantize: {'OK' if bad == 0 else f'{bad} MISMATCHED'}")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--types", default=",".join(ALL_TYPES))
    ap.add_argument("--layers", type=int, default=4,
                    help="per quantized type, compare tensors of the first N layers (plus all non-layer tensors); "
                         "0 = all. The shipped model is always compared in full.")
    a = ap.parse_args()
    bad = 0
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        full = os.path.join(d, "model-f32-full.gguf")
        run([a.bin, "quantize", a.model, full, "F32", "--allow-requantize"])
        bad += compare_dequant("SmolLM2 (as shipped)", tensors(a.model), tensors(full))
        f32 = os.path.join(d, "model-f32.gguf")
        without_vocab(full, f32)
        os.remove(full)
        f32_tensors = tensors(f32)
        for ty in a.types.split(","):
            qpath = os.path.join(d, f"model-{ty}.gguf")
            back = os.path.join(d, f"model-{ty}-f32.gguf")
            # From the f32 model: not a requantization, and gguf-py can redo it.
            # --pure: the type itself on every tensor it fits (a name like Q2_K
            # alone means llama.cpp's mix, which may not use that type at all).
            run([a.bin, "quantize", f32, qpath, ty, "--pure"])
            run([a.bin, "quantize", qpath, back, "F32", "--allow-requantize"])
            max_layer = a.layers or None
            q_tensors = tensors(qpath)
            bad += compare_dequant(ty, q_tensors, tensors(back), max_layer)
            bad += compare_quant(ty, q_tensors, f32_tensors, max_layer)
            os.remove(back)
            os.remove(qpath)
    print(f"gguf-py cross-check: {'all identical' if bad == 0 else f'{bad} tensors differ'} ({time.time() - t0:.0f} s)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
