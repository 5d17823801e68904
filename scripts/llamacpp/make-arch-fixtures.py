#!/usr/bin/env python3
"""Tiny random-weight GGUF models + llama.cpp reference logits for the
architectures cachefit adds next to llama (crates/model/tests/fixtures/arch/).

For each model below: write a deterministic F32 GGUF with the `gguf` package
(seeded numpy RNG, metadata keys as llama.cpp's convert_hf_to_gguf.py writes
them), quantize it with llama-quantize (unless the target is F32), run
dump_logits (scripts/llamacpp/dump_logits.cpp, `--ids`) on 3 prompts of token
ids, and write NAME.gguf + NAME.json. The JSON has the SmolLM2 fixtures'
per-prompt structure plus `arch`, `model`, `model_sha256`, `settings`,
`notes` (features, the formulas llama.cpp uses, with file:function citations),
`gguf` (every metadata key but the token arrays, and every tensor's
ggml shape ne0.. and type, read back from the written file) and `numpy_check`
(a float64 numpy forward pass that follows the notes' formulas on the file's
dequantized weights, compared with llama.cpp's logits).

    scripts/llamacpp/make-arch-fixtures.py [--build DIR] [--only NAME ...] [--no-check]
    scripts/llamacpp/make-arch-fixtures.py --effects   # how much each feature moves the logits

Needs numpy and gguf==0.19.0 (pip), and a build-llamacpp.sh build
(default $LLAMACPP_BUILD or ~/.cache/cachefit/llamacpp-build) whose
dump_logits knows --ids / --n-ctx. Scratch files (the F32 models before
quantization, logs) go to ~/.cache/cachefit/arch-fixtures.
"""
import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import gguf

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CACHE = os.environ.get("CACHEFIT_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cachefit")
OUT = os.path.join(ROOT, "crates", "model", "tests", "fixtures", "arch")

N_POS = 64
N_GREEDY = 32
PROMPT_LENS = (6, 17, 40)  # prompt 0 starts with BOS (id 1); ids otherwise uniform in [3, n_vocab)
MARGIN = 0.02    # prompt selection: no near-ties (see margin_of)
MAX_TRIES = 100

# ---------------------------------------------------------------------------
# vocabulary: SPM ("llama") with <unk>, <s>, </s>, 256 byte tokens, 28 pieces and a
# final control token <|endoftext|> (llama-vocab.cpp requires it when general.name
# contains "phi3" or "phi-3": it sets token attributes by name with token_to_id.at()).
PIECES = ["▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁it", "▁that", "▁was",
          "▁on", "▁for", "▁with", "▁as", "▁at", "▁by", "▁be", "▁this", "▁from", "▁or",
          "▁an", "▁are", "▁not", "▁but", "▁we", "▁he", "▁she", "▁they"]
TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + PIECES + ["<|endoftext|>"]
N_VOCAB = len(TOKENS)  # 288
TOKEN_TYPES = [2, 3, 3] + [6] * 256 + [1] * len(PIECES) + [3]  # UNKNOWN, CONTROL, BYTE, NORMAL, CONTROL
SCORES = [0.0] * 259 + [-float(i + 1) for i in range(len(PIECES))] + [0.0]
BOS, EOS, UNK = 1, 2, 0


def llama3_rope_freqs(dim, base, factor, low_freq_factor, high_freq_factor, old_context_len):
    """conversion/llama.py LlamaModel.generate_extra_tensors (rope_type llama3), in float32 as there."""
    freqs = 1.0 / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for freq in freqs.astype(np.float32):
        wavelen = 2 * math.pi / float(freq)
        if wavelen < high_freq_wavelen:
            out.append(1.0)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


# ---------------------------------------------------------------------------
# The models. E = n_embd, H/KV = heads, hd = head_dim, L = layers, FF = n_ff.
MODELS = [
    dict(name="llama-rope-llama3", arch="llama", E=256, H=4, KV=2, hd=64, L=2, FF=256, quant="Q4_0",
         ctx_train=2048, base=500000.0, seed=101,
         llama3=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=256)),
    dict(name="llama-rope-yarn", arch="llama", E=128, H=2, KV=1, hd=64, L=2, FF=128, quant="F32",
         ctx_train=2048, base=10000.0, seed=102,
         yarn=dict(factor=4.0, original_context_length=512)),
    dict(name="llama-rope-linear-swa", arch="llama", E=128, H=2, KV=2, hd=64, L=2, FF=192, quant="F16",
         ctx_train=4096, base=10000.0, seed=103, linear=2.0),
    dict(name="phi3", arch="phi3", E=256, H=4, KV=2, hd=64, L=2, FF=256, quant="Q4_K_M",
         ctx_train=4096, base=10000.0, seed=104, partial_rotary=0.75, orig_ctx=256),
    dict(name="qwen3moe", arch="qwen3moe", E=128, H=4, KV=2, hd=64, L=2, FF=384, quant="Q8_0",
         ctx_train=4096, base=1000000.0, seed=105, n_expert=8, n_expert_used=2, FF_exp=64),
    dict(name="mixtral", arch="llama", E=128, H=2, KV=1, hd=64, L=2, FF=128, quant="Q4_0",
         ctx_train=4096, base=1000000.0, seed=106, n_expert=4, n_expert_used=2),
    dict(name="gemma3", arch="gemma3", E=128, H=4, KV=1, hd=64, L=6, FF=128, quant="Q8_0",
         ctx_train=4096, base=1000000.0, seed=107, sliding_window=8, linear=8.0),
    dict(name="gemma2", arch="gemma2", E=256, H=4, KV=2, hd=64, L=4, FF=256, quant="Q4_K_M",
         ctx_train=4096, seed=108, sliding_window=12, attn_softcap=10.0, final_softcap=10.0),
    # ternary: every layer matrix is trits x a per-256-block scale (a BitNet-style export), so llama-quantize's TQ
    # formats hold it exactly; llama.cpp type TQ2_0 / TQ1_0 in a llama-arch file (issue 24: cross-check of the ternary kernels)
    dict(name="llama-tq2_0", arch="llama", E=256, H=4, KV=2, hd=64, L=2, FF=256, quant="TQ2_0",
         ctx_train=2048, base=10000.0, seed=109, ternary=True),
    dict(name="llama-tq1_0", arch="llama", E=256, H=4, KV=2, hd=64, L=2, FF=512, quant="TQ1_0",
         ctx_train=2048, base=10000.0, seed=110, ternary=True),
]
# extra fixtures of an already built model with other context settings
VARIANTS = {"phi3": [dict(suffix="-nctx256", n_ctx=256)]}


# ---------------------------------------------------------------------------
def build_f32(m, path):
    """Write model m as an all-F32 GGUF (norm and rope-factor vectors stay F32 after quantization)."""
    rng = np.random.default_rng(m["seed"])
    a, E, H, KV, hd, L, FF = m["arch"], m["E"], m["H"], m["KV"], m["hd"], m["L"], m["FF"]
    w = gguf.GGUFWriter(path, a)
    w.add_string("general.type", "model")
    w.add_string("general.name", m["name"])
    w.add_uint32("general.file_type", 0)  # ALL_F32; llama-quantize rewrites it
    k = lambda key: f"{a}.{key}"
    w.add_uint32(k("context_length"), m["ctx_train"])
    w.add_uint32(k("embedding_length"), E)
    w.add_uint32(k("block_count"), L)
    w.add_uint32(k("feed_forward_length"), FF)
    w.add_uint32(k("attention.head_count"), H)
    w.add_uint32(k("attention.head_count_kv"), KV)
    gemma = a in ("gemma2", "gemma3")
    w.add_float32(k("attention.layer_norm_rms_epsilon"), 1e-6 if gemma else 1e-5)
    if "base" in m:
        w.add_float32(k("rope.freq_base"), m["base"])
    if a == "llama":
        w.add_uint32(k("vocab_size"), N_VOCAB)
        w.add_uint32(k("rope.dimension_count"), hd)
    if "yarn" in m:
        w.add_string(k("rope.scaling.type"), "yarn")
        w.add_float32(k("rope.scaling.factor"), m["yarn"]["factor"])
        w.add_uint32(k("rope.scaling.original_context_length"), m["yarn"]["original_context_length"])
    if "linear" in m:
        w.add_string(k("rope.scaling.type"), "linear")
        w.add_float32(k("rope.scaling.factor"), m["linear"])
    if "n_expert" in m:
        w.add_uint32(k("expert_count"), m["n_expert"])
        w.add_uint32(k("expert_used_count"), m["n_expert_used"])
    if a == "qwen3moe":
        w.add_uint32(k("expert_feed_forward_length"), m["FF_exp"])
    n_rot = hd
    if a == "phi3":
        n_rot = int(m["partial_rotary"] * E) // H  # conversion/phi.py: int(rot_pct * n_embd) // n_head
        scale = m["ctx_train"] / m["orig_ctx"]
        attn_factor = math.sqrt(1 + math.log(scale) / math.log(m["orig_ctx"]))
        m["phi3_attn_factor"] = attn_factor
        w.add_uint32(k("rope.scaling.original_context_length"), m["orig_ctx"])
        w.add_uint32(k("rope.dimension_count"), n_rot)
        w.add_uint32(k("attention.sliding_window"), 0)
        w.add_float32(k("rope.scaling.attn_factor"), attn_factor)
    if a in ("qwen3moe", "gemma2", "gemma3"):
        w.add_uint32(k("attention.key_length"), hd)
        w.add_uint32(k("attention.value_length"), hd)
    if a == "gemma2":
        w.add_float32(k("attn_logit_softcapping"), m["attn_softcap"])
        w.add_float32(k("final_logit_softcapping"), m["final_softcap"])
    if gemma:
        w.add_uint32(k("attention.sliding_window"), m["sliding_window"])

    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_scores(SCORES)
    w.add_token_types(TOKEN_TYPES)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_unk_token_id(UNK)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if gemma:
        w.add_add_space_prefix(False)

    f32 = lambda x: np.ascontiguousarray(x, dtype=np.float32)
    # numpy shape (rows, cols) = ggml {ne0 = cols, ne1 = rows}; y = W @ x
    mat = lambda rows, cols, s=1.0: f32(rng.standard_normal((rows, cols)) * (s / math.sqrt(cols)))
    if m.get("ternary"):
        def ternary_mat(rows, cols, s=1.0):
            """Trits uniform in {-1, 0, 1} times a per-(row, 256-block) scale, f16-exact: TQ1_0/TQ2_0 store it
            exactly (quantize_row_tq*_ref: d = block amax = the scale, trit = lroundf(x / d)). Variance of a
            trit is 2/3, hence sqrt(3/2); the scales vary by ~20% so a wrong block scale shows."""
            trits = rng.integers(-1, 2, size=(rows, cols)).astype(np.float32)
            scale = (s / math.sqrt(cols)) * math.sqrt(1.5) * np.exp(0.2 * rng.standard_normal((rows, cols // 256)))
            scale = scale.astype(np.float16).astype(np.float32)
            return f32(trits * np.repeat(scale, 256, axis=1))
        layer_mat = ternary_mat
    else:
        layer_mat = mat
    vec = lambda n, mean=1.0, std=0.1: f32(mean + std * rng.standard_normal(n))
    emb_std = 1.0 / math.sqrt(E) if gemma else 1.0
    tensors = {"token_embd.weight": f32(rng.standard_normal((N_VOCAB, E)) * emb_std)}
    tied = gemma
    if gemma:
        tensors["output_norm.weight"] = vec(E, 3.0, 0.3)  # tied head: the logit scale comes from here
    else:
        tensors["output_norm.weight"] = vec(E)
        tensors["output.weight"] = mat(N_VOCAB, E, 4.0)
    if "llama3" in m:
        p = m["llama3"]
        tensors["rope_freqs.weight"] = llama3_rope_freqs(hd, m["base"], p["factor"], p["low_freq_factor"],
                                                         p["high_freq_factor"], p["original_max_position_embeddings"])
    if a == "phi3":
        i = np.arange(n_rot // 2)
        # long factors grow with the pair index like Phi-3's (1 .. ~scale), short ones stay near 1
        tensors["rope_factors_long.weight"] = f32(1.0 + (m["ctx_train"] / m["orig_ctx"] - 1.0) * (i / (n_rot // 2 - 1)) ** 2)
        tensors["rope_factors_short.weight"] = f32(1.0 + 0.05 * rng.random(n_rot // 2))
    qk = 2.0 if a == "gemma2" else 1.5  # sharper attention so positions matter (gemma2: so the soft cap bites)
    for il in range(L):
        b = f"blk.{il}."
        tensors[b + "attn_norm.weight"] = vec(E)
        if a == "phi3":
            tensors[b + "attn_qkv.weight"] = np.concatenate([mat(H * hd, E, qk), mat(KV * hd, E, qk), mat(KV * hd, E)])
        else:
            tensors[b + "attn_q.weight"] = layer_mat(H * hd, E, qk)
            tensors[b + "attn_k.weight"] = layer_mat(KV * hd, E, qk)
            tensors[b + "attn_v.weight"] = layer_mat(KV * hd, E)
        tensors[b + "attn_output.weight"] = layer_mat(E, H * hd)
        if a in ("qwen3moe", "gemma3"):
            tensors[b + "attn_q_norm.weight"] = vec(hd, 1.5, 0.2)
            tensors[b + "attn_k_norm.weight"] = vec(hd, 1.5, 0.2)
        if gemma:
            # large post norms: the branches outweigh the sqrt(n_embd)-scaled embedding in the residual, else
            # the tied head's largest logit is always the input token itself (emb[t] . emb[t] dominates)
            tensors[b + "post_attention_norm.weight"] = vec(E, 3.0, 0.3)
            tensors[b + "post_ffw_norm.weight"] = vec(E, 3.0, 0.3)
        tensors[b + "ffn_norm.weight"] = vec(E)
        if "n_expert" in m:
            ne = m["n_expert"]
            fe = m.get("FF_exp", FF)
            tensors[b + "ffn_gate_inp.weight"] = mat(ne, E, 3.0)  # wide router margins
            tensors[b + "ffn_gate_exps.weight"] = f32(np.stack([mat(fe, E) for _ in range(ne)]))
            tensors[b + "ffn_up_exps.weight"] = f32(np.stack([mat(fe, E) for _ in range(ne)]))
            tensors[b + "ffn_down_exps.weight"] = f32(np.stack([mat(E, fe, 2.0) for _ in range(ne)]))
        elif a == "phi3":
            tensors[b + "ffn_up.weight"] = np.concatenate([mat(FF, E), mat(FF, E)])  # gate rows, then up rows
            tensors[b + "ffn_down.weight"] = mat(E, FF, 2.0)
        else:
            tensors[b + "ffn_gate.weight"] = layer_mat(FF, E)
            tensors[b + "ffn_up.weight"] = layer_mat(FF, E)
            tensors[b + "ffn_down.weight"] = layer_mat(E, FF, 2.0)
    for name, t in tensors.items():
        w.add_tensor(name, f32(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m["n_rot"] = n_rot
    m["tied"] = tied


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prompt_candidates(m):
    """Prompt slot i: an endless stream of candidates, ids uniform in [3, n_vocab); slot 0 starts with BOS."""
    rng = np.random.default_rng(1000 + m["seed"])
    while True:
        out = []
        for i, n in enumerate(PROMPT_LENS):
            ids = [int(x) for x in rng.integers(3, N_VOCAB, size=n)]
            if i == 0:
                ids[0] = BOS
            out.append(ids)
        yield out


def margin_of(d, md, W, types):
    """The smallest of: top-1 minus top-2 logit at every batch position, every greedy step's gap,
    and (MoE) the router logit margin between the last selected and the first unselected expert
    at every token and layer (numpy reference on the dequantized weights)."""
    top = min(row[0][1] - row[1][1] for row in d["top20"])
    greedy = min(d["greedy_top2_gap"])
    router = math.inf
    if any(k.endswith("expert_count") for k in md):
        _, margins = forward(md, W, d["tokens"], 512, types)
        router = min(margins)
    return min(top, greedy, router), router


def run_dump(exe, model, ids, n_ctx):
    with tempfile.NamedTemporaryFile("w", delete=False, suffix=".ids") as tf:
        tf.write(" ".join(map(str, ids)) + "\n")
    try:
        cmd = [exe, model, tf.name, "0", str(N_POS), str(N_GREEDY), "--ids"]
        if n_ctx != 512:
            cmd += ["--n-ctx", str(n_ctx)]
        r = subprocess.run(cmd, capture_output=True)
        if r.returncode != 0:
            sys.stderr.write(r.stderr.decode("utf-8", "replace")[-4000:])
            raise SystemExit(f"dump_logits failed on {model}")
        return json.loads(r.stdout.decode("utf-8", "replace")), r.stderr.decode("utf-8", "replace")
    finally:
        os.unlink(tf.name)


# ---------------------------------------------------------------------------
# reading back a GGUF: metadata and dequantized weights
def read_gguf(path):
    r = gguf.GGUFReader(path)
    md = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            md[key] = f"[array of {len(f.data)}]"
            continue
        v = f.contents()
        if isinstance(v, float):
            v = float(np.float32(v))
        md[key] = v
    tens = [{"name": t.name, "ne": [int(x) for x in t.shape], "type": t.tensor_type.name} for t in r.tensors]
    return r, md, tens


def weights(r):
    W = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        W[t.name] = np.asarray(a, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)])
    return W


# ---------------------------------------------------------------------------
# numpy reference forward pass (float64), following the notes' formulas
def act_q8_0(x):
    """ggml-cpu quantize_row_q8_0 (x86): blocks of 32, d = amax/127 stored as f16, q = round_nearest_even(x * 127/amax)."""
    b = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    idd = np.where(amax != 0, np.float32(127.0) / np.where(amax != 0, amax, 1), 0).astype(np.float32)
    q = np.rint(b * idd)
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float64)
    return (q * d).reshape(x.shape)


def act_q8_k(x):
    """ggml-quants.c quantize_row_q8_K_ref: blocks of 256, iscale = -127/max (max = the signed value of largest |x|),
    q = min(127, nearest_int(iscale * x)), d = 1/iscale (f32)."""
    b = x.astype(np.float32).reshape(*x.shape[:-1], -1, 256)
    idx = np.abs(b).argmax(-1)[..., None]
    mx = np.take_along_axis(b, idx, -1)
    iscale = np.where(mx != 0, np.float32(-127.0) / np.where(mx != 0, mx, 1), 0).astype(np.float32)
    q = np.minimum(127, np.rint(iscale * b))
    d = np.where(iscale != 0, (np.float32(1.0) / np.where(iscale != 0, iscale, 1)).astype(np.float32), 0)
    return (q * d.astype(np.float64)).reshape(x.shape)


# the activation type ggml-cpu converts src1 to before a matmul with weights of each type (vec_dot_type)
ACT = {"F32": None, "F16": "F16", "Q4_0": "Q8_0", "Q4_1": "Q8_1", "Q5_0": "Q8_0", "Q5_1": "Q8_1", "Q8_0": "Q8_0",
       "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K",
       "TQ1_0": "Q8_K", "TQ2_0": "Q8_K"}  # ggml-cpu.c type_traits_cpu: the ternary types dot against Q8_K too


def quant_act(x, wtype):
    a = ACT[wtype] if wtype else None
    if a is None:
        return x
    if a == "F16":
        return x.astype(np.float16).astype(np.float64)
    if a == "Q8_0":
        return act_q8_0(x)
    if a == "Q8_K":
        return act_q8_k(x)
    raise NotImplementedError(a)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_ggml(x):
    """ggml-cpu GELU with GGML_GELU_FP16 (vec.h ggml_vec_gelu_f32/ggml_vec_geglu_f32): x <= -10 -> 0,
    x >= 10 -> x, else the f16 table: f16(gelu_tanh(f16(x))) with gelu_tanh computed in f32."""
    x32 = x.astype(np.float32)
    h = x32.astype(np.float16).astype(np.float32)
    c = np.float32(0.79788456080286535587989211986876)
    g = (np.float32(0.5) * h * (np.float32(1.0) + np.tanh(c * h * (np.float32(1.0) + np.float32(0.044715) * h * h))))
    g = g.astype(np.float16).astype(np.float64)
    return np.where(x32 <= -10.0, 0.0, np.where(x32 >= 10.0, x, g))


def rope(x, n_rot, neox, base, freq_scale, ff, ext_factor, attn_factor, n_ctx_orig, beta_fast=32.0, beta_slow=1.0):
    """ggml-cpu/ops.cpp ggml_compute_forward_rope_flt + rope_yarn, positions 0..T-1; x: (T, heads, hd)."""
    T = x.shape[0]
    i = np.arange(n_rot // 2)
    theta_extrap = np.arange(T)[:, None] * base ** (-2.0 * i / n_rot)[None, :]
    if ff is not None:
        theta_extrap = theta_extrap / ff[None, :]
    theta = freq_scale * theta_extrap
    mscale = attn_factor
    if ext_factor != 0.0:
        corr = lambda nr: n_rot * math.log(n_ctx_orig / (nr * 2 * math.pi)) / (2 * math.log(base))
        low = max(0.0, math.floor(corr(beta_fast)))
        high = min(n_rot - 1.0, math.ceil(corr(beta_slow)))
        ramp = (1 - np.clip((i - low) / max(0.001, high - low), 0, 1)) * ext_factor
        theta = theta * (1 - ramp) + theta_extrap * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    cos = (np.cos(theta) * mscale)[:, None, :]
    sin = (np.sin(theta) * mscale)[:, None, :]
    y = x.copy()
    if neox:
        x0, x1 = x[..., : n_rot // 2], x[..., n_rot // 2: n_rot]
        y[..., : n_rot // 2] = x0 * cos - x1 * sin
        y[..., n_rot // 2: n_rot] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        y[..., 0:n_rot:2] = x0 * cos - x1 * sin
        y[..., 1:n_rot:2] = x0 * sin + x1 * cos
    return y


def attention(q, k, v, kq_scale, softcap, n_swa):
    """q: (T, H, hd), k/v: (T, KV, hd). Query head h reads KV head h // (H/KV). Causal; with n_swa,
    key p_k is masked for query p_q when p_q - p_k >= n_swa (llama-hparams.h is_masked_swa)."""
    T, H, hd = q.shape
    KV = k.shape[1]
    g = H // KV
    kk = np.repeat(k, g, axis=1)
    vv = np.repeat(v, g, axis=1)
    s = np.einsum("qhd,khd->hqk", q, kk)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    s = s * kq_scale
    pq, pk = np.arange(T)[:, None], np.arange(T)[None, :]
    masked = pk > pq
    if n_swa:
        masked = masked | (pq - pk >= n_swa)
    s = np.where(masked[None], -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, vv).reshape(T, H * hd)


def moe(x, Wr, Wg, Wu, Wd, k, margins, qa=lambda x, n: x, b=""):
    """llama-graph.cpp build_moe_ffn with SOFTMAX gating, norm_w = true, no scale."""
    logits = qa(x, b + "ffn_gate_inp.weight") @ Wr.T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    order = np.argsort(-probs, axis=-1, kind="stable")
    sel = order[:, :k]
    sl = np.sort(logits, axis=-1)[:, ::-1]
    margins.extend((sl[:, k - 1] - sl[:, k]).tolist())  # router logit margin at the top-k boundary
    out = np.zeros_like(x)
    xg = qa(x, b + "ffn_gate_exps.weight")
    xu = qa(x, b + "ffn_up_exps.weight")
    for t in range(x.shape[0]):
        w = probs[t, sel[t]]
        w = w / max(w.sum(), 6.103515625e-5)
        for j, e in enumerate(sel[t]):
            h = silu(Wg[e] @ xg[t]) * (Wu[e] @ xu[t])
            out[t] += w[j] * (Wd[e] @ qa(h, b + "ffn_down_exps.weight"))
    return out


def forward(md, W, tokens, n_ctx, types=None):
    """types: tensor name -> GGML type name; when given, the input of every matmul is quantized
    as ggml-cpu does for that weight type (ACT), so the result tracks llama.cpp's quantized run."""
    qa = (lambda x, n: quant_act(x, types.get(n))) if types else (lambda x, n: x)
    mm = lambda x, n: qa(x, n) @ W[n].T
    a = md["general.architecture"]
    g = lambda key, d=None: md.get(f"{a}.{key}", d)
    E, L, H = g("embedding_length"), g("block_count"), g("attention.head_count")
    KV = g("attention.head_count_kv", H)
    hd = g("attention.key_length", E // H)
    n_rot = g("rope.dimension_count", hd)
    eps = g("attention.layer_norm_rms_epsilon")
    base = g("rope.freq_base", 10000.0)
    scaling = g("rope.scaling.type", "linear")
    factor = g("rope.scaling.factor", 0.0)
    freq_scale = 1.0 / factor if factor else 1.0
    n_ctx_orig = g("rope.scaling.original_context_length", g("context_length"))
    rope_attn_factor = g("rope.scaling.attn_factor", 1.0)
    ext_factor = 1.0 if scaling == "yarn" else 0.0
    attn_factor = rope_attn_factor  # llama-context.cpp: (1+0.1 ln f) / (1+0.1 ln f) * rope_attn_factor for yarn
    n_ctx_seq = -(-n_ctx // 256) * 256  # llama-context.cpp pads n_ctx to a multiple of 256
    neox = a != "llama"
    gemma = a in ("gemma2", "gemma3")
    n_swa, is_swa, base_swa, scale_swa = 0, (lambda il: False), base, freq_scale
    if a == "gemma2":
        n_swa = g("attention.sliding_window", 4096)
        is_swa = lambda il: il % 2 < 1
        base_swa = g("rope.freq_base_swa", base)
    if a == "gemma3" and g("attention.sliding_window", 0) > 0:
        n_swa = g("attention.sliding_window")
        is_swa = lambda il: il % 6 < 5
        base_swa = g("rope.freq_base_swa", 10000.0)
        scale_swa = 1.0
    ff = W.get("rope_freqs.weight")
    if ff is None and "rope_factors_long.weight" in W:
        ff = W["rope_factors_long.weight"] if n_ctx_seq > n_ctx_orig else W["rope_factors_short.weight"]
    if gemma:
        kq_scale = 1.0 / math.sqrt(hd) if L != (46 if a == "gemma2" else 62) else 1.0 / math.sqrt(E / H)
    else:
        kq_scale = 1.0 / math.sqrt(hd)
    softcap = g("attn_logit_softcapping", 50.0) if a == "gemma2" else 0.0
    T = len(tokens)
    x = W["token_embd.weight"][tokens].copy()
    if gemma:
        x = x * float(np.sqrt(np.float32(E)))
    margins = []
    for il in range(L):
        b = f"blk.{il}."
        h = rms_norm(x, W[b + "attn_norm.weight"], eps)
        if b + "attn_qkv.weight" in W:
            qkv = mm(h, b + "attn_qkv.weight")
            q, k, v = qkv[:, : H * hd], qkv[:, H * hd: (H + KV) * hd], qkv[:, (H + KV) * hd:]
        else:
            q, k, v = mm(h, b + "attn_q.weight"), mm(h, b + "attn_k.weight"), mm(h, b + "attn_v.weight")
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if b + "attn_q_norm.weight" in W:
            q = rms_norm(q, W[b + "attn_q_norm.weight"], eps)
            k = rms_norm(k, W[b + "attn_k_norm.weight"], eps)
        swa = is_swa(il)
        bl, sl = (base_swa, scale_swa) if swa else (base, freq_scale)
        q = rope(q, n_rot, neox, bl, sl, ff, ext_factor, attn_factor, n_ctx_orig)
        k = rope(k, n_rot, neox, bl, sl, ff, ext_factor, attn_factor, n_ctx_orig)
        if gemma or a == "phi3":  # these scale q after RoPE and call build_attn with kq_scale 1 (before gemma2's soft cap)
            o = attention(q * kq_scale, k, v, 1.0, softcap, n_swa if swa else 0)
        else:
            o = attention(q, k, v, kq_scale, 0.0, 0)
        o = mm(o, b + "attn_output.weight")
        if gemma:
            o = rms_norm(o, W[b + "post_attention_norm.weight"], eps)
        x = x + o
        h = rms_norm(x, W[b + "ffn_norm.weight"], eps)
        if b + "ffn_gate_inp.weight" in W:
            f = moe(h, W[b + "ffn_gate_inp.weight"], W[b + "ffn_gate_exps.weight"], W[b + "ffn_up_exps.weight"],
                    W[b + "ffn_down_exps.weight"], g("expert_used_count"), margins, qa, b)
        elif a == "phi3":
            up = mm(h, b + "ffn_up.weight")
            n = up.shape[1] // 2
            f = mm(silu(up[:, :n]) * up[:, n:], b + "ffn_down.weight")
        elif gemma:
            f = mm(gelu_ggml(mm(h, b + "ffn_gate.weight")) * mm(h, b + "ffn_up.weight"), b + "ffn_down.weight")
        else:
            f = mm(silu(mm(h, b + "ffn_gate.weight")) * mm(h, b + "ffn_up.weight"), b + "ffn_down.weight")
        if gemma:
            f = rms_norm(f, W[b + "post_ffw_norm.weight"], eps)
        x = x + f
    h = rms_norm(x, W["output_norm.weight"], eps)
    logits = mm(h, "output.weight" if "output.weight" in W else "token_embd.weight")
    cap = g("final_logit_softcapping", 30.0 if a == "gemma2" else 0.0)
    if cap:
        logits = cap * np.tanh(logits / cap)
    return logits, margins


# ---------------------------------------------------------------------------
COMMON_FORMULAS = [
    "RMSNorm (llama-graph.cpp build_norm LLM_NORM_RMS -> ggml_rms_norm, ggml-cpu/ops.cpp ggml_compute_forward_rms_norm_f32): "
    "y = x / sqrtf(sum(x^2)/n + eps) * w, eps = {arch}.attention.layer_norm_rms_epsilon; the sum is accumulated in double.",
    "Matrices: GGUF tensor with ggml shape {ne0, ne1} is a row-major [ne1][ne0] matrix W, used as y = W x (ne0 = input width). "
    "3-D expert tensors {ne0, ne1, n_expert} are n_expert such matrices, expert e at offset e*ne0*ne1.",
    "GQA (ggml_mul_mat broadcasting in build_attn_mha): query head h uses KV head h / (n_head / n_head_kv), i.e. consecutive query heads share a KV head.",
    "Attention without flash attention (llama-graph.cpp build_attn_mha): kq = K^T Q (f32), [gemma2 only: kq = cap*tanh(kq/cap)], "
    "then ggml_soft_max_ext(kq, mask, kq_scale): softmax over keys of kq*kq_scale + mask (mask 0 or -inf), out = V softmax. "
    "Causal mask: key at position p_k is visible to the query at p_q iff p_k <= p_q (llama-kv-cache.cpp set_input_kq_mask).",
    "RoPE (ggml-cpu/ops.cpp ggml_compute_forward_rope_flt, ggml_rope_cache_init, rope_yarn): for pair i in [0, n_rot/2): "
    "theta_extrap = p * base^(-2i/n_rot) / ff[i] (ff = rope freq factors, 1 if none; base^(-2i/n_rot) is computed as theta_scale^i by repeated f32 "
    "multiplication, theta_scale = powf(base, -2/n_rot)); theta_interp = freq_scale * theta_extrap; without YaRN (ext_factor 0) theta = theta_interp "
    "and cos/sin are multiplied by mscale = attn_factor. Rotation: (a, b) -> (a cos - b sin, a sin + b cos). "
    "NORM mode (LLAMA_ROPE_TYPE_NORM, arch llama): pairs (x[2i], x[2i+1]). NEOX mode (phi3, qwen3moe, gemma2, gemma3): pairs (x[i], x[i + n_rot/2]). "
    "Dimensions n_rot..head_dim-1 are copied unchanged (and NOT multiplied by mscale). freq_scale = 1/{arch}.rope.scaling.factor (1 if absent; "
    "llama-model.cpp llama_model_base::load_hparams), base = {arch}.rope.freq_base (default 10000).",
    "Residual stream, logits: final RMSNorm with output_norm.weight then logits = output.weight h (token_embd.weight when output.weight is absent: tied).",
]

SILU_FFN = "FFN (llama-graph.cpp build_ffn LLM_FFN_SILU, LLM_FFN_PAR): down( silu(gate x) * (up x) ), silu(x) = x/(1+exp(-x))."
MOE_FORMULA = ("MoE (llama-graph.cpp build_moe_ffn, gating LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, norm_w = true, w_scale = expert_weights_scale = 0 -> unused): "
               "router logits r = ffn_gate_inp.weight x (x = ffn_norm output; ffn_gate_inp is never quantized by llama-quantize); p = softmax(r) over ALL experts; "
               "selected = the expert_used_count largest p (ggml_argsort_top_k); w_j = p_sel_j / max(sum_j p_sel_j, 6.103515625e-5) (renormalized over the selected experts); "
               "out = sum_j w_j * down_e( silu(gate_e x) * (up_e x) ), e = selected[j]. No shared expert, no bias.")


def notes_for(m):
    a = m["name"]
    n = {"exercises": "", "weights": "", "formulas": [], "llama_cpp_behaviour": []}
    n["weights"] = (f"Random, numpy default_rng({m['seed']}): matrices N(0, s^2/fan_in) with s = 1 (V, O, FFN gate/up), 1.5 (Q, K; 2 for gemma2), "
                    f"2 (FFN down), 3 (router), 4 (output); norm weights N(1, 0.1^2) (q/k norms N(1.5, 0.2^2); gemma post_attention_norm/post_ffw_norm N(3, 0.3^2)); "
                    + ("token_embd N(0, 1/n_embd), output_norm N(3, 0.3^2) (tied head). " if m["arch"].startswith("gemma") else "token_embd N(0, 1). ")
                    + f"Written F32 by the gguf package, then `llama-quantize {'(not run)' if m['quant'] == 'F32' else m['quant']}`: "
                    "see `gguf.tensors` for each tensor's type (llama-quantize picks per-tensor types: e.g. output.weight Q6_K, fallbacks for rows not a multiple of 256).")
    if m.get("ternary"):
        n["weights"] = (f"Random, numpy default_rng({m['seed']}): every layer matrix (attn_q/k/v/output, ffn_gate/up/down) is ternary: trits uniform in "
                        "{-1, 0, 1} times one scale per row and 256-column block, scale = s/sqrt(fan_in) * sqrt(3/2) * exp(0.2 N(0, 1)) rounded to f16 "
                        "(s = 1.5 for Q and K, 2 for FFN down, 1 otherwise), so llama-quantize's TQ format stores it exactly (block amax = the scale). "
                        "token_embd N(0, 1), output N(0, 16/n_embd), norm weights N(1, 0.1^2). "
                        f"Written F32 by the gguf package, then `llama-quantize {m['quant']}`: the layer matrices become {m['quant']}, token_embd Q4_K and "
                        "output Q6_K (llama-quant.cpp llama_tensor_get_type: TQ1_0/TQ2_0 ftypes give the token embedding Q4_K, and output.weight gets the "
                        "usual Q6_K); see `gguf.tensors`.")
    f = list(COMMON_FORMULAS)
    beh = n["llama_cpp_behaviour"]
    if m["arch"] == "llama":
        f.append("Layer (src/models/llama.cpp llama_model_llama::graph): h = RMSNorm(x, attn_norm); q,k,v = Wq h, Wk h, Wv h; RoPE NORM on q and k "
                 "(n_rot = rope.dimension_count = head_dim, must equal head_dim for llama); attention with kq_scale = 1/sqrt(head_dim) "
                 "({arch}.attention.scale is not written); x += Wo attn; h = RMSNorm(x, ffn_norm); x += FFN(h).")
        f.append(SILU_FFN if "n_expert" not in m else MOE_FORMULA)
    if a == "llama-rope-llama3":
        p = m["llama3"]
        n["exercises"] = (f"llama arch with Llama 3.x RoPE frequency factors: rope_freqs.weight [{m['hd']//2}] F32, computed as conversion/llama.py "
                          f"LlamaModel.generate_extra_tensors does for rope_type llama3 (factor {p['factor']}, low_freq_factor {p['low_freq_factor']}, "
                          f"high_freq_factor {p['high_freq_factor']}, original_max_position_embeddings {p['original_max_position_embeddings']}, base {m['base']:g}, "
                          f"so within 64 positions some pairs have factor 1, some 8 and some in between); GQA {m['H']} query / {m['KV']} KV heads; Q4_0 weights.")
        f.append("llama3 RoPE (llama-model.cpp llama_model::get_rope_factors returns layers[il].rope_freqs, the one rope_freqs.weight tensor shared by all layers): "
                 "theta_i = p * base^(-2i/64) / rope_freqs[i], freq_scale 1 (the converter writes no rope.scaling.* keys for llama3), no YaRN, mscale 1. "
                 "No rope.scaling.type key -> llama.cpp treats it as 'linear' with factor 0 -> freq_scale 1.")
    if m.get("ternary"):
        q = m["quant"]
        n["exercises"] = (f"llama arch with llama.cpp's ternary type {q} for every layer matrix (issue 24: cross-checks cachefit's ternary kernels against "
                          f"ggml's): n_embd {m['E']}, n_ff {m['FF']}, heads {m['H']}/{m['KV']} x 64, so every matrix input width is a multiple of 256 "
                          f"(TQ block size; ffn_down rows span {m['FF'] // 256} block(s)); plain RoPE (base {m['base']:g}, no scaling), SiLU FFN.")
        layout = ("TQ2_0 (ggml-common.h block_tq2_0, 66 bytes per 256 weights): qs[64] then f16 d; byte qs[32c + m] holds the weights 128c + 32k + m "
                  "(c < 2, k < 4, m < 32) in bits 2k..2k+1 as trit + 1; weight = (field - 1) * d (ggml-quants.c dequantize_row_tq2_0)."
                  if q == "TQ2_0" else
                  "TQ1_0 (ggml-common.h block_tq1_0, 54 bytes per 256 weights): qs[48], qh[4], f16 d. Five trits per byte in base 3, stored as "
                  "ceil(v * 256 / 243) of the 5-trit number v (first trit most significant); trit n of byte q is ((uint8_t)(q * 3^n) * 3) >> 8, minus 1. "
                  "Trit n of qs[m] (m < 32) is weight 32n + m; of qs[32 + m] (m < 16) weight 160 + 16n + m; of qh[j] (n < 4, a fifth zero trit "
                  "pads) weight 240 + 4n + j (ggml-quants.c quantize_row_tq1_0_ref / dequantize_row_tq1_0); weight = trit * d.")
        f.append(f"{layout} Quantization (quantize_row_{q.lower()}_ref): d = max |x| over the block (stored f16), trit = lroundf(x / d). "
                 f"Matmul (ggml-cpu.c type_traits_cpu[GGML_TYPE_{q}].vec_dot_type = Q8_K; arch/x86/quants.c ggml_vec_dot_{q.lower()}_q8_K): the input is "
                 "quantized to Q8_K blocks of 256 and y = sum over blocks of f16(d_w) * d_x * sum(trit * q_x) (integer inner sums).")
    if a == "llama-rope-yarn":
        y = m["yarn"]
        fs = 1.0 / y["factor"]
        corr = lambda nr: 64 * math.log(y["original_context_length"] / (nr * 2 * math.pi)) / (2 * math.log(m["base"]))
        low, high = max(0, math.floor(corr(32.0))), min(63, math.ceil(corr(1.0)))
        n["exercises"] = (f"llama arch with YaRN: rope.scaling.type = yarn, rope.scaling.factor = {y['factor']:g}, rope.scaling.original_context_length = "
                          f"{y['original_context_length']} (context_length {m['ctx_train']}), head_dim 64, base {m['base']:g}: YaRN correction dims "
                          f"low = {low}, high = {high}, so pairs 0..{low - 1} keep the original frequency, {high + 1}..31 are interpolated by 1/{y['factor']:g} "
                          f"and {low}..{high} ramp between. GQA {m['H']}/{m['KV']}. All weights F32 (no activation quantization in ggml: the cleanest comparison).")
        f.append("YaRN (ggml-cpu/ops.cpp rope_yarn, ggml.c ggml_rope_yarn_corr_dims): ext_factor = 1 (llama-context.cpp: yarn_ext_factor < 0 = unset -> 1 for "
                 "rope scaling type YARN), beta_fast = 32, beta_slow = 1 (llama_hparams defaults; the llama arch does not read rope.scaling.yarn_beta_*), "
                 "n_ctx_orig = rope.scaling.original_context_length. corr_dim(b) = n_rot * ln(n_ctx_orig / (b * 2 pi)) / (2 ln base); "
                 "low = max(0, floor(corr_dim(beta_fast))), high = min(n_rot - 1, ceil(corr_dim(beta_slow))). For pair i (integer i = i0/2): "
                 "ramp = 1 - clamp((i - low) / max(0.001, high - low), 0, 1); mix = ramp * ext_factor; theta = theta_interp * (1 - mix) + theta_extrap * mix "
                 f"(theta_interp = freq_scale * theta_extrap, freq_scale = 1/factor = {fs:g}).")
        f.append("YaRN magnitude: cos and sin (hence q and k, i.e. the scores by its square) are multiplied by mscale = attn_factor * (1 + 0.1 ln(1/freq_scale)) "
                 f"(rope_yarn). attn_factor from llama-context.cpp llama_context::llama_context: yarn_attn_factor = get_mscale(factor) = 1 + 0.1 ln(factor), then "
                 "*= 1 / (1 + 0.1 ln(factor)) (cancels it, because rope_yarn applies it; PR #17945), then *= {arch}.rope.scaling.attn_factor (default 1, not written here). "
                 f"Net: mscale = 1 + 0.1 ln({y['factor']:g}) = {1 + 0.1 * math.log(y['factor']):.7f} on the rotated dims, and the scores are scaled by its square "
                 "on top of kq_scale = 1/sqrt(64).")
        beh.append("rope.scaling.yarn_log_multiplier, rope.scaling.yarn_ext_factor, rope.scaling.yarn_attn_factor, rope.scaling.yarn_beta_fast/slow are NOT read by the "
                   "llama arch (only deepseek2/32, mistral3, grok, ... read some of them); the converter writes yarn_* keys only when the HF config has them. "
                   "Only rope.scaling.type/factor/original_context_length and the generic rope.scaling.attn_factor matter here.")
        beh.append("The YaRN ramp applies at every position (it changes the frequencies, not only beyond original_context_length): llama.cpp has no dynamic switch.")
    if a == "llama-rope-linear-swa":
        n["exercises"] = ("llama arch (Mistral-style) with linear RoPE scaling: rope.scaling.type = linear, rope.scaling.factor = 2 -> freq_scale 0.5, "
                          "theta_i = 0.5 * p * base^(-2i/64). MHA (2 query = 2 KV heads), n_embd 128, F16 weights. NO sliding window: despite the name, "
                          "llama.attention.sliding_window is not written, because this llama.cpp's llama arch ignores it (see llama_cpp_behaviour); "
                          "a llama-arch file with the key would still be run with full causal attention by llama.cpp.")
        beh.append("src/models/llama.cpp llama_model_llama::load_arch_hparams never reads LLM_KV_ATTENTION_SLIDING_WINDOW and the graph uses build_attn_inp_kv (no iSWA "
                   "cache), so hparams.swa_type stays NONE: llama.attention.sliding_window is ignored. The current converter (conversion/llama.py) does not write it "
                   "for llama/Mistral either. llama.cpp reads attention.sliding_window only in arch-specific loaders (e.g. gemma2, gemma3, cohere2, granite-swa, "
                   "openai-moe; phi3 reads it and then disables SWA).")
    if m["arch"] == "phi3":
        n_rot = m["n_rot"]
        af = m["phi3_attn_factor"]
        n["exercises"] = (f"phi3 (Phi-4-mini-like): fused attn_qkv.weight {{n_embd, (n_head + 2 n_head_kv) * head_dim}} = {{{m['E']}, {(m['H'] + 2 * m['KV']) * m['hd']}}} "
                          f"(rows: Q {m['H']}x64, then K {m['KV']}x64, then V {m['KV']}x64), fused gate+up ffn_up.weight {{{m['E']}, {2 * m['FF']}}} (first {m['FF']} rows gate, "
                          f"next {m['FF']} up), GQA {m['H']}/{m['KV']}, partial rotary rope.dimension_count = {n_rot} of head_dim 64 (partial_rotary_factor 0.75), "
                          f"LongRoPE factors rope_factors_long.weight / rope_factors_short.weight [{n_rot // 2}] F32 with rope.scaling.original_context_length = {m['orig_ctx']}, "
                          f"context_length = {m['ctx_train']}, rope.scaling.attn_factor = sqrt(1 + ln({m['ctx_train']}/{m['orig_ctx']}) / ln({m['orig_ctx']})) = {af:.7f}. "
                          "Q4_K_M weights (llama-quantize mix).")
        f.append(f"Layer (src/models/phi3.cpp llama_model_phi3::graph): h = RMSNorm(x, attn_norm); qkv = attn_qkv h split as Q = rows [0, {m['H'] * 64}), "
                 f"K = next {m['KV'] * 64}, V = last {m['KV'] * 64} (llama-graph.cpp build_qkv fused path); RoPE NEOX on the first n_rot = {n_rot} dims of each head: pairs "
                 f"(x[i], x[i + {n_rot // 2}]), i < {n_rot // 2}, theta_i = p * base^(-2i/{n_rot}) / ff[i] (NOTE the exponent uses n_rot, not head_dim), freq_scale 1; "
                 f"cos/sin multiplied by attn_factor = rope.scaling.attn_factor = {af:.7f} (so only the {n_rot} rotated dims of q and k are scaled, dims {n_rot}..63 are copied); "
                 "then q *= 1/sqrt(head_dim) and attention with kq_scale 1; x += attn_output attn; h = RMSNorm(x, ffn_norm); "
                 f"u = ffn_up h ({2 * m['FF']} values); x += ffn_down( silu(u[0:{m['FF']}]) * u[{m['FF']}:{2 * m['FF']}] ) (LLM_FFN_SWIGLU = ggml_swiglu, not swapped: the FIRST half is the gate).")
        f.append("Long vs short factors (llama-model.cpp llama_model::get_rope_factors): ff = rope_factors_long if cparams.n_ctx_seq > n_ctx_orig_yarn "
                 "(= rope.scaling.original_context_length) else rope_factors_short. n_ctx_seq is the context size (llama-context.cpp pads n_ctx up to a multiple of 256), "
                 "NOT the current sequence length: the choice is fixed per context, for every position. "
                 f"phi3.json: n_ctx 512 > {m['orig_ctx']} -> LONG factors at all positions. phi3-nctx256.json (same model): n_ctx 256, not > {m['orig_ctx']} -> SHORT factors.")
        beh.append("phi3 has no rope.scaling.type key (the converter's Phi3MiniModel.set_gguf_parameters writes none): rope_scaling_type_train defaults to 'linear' "
                   "with no factor -> freq_scale 1, ext_factor 0; the LongRoPE behaviour is entirely the factor tensors + rope.scaling.attn_factor. "
                   "The attn_factor is applied whether long or short factors are used (HF applies it too).")
        beh.append("phi3.attention.sliding_window = 0 (Phi-4-mini style). A nonzero value would be ignored: src/models/phi3.cpp load_arch_hparams logs "
                   "'Phi SWA is currently disabled' and sets swa_type NONE.")
    if m["arch"] == "qwen3moe":
        n["exercises"] = (f"qwen3moe: {m['n_expert']} experts (expert_count), {m['n_expert_used']} used (expert_used_count), expert_feed_forward_length {m['FF_exp']} "
                          f"(feed_forward_length {m['FF']} is written like the converter does but unused), router ffn_gate_inp.weight {{{m['E']}, {m['n_expert']}}} F32, "
                          f"ffn_{{gate,up}}_exps {{{m['E']}, {m['FF_exp']}, {m['n_expert']}}}, ffn_down_exps {{{m['FF_exp']}, {m['E']}, {m['n_expert']}}} Q8_0, "
                          f"per-head q/k RMSNorm (attn_q_norm/attn_k_norm [64]), head_dim 64 with n_head*head_dim = {m['H'] * 64} != n_embd {m['E']} "
                          f"(attention.key_length/value_length), GQA {m['H']}/{m['KV']}, NEOX RoPE base {m['base']:g}.")
        f.append("Layer (src/models/qwen3moe.cpp llama_model_qwen3moe::graph): h = RMSNorm(x, attn_norm); q = attn_q h, k = attn_k h, v = attn_v h; per head: "
                 "q = RMSNorm(q_head, attn_q_norm) (over the 64 dims of each head, same eps), k likewise with attn_k_norm, BEFORE RoPE; RoPE NEOX (n_rot = head_dim = 64); "
                 "attention kq_scale = 1/sqrt(head_dim); x += attn_output attn (attn_output {n_head*head_dim, n_embd}); h = RMSNorm(x, ffn_norm); x += MoE(h).")
        f.append(MOE_FORMULA)
        beh.append("qwen3moe always renormalizes the selected experts' weights (build_moe_ffn norm_w = true is hard-coded in src/models/qwen3moe.cpp); "
                   "qwen3moe.expert_weights_norm and expert_gating_func are not read. n_ff_exp = expert_feed_forward_length (if 0: feed_forward_length / expert_used_count).")
    if a == "mixtral":
        n["exercises"] = (f"llama arch with experts, Mixtral style: expert_count {m['n_expert']}, expert_used_count {m['n_expert_used']}, expert FFN width = "
                          f"feed_forward_length = {m['FF']} (the llama arch has no expert_feed_forward_length), router ffn_gate_inp.weight {{{m['E']}, {m['n_expert']}}} F32, "
                          f"ffn_{{gate,up}}_exps {{{m['E']}, {m['FF']}, {m['n_expert']}}}, ffn_down_exps {{{m['FF']}, {m['E']}, {m['n_expert']}}}, NORM RoPE, GQA {m['H']}/{m['KV']}, "
                          "Q4_0 weights.")
        beh.append("src/models/llama.cpp: the MoE branch is taken when ffn_gate_inp exists (expert_count > 0); gating SOFTMAX + renormalize (norm_w = true), "
                   "same as Mixtral's softmax-over-top-k. ffn_gate_exps is optional in the loader (TENSOR_NOT_REQUIRED) but present here.")
    if m["arch"] in ("gemma2", "gemma3"):
        gem3 = m["arch"] == "gemma3"
        f.append(f"Embedding (src/models/{m['arch']}.cpp): x0 = token_embd[tok] * sqrtf(n_embd) (f32, = {math.sqrt(m['E']):g} here). Tied output: logits = token_embd h "
                 "(gemma2 never reads output.weight; gemma3 uses it only if present).")
        f.append(f"Layer ({m['arch']}.cpp graph): h = RMSNorm(x, attn_norm); q,k,v = Wq h, Wk h, Wv h"
                 + ("; q = RMSNorm_per_head(q, attn_q_norm), k = RMSNorm_per_head(k, attn_k_norm) BEFORE RoPE" if gem3 else "")
                 + "; RoPE NEOX (n_rot = head_dim) with the layer's base/scale; q *= f_attention_scale; attention with kq_scale 1"
                 + ("" if gem3 else " and soft-capped scores") + "; o = attn_output attn; o = RMSNorm(o, post_attention_norm); x += o; "
                 "h = RMSNorm(x, ffn_norm); f = ffn_down( GELU(ffn_gate h) * (ffn_up h) ) (LLM_FFN_GELU, LLM_FFN_PAR -> ggml_geglu_split: GELU on the gate); "
                 "f = RMSNorm(f, post_ffw_norm); x += f. Norm weights are used as stored (the converter already added the +1 of Gemma's RMSNorm).")
        f.append("f_attention_scale (llama_model_gemma2/3::load_arch_hparams) = 1/sqrt(attention.key_length) (for 27B: 46 layers gemma2 / 62 layers gemma3: "
                 "1/sqrt(n_embd/n_head)); query_pre_attn_scalar is not in the GGUF. Here 1/sqrt(64) = 0.125.")
        f.append("GELU (ggml-cpu/vec.h, GGML_GELU_FP16 is defined): gelu(x) = 0 for x <= -10, x for x >= 10, else table[f16(x)] with "
                 "table = f16(0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2)))) evaluated in f32 at the f16 value: the tanh approximation "
                 "(gelu_pytorch_tanh), with x and the result rounded to f16 (~1e-3 relative).")
        f.append("Sliding window mask (llama-hparams.h llama_hparams::is_masked_swa, LLAMA_SWA_TYPE_STANDARD; llama-kv-cache.cpp set_input_kq_mask): on SWA layers the key at "
                 "p_k is masked for the query at p_q when p_q - p_k >= n_swa (in addition to p_k > p_q): each query sees itself and the n_swa - 1 previous tokens.")
    if a == "gemma3":
        n["exercises"] = (f"gemma3: {m['L']} layers with the default pattern 6 (layers 0-4 sliding window, layer 5 global), attention.sliding_window = {m['sliding_window']} "
                          f"(bites from position {m['sliding_window']} on), q/k norms, post-attention/post-FFN norms, GELU-tanh GeGLU, sqrt(n_embd) embedding scale, "
                          f"tied output, rope.freq_base = {m['base']:g} for the global layer and the default local base 10000 (no rope.freq_base_swa key, as in real "
                          f"Gemma 3 files, e.g. gemma-3-270m), linear RoPE scaling factor {m['linear']:g} (rope.scaling.type linear, as Gemma 3 4B/12B/27B have) which "
                          f"llama.cpp applies to the GLOBAL layer only; {m['H']} query heads / {m['KV']} KV head, head_dim 64, n_head*head_dim = {m['H'] * 64} != n_embd {m['E']}; "
                          "Q8_0 weights. No final logit soft-capping (Gemma 3 has none; gemma3.final_logit_softcapping absent -> 0 -> off).")
        f.append("SWA layers (llama-model.cpp load_swa_pattern(ml, 6) + llama-hparams.cpp set_swa_pattern(n_pattern, dense_first = false)): layer il is SWA iff "
                 "il % 6 < 5, i.e. every 6th layer (5, 11, 17, ...) is global (gemma3.attention.sliding_window_pattern would override; not written by the converter). "
                 "Only if attention.sliding_window > 0; otherwise all layers are global.")
        f.append("RoPE per layer (llama_model::get_rope_freq_base/scale): SWA layers use rope_freq_base_train_swa = gemma3.rope.freq_base_swa if present else 10000 "
                 "(the llama_hparams default) and rope_freq_scale_train_swa = 1.0 (gemma3 never changes it); global layers use gemma3.rope.freq_base "
                 f"({m['base']:g}) and freq_scale = 1/rope.scaling.factor (= 1/{m['linear']:g} here). No YaRN, mscale 1.")
        beh.append("The local RoPE base 10000 is not in the file: llama.cpp falls back to its default rope_freq_base_train_swa = 10000 (the converter writes "
                   "rope.freq_base_swa only when the HF config has rope_parameters.sliding_attention.rope_theta; the real gemma-3-270m GGUF has no such key).")
        beh.append("Linear rope scaling on gemma3 applies only to the global layers; local layers always use freq_scale 1.")
    if a == "gemma2":
        n["exercises"] = (f"gemma2: {m['L']} layers alternating sliding window / global (pattern 2: even layers SWA), attention.sliding_window = {m['sliding_window']}, "
                          f"attention logit soft-capping attn_logit_softcapping = {m['attn_softcap']:g} and final_logit_softcapping = {m['final_softcap']:g} "
                          "(deliberately smaller than Gemma 2's 50/30 so they bite with random weights), post norms, GELU-tanh GeGLU, sqrt(n_embd) embedding scale, "
                          f"tied output, no q/k norms, {m['H']}/{m['KV']} heads, head_dim 64, no rope.freq_base key (converter writes none for gemma2 -> 10000). Q4_K_M weights.")
        f.append("SWA layers (llama_model_gemma2::load_arch_hparams: load_swa_pattern(ml, 2)): layer il is SWA iff il % 2 == 0 (0, 2, ...), odd layers global. "
                 "n_swa = gemma2.attention.sliding_window (default 4096). Both kinds use the same RoPE (rope_freq_base_train_swa = rope_freq_base_train, "
                 "unless gemma2.rope.freq_base_swa is present).")
        f.append("Attention soft-capping (llama-graph.cpp build_attn_mha, hparams.attn_soft_cap = true for gemma2): with q already multiplied by 1/sqrt(64), "
                 "kq = q.k; kq = cap_a * tanh(kq / cap_a) with cap_a = gemma2.attn_logit_softcapping (default 50); then mask and softmax with kq_scale 1. "
                 "(With flash attention the same cap is passed to ggml_flash_attn_ext.)")
        f.append("Final soft-capping (src/models/gemma2.cpp, always): logits = cap_f * tanh(logits / cap_f), cap_f = gemma2.final_logit_softcapping (default 30).")
    n["formulas"] = f
    beh.append("Settings: dump_logits runs with flash attention off and an F32 K/V cache; llama-perplexity and llama-cli default to flash attention auto and F16 K/V.")
    if m["quant"] != "F32":
        tq = " and ternary TQ1_0/TQ2_0 weights" if m.get("ternary") else ""  # only in the ternary files' notes: the others stay byte-identical
        f.append("Activation quantization (ggml-cpu, the weight type's vec_dot_type): the input x of a matmul with Q4_0/Q5_0/Q8_0 weights is first quantized to "
                 "Q8_0: per block of 32, amax = max|x|, d = f16(amax/127), q = round-half-even(x * (127/amax)) (arch/x86/quants.c quantize_row_q8_0); with K-quant "
                 f"weights (Q4_K, Q5_K, Q6_K){tq} to Q8_K: per block of 256, m = the signed x of largest |x|, iscale = -127/m, q = min(127, nearest_int(iscale x)), d = 1/iscale "
                 "in f32 (ggml-quants.c quantize_row_q8_K_ref); with F16 weights x is rounded to f16. The product is sum over blocks of d_w d_x sum(q_w q_x). "
                 "F32 weights (norms, rope factors, the MoE router ffn_gate_inp) and the attention products (F32 K/V cache here) take x unchanged. "
                 "numpy_check emulates exactly this and matches llama.cpp to print precision except where a last-bit summation difference flips one rounding.")
        beh.append("F16 weights: a forward pass that keeps f32 activations differs from the logits here by ~1e-2 (numpy without emulation)." if m["quant"] == "F16" else
                   "Because of the activation quantization, a forward pass that keeps f32 activations on these quantized weights differs from the logits here by up to "
                   "~0.3-0.7 (numpy without emulation), and by 2-3 at the few tokens where that makes a MoE router pick another expert (qwen3moe.json); llama.cpp's own one-batch vs one-token-per-decode difference (batch_vs_incremental_max_abs_diff) is of the same order. "
                   "Without activation quantization (llama.cpp on the weights dequantized to F32) the formulas match to print precision: numpy_check_dequant_f32.")
    return n


# ---------------------------------------------------------------------------
def make(m, exe, quantize_exe, scratch, check):
    t0 = time.time()
    name = m["name"]
    f32 = os.path.join(scratch, f"{name}.f32.gguf")
    dest = os.path.join(OUT, f"{name}.gguf")
    build_f32(m, f32)
    if m["quant"] == "F32":
        with open(f32, "rb") as src, open(dest, "wb") as dst:
            dst.write(src.read())
    else:
        log = os.path.join(scratch, f"{name}.quantize.log")
        with open(log, "w") as lf:
            subprocess.run([quantize_exe, f32, dest, m["quant"]], check=True, stdout=lf, stderr=lf)
    r, md, tens = read_gguf(dest)
    W = weights(r)
    types = {t["name"]: t["type"] for t in tens}
    deq = None
    if check and m["quant"] != "F32":
        deq = os.path.join(scratch, f"{name}.dequant-f32.gguf")
        with open(os.path.join(scratch, f"{name}.dequant.log"), "w") as lf:
            subprocess.run([quantize_exe, "--allow-requantize", dest, deq, "F32"], check=True, stdout=lf, stderr=lf)
    sha = sha256(dest)
    results = []
    # choose the prompts: per slot the first candidate whose margin_of() >= MARGIN (at n_ctx 512)
    chosen = []
    cands = prompt_candidates(m)
    cand_lists = []
    for slot in range(len(PROMPT_LENS)):
        best = None
        for tries in range(1, MAX_TRIES + 1):
            if len(cand_lists) < tries:
                cand_lists.append(next(cands))
            ids = cand_lists[tries - 1][slot]
            d, _ = run_dump(exe, dest, ids, 512)
            mg, router = margin_of(d, md, W, types)
            if best is None or mg > best[0]:
                best = (mg, ids, d, tries, router)
            if mg >= MARGIN:
                break
        if best[0] < MARGIN:
            print(f"{name}: warning: prompt {slot}: no candidate of {MAX_TRIES} has margins >= {MARGIN}; "
                  f"took candidate {best[3]} (margin {best[0]:.3g})", file=sys.stderr)
        chosen.append(best)
    for v in [dict(suffix="", n_ctx=512)] + VARIANTS.get(name, []):
        res = []
        for mg, ids, d0, tries, router in chosen:
            d = d0 if v["n_ctx"] == 512 else run_dump(exe, dest, ids, v["n_ctx"])[0]
            p = {"prompt_ids": ids, "candidate": tries, "n_prompt": d["n_prompt"], "tokens": d["tokens"], "top20": d["top20"],
                 "greedy32": d["greedy32"], "greedy_top2_gap": d["greedy_top2_gap"], "greedy32_text": d["greedy32_text"],
                 "batch_vs_incremental_max_abs_diff": d["batch_vs_incremental_max_abs_diff"],
                 "batch_vs_incremental_max_abs_diff_top20": d["batch_vs_incremental_max_abs_diff_top20"]}
            for row in d["top20"]:
                for _, lg in row:
                    if not math.isfinite(lg):
                        raise SystemExit(f"{name}: non-finite logit")
            if check and deq is not None:
                # the formulas alone: llama.cpp on the same weights dequantized to F32 (no activation quantization)
                dd, _ = run_dump(exe, deq, ids, v["n_ctx"])
                ref, _ = forward(md, W, dd["tokens"], v["n_ctx"])
                diff = max(abs(ref[i, t] - lg) for i, row in enumerate(dd["top20"]) for t, lg in row)
                p["numpy_check_dequant_f32"] = {"max_abs_diff_top20": float(f"{diff:.3g}"),
                                                "top1_agree": sum(int(np.argmax(ref[i])) == row[0][0] for i, row in enumerate(dd["top20"])),
                                                "of": len(dd["top20"])}
            if check:
                ref, margins = forward(md, W, d["tokens"], v["n_ctx"], types)
                diff = max(abs(ref[i, t] - lg) for i, row in enumerate(d["top20"]) for t, lg in row)
                top1 = sum(int(np.argmax(ref[i])) == row[0][0] for i, row in enumerate(d["top20"]))
                p["numpy_check"] = {"max_abs_diff_top20": float(f"{diff:.3g}"), "top1_agree": top1, "of": len(d["top20"])}
                if margins:
                    p["numpy_check"]["min_router_logit_margin"] = float(f"{min(margins):.3g}")
            res.append(p)
        out_name = name + v["suffix"]
        gaps = [g for p in res for g in p["greedy_top2_gap"]]
        top12 = [row[0][1] - row[1][1] for p in res for row in p["top20"]]
        doc = {
            "source": "llama.cpp from the PyPI sdist llama-cpp-python==0.3.36 (vendor/llama.cpp), built by scripts/llamacpp/build-llamacpp.sh, "
                      "run by scripts/llamacpp/dump_logits.cpp --ids via scripts/llamacpp/make-arch-fixtures.py",
            "arch": m["arch"],
            "model": os.path.basename(dest),
            "model_sha256": sha,
            "settings": {"n_ctx": v["n_ctx"], "n_batch": v["n_ctx"], "n_ubatch": v["n_ctx"], "n_threads": 1, "n_threads_batch": 1,
                         "flash_attn": False, "kv_cache_type": "f32", "prompt": "token ids given directly (dump_logits --ids): no tokenizer, no BOS added; prompt 0 starts with BOS = 1",
                         "prompt_selection": f"prompt i (lengths {list(PROMPT_LENS)}) is the first of a seeded stream of random candidates "
                                             f"(numpy default_rng({1000 + m['seed']}), 3 prompts per draw, `candidate` = draw number) whose run at n_ctx 512 has "
                                             f"every top-1/top-2 logit gap (batch and greedy) and, for MoE, every router logit margin at the top-k boundary "
                                             f"(numpy reference) >= {MARGIN}, so that near-ties are rare",
                         "n_pos": N_POS, "n_greedy": N_GREEDY,
                         "top20": "logits of the 64 tokens decoded as one batch at positions 0..63; entry i predicts token i+1",
                         "greedy32": "argmax (lowest id on ties), prompt decoded as one batch then one token per decode, no stop at EOG",
                         "logit_digits": 5},
            "notes": notes_for(m),
            "gguf": {"about": "metadata: every key of the file except the three token arrays; tensors: name, ggml dims ne (ne0 = row length first), type",
                     "metadata": md, "tensors": tens, "bytes": os.path.getsize(dest)},
            "numpy_check_about": "numpy_check (per prompt): a float64 numpy forward pass (make-arch-fixtures.py forward()) implementing notes.formulas on this file's "
                                 "dequantized weights, with ggml's activation quantization emulated, against these logits: largest |difference| over each position's "
                                 "top-20 entries, and top-1 agreement. numpy_check_dequant_f32: the same formulas without emulation against llama.cpp run on the weights "
                                 "dequantized to F32 (llama-quantize --allow-requantize NAME.gguf OUT F32; not committed), with its own greedy tokens. "
                                 "Differences <= 5e-4 are the 5-significant-digit print precision; gemma's up to ~6e-3 comes from GELU's f16 table (an f16 "
                                 "rounding boundary crossed by a last-bit difference). Larger numpy_check values on quantized files are one activation "
                                 "rounding flipped by a last-bit summation difference, like llama.cpp's own batch_vs_incremental_max_abs_diff.",
            "stats": {"top1_top2_gap_median": float(f"{np.median(top12):.3g}"), "top1_top2_gap_min": float(f"{min(top12):.3g}"),
                      "positions_with_gap_below_0.01": int(sum(g < 0.01 for g in top12)), "positions": len(top12),
                      "greedy_gap_min": float(f"{min(gaps):.3g}")},
            "prompts": res,
        }
        if v["suffix"]:
            doc["notes"]["variant"] = f"same model file as {name}.json, run with n_ctx {v['n_ctx']}"
        with open(os.path.join(OUT, out_name + ".json"), "w", encoding="utf-8") as fo:
            json.dump(doc, fo, ensure_ascii=False, separators=(",", ":"))
            fo.write("\n")
        chk = ""
        if check:
            chk = " numpy max|d| " + ", ".join(f"{p['numpy_check']['max_abs_diff_top20']:.3g}" for p in res) + \
                  " top1 " + ", ".join(f"{p['numpy_check']['top1_agree']}" for p in res)
            if "numpy_check_dequant_f32" in res[0]:
                chk += " | dequant-F32 max|d| " + ", ".join(f"{p['numpy_check_dequant_f32']['max_abs_diff_top20']:.3g}" for p in res) + \
                       " top1 " + ", ".join(f"{p['numpy_check_dequant_f32']['top1_agree']}" for p in res)
            if "min_router_logit_margin" in res[0]["numpy_check"]:
                chk += " router-margin " + ", ".join(f"{p['numpy_check']['min_router_logit_margin']:.3g}" for p in res)
        print(f"{out_name}: {os.path.getsize(dest)} bytes, gap median {doc['stats']['top1_top2_gap_median']}, "
              f"min {doc['stats']['top1_top2_gap_min']}, batch/inc {[p['batch_vs_incremental_max_abs_diff'] for p in res]}{chk} "
              f"({time.time() - t0:.1f} s)", file=sys.stderr)
        results.append(out_name)
    return results


def effects():
    """How much each feature moves the logits (numpy on the committed files and tokens): the feature
    switched off vs on, max |dlogit| per position (median, max) and argmax changes over the 192 positions."""
    import copy

    def setk(k, v):
        return lambda md: {**md, k: v}

    def dropk(*ks):
        return lambda md: {a: b for a, b in md.items() if a not in ks}

    cases = [
        ("llama-rope-llama3", "rope_freqs.weight removed", None, lambda W: {k: v for k, v in W.items() if k != "rope_freqs.weight"}, 512),
        ("llama-rope-yarn", "no rope scaling", dropk("llama.rope.scaling.type", "llama.rope.scaling.factor",
                                                      "llama.rope.scaling.original_context_length"), None, 512),
        ("llama-rope-yarn", "linear x4 instead of YaRN", setk("llama.rope.scaling.type", "linear"), None, 512),
        ("llama-rope-linear-swa", "no rope scaling", dropk("llama.rope.scaling.type", "llama.rope.scaling.factor"), None, 512),
        ("phi3", "short instead of long factors", None, None, 256),
        ("phi3", "rope.scaling.attn_factor 1", setk("phi3.rope.scaling.attn_factor", 1.0), None, 512),
        ("gemma3", "sliding window 4096", setk("gemma3.attention.sliding_window", 4096), None, 512),
        ("gemma3", "no linear scaling (global layer)", dropk("gemma3.rope.scaling.type", "gemma3.rope.scaling.factor"), None, 512),
        ("gemma3", "local base 1e6 instead of 10000", setk("gemma3.rope.freq_base_swa", 1e6), None, 512),
        ("gemma2", "sliding window 4096", setk("gemma2.attention.sliding_window", 4096), None, 512),
        ("gemma2", "no attention soft-cap", setk("gemma2.attn_logit_softcapping", 1e9), None, 512),
        ("gemma2", "no final soft-cap", setk("gemma2.final_logit_softcapping", 1e9), None, 512),
    ]
    for name, label, fmd, fW, n_ctx2 in cases:
        r, md, _ = read_gguf(os.path.join(OUT, f"{name}.gguf"))
        W = weights(r)
        with open(os.path.join(OUT, f"{name}.json"), encoding="utf-8") as f:
            d = json.load(f)
        dd, changes = [], 0
        for p in d["prompts"]:
            a, _ = forward(md, W, p["tokens"], 512)
            b, _ = forward(fmd(copy.deepcopy(md)) if fmd else md, fW(dict(W)) if fW else W, p["tokens"], n_ctx2)
            dd.append(np.abs(a - b).max(-1))
            changes += int((a.argmax(-1) != b.argmax(-1)).sum())
        dd = np.concatenate(dd)
        first = next((i for i, x in enumerate(dd[:64]) if x > 1e-9), None)
        print(f"{name:22s} {label:34s} max|dlogit| median {np.median(dd):6.3f} max {np.max(dd):6.3f}, "
              f"argmax changes {changes:3d}/{len(dd)}, prompt 0 first affected position {first}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("LLAMACPP_BUILD") or os.path.join(CACHE, "llamacpp-build"))
    ap.add_argument("--only", nargs="*", help="model names")
    ap.add_argument("--no-check", action="store_true", help="skip the numpy reference forward pass")
    ap.add_argument("--effects", action="store_true", help="only print how much each feature moves the committed files' logits")
    args = ap.parse_args()
    if args.effects:
        effects()
        return
    exe = os.path.join(args.build, "bin", "dump_logits")
    qexe = os.path.join(args.build, "bin", "llama-quantize")
    scratch = os.path.join(CACHE, "arch-fixtures")
    os.makedirs(scratch, exist_ok=True)
    os.makedirs(OUT, exist_ok=True)
    t0 = time.time()
    for m in MODELS:
        if args.only and m["name"] not in args.only:
            continue
        make(dict(m), exe, qexe, scratch, not args.no_check)
    print(f"done in {time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
