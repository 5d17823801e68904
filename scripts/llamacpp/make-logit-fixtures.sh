#!/usr/bin/env bash
# Regenerate crates/model/tests/fixtures/llamacpp-*.json: reference logits,
# greedy continuations and perplexity from the plain llama.cpp build
# (build-llamacpp.sh) for SmolLM2-135M-Instruct Q4_1 (as shipped) and for the
# Q8_0 file that `cachefit quantize` makes from it, and for the Q4_1 weights
# dequantized to F32 by llama-quantize (an f32-activation reference); and for
# Gemma 3 270M Q4_K_M as shipped (llamacpp-gemma3-270m-q4_k_m.json,
# llamacpp-perplexity-gemma3.json) and its weights dequantized to F32
# (llamacpp-gemma3-270m-dequant-f32.json, the clean reference). The fixtures are committed;
# tests read them, not a live build.
#   scripts/llamacpp/make-logit-fixtures.sh            # everything
#   SKIP_Q8=1 SKIP_F32=1 SKIP_PPL=1 scripts/llamacpp/make-logit-fixtures.sh
#   SKIP_SMOLLM2=1 scripts/llamacpp/make-logit-fixtures.sh   # Gemma 3 only
#   SKIP_GEMMA3=1 scripts/llamacpp/make-logit-fixtures.sh    # SmolLM2 only
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/crates/model/tests/fixtures"
# LLAMACPP_BUILD=DIR: use an existing build-llamacpp.sh build folder as is.
build="${LLAMACPP_BUILD:-$("$here/build-llamacpp.sh")}"
models="$("$root/scripts/fetch-models.sh")"
q4="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
q8="$models/SmolLM2-135M-Instruct.Q8_0.cachefit.gguf"
f32="$models/SmolLM2-135M-Instruct.Q4_1-dequant-F32.llamacpp.gguf"
mkdir -p "$out"

gemma3="$models/gemma-3-270m-Q4_K_M.gguf"
# Gemma 3's perplexity run: fewer chunks than SmolLM2's 40, its 262,144-token
# output head makes each chunk several times dearer (see the fixtures' README).
gemma3_chunks="${GEMMA3_PPL_CHUNKS:-24}"

variants=()
[ "${SKIP_SMOLLM2:-0}" = 1 ] || variants+=("q4_1:$q4")
if [ "${SKIP_SMOLLM2:-0}" != 1 ] && [ "${SKIP_Q8:-0}" != 1 ]; then
    (cd "$root" && cargo build --release -p cachefit >&2)
    "$root/target/release/cachefit" quantize "$q4" "$q8" Q8_0 --allow-requantize >&2
    variants+=("q8_0:$q8")
fi
if [ "${SKIP_SMOLLM2:-0}" != 1 ] && [ "${SKIP_F32:-0}" != 1 ]; then
    # The Q4_1 weights dequantized to F32 by llama.cpp: every matmul in f32,
    # no Q8 activation quantization, so no rounding-flip noise (see README).
    "$build/bin/llama-quantize" --allow-requantize "$q4" "$f32" F32 >/dev/null 2>&1
    variants+=("q4_1-dequant-f32:$f32")
fi

dumps=()
for v in "${variants[@]}"; do dumps+=("chatml:${v%%:*}:$out/llamacpp-smollm2-${v%%:*}.json:${v#*:}"); done
[ "${SKIP_GEMMA3:-0}" = 1 ] || dumps+=("gemma:q4_k_m:$out/llamacpp-gemma3-270m-q4_k_m.json:$gemma3")
if [ "${SKIP_GEMMA3:-0}" != 1 ] && [ "${SKIP_F32:-0}" != 1 ]; then
    gemma3_f32="$models/gemma-3-270m-Q4_K_M-dequant-F32.llamacpp.gguf"
    "$build/bin/llama-quantize" --allow-requantize "$gemma3" "$gemma3_f32" F32 >/dev/null 2>&1
    dumps+=("gemma:dequant-f32:$out/llamacpp-gemma3-270m-dequant-f32.json:$gemma3_f32")
fi
for v in "${dumps[@]}"; do
    chat="${v%%:*}"; rest="${v#*:}"; rest="${rest#*:}"; dest="${rest%%:*}"; model="${rest#*:}"
    python3 - "$build/bin/dump_logits" "$model" "$dest" "$chat" <<'PY'
import hashlib, json, subprocess, sys, tempfile, os
exe, model, dest, chat = sys.argv[1:5]
# (text, parse_special). Every prompt tokenizes to at most 64 tokens; the 64
# positions are the prompt plus its greedy continuation (the CJK one fills all 64
# for SmolLM2). The chat prompt is in the model's own format: ChatML for
# SmolLM2, Gemma's turns for Gemma 3.
CHAT = {
    "chatml": "<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n<|im_start|>assistant\n",
    "gemma": "<start_of_turn>user\nWhat is the boiling point of water at sea level?<end_of_turn>\n<start_of_turn>model\n",
}
PROMPTS = [
    ("The capital of France is", False),
    ("Once upon a time, in a small village at the edge of a great forest, there lived", False),
    ("The mitochondria is the powerhouse of the cell. It produces energy in the form of", False),
    ('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n', False),
    ("fn main() {\n    let v: Vec<i32> = (1..=10).collect();\n    println!(\"{}\", v.iter().sum::<i32>());\n", False),
    (CHAT[chat], True),
    ("Le garçon a mangé une crème brûlée au café. Über den Wolken muss die Freiheit grenzenlos sein.", False),
    ("東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.", False),
    ("I love pizza 🍕 and coffee ☕! Let's go 🚀🎉 Café naïve résumé —", False),
    ("1, 1, 2, 3, 5, 8, 13, 21,", False),
]
h = hashlib.sha256()
with open(model, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
res = []
for text, special in PROMPTS:
    with tempfile.NamedTemporaryFile("wb", delete=False) as tf:
        tf.write(text.encode("utf-8"))
    try:
        raw = subprocess.run([exe, model, tf.name, "1" if special else "0", "64", "32"],
                             check=True, capture_output=True).stdout
    finally:
        os.unlink(tf.name)
    d = json.loads(raw.decode("utf-8", "replace"))
    p = {"text": text, "parse_special": special, "n_prompt": d["n_prompt"],
         "tokens": d["tokens"], "top20": d["top20"], "greedy32": d["greedy32"],
         "greedy_top2_gap": d["greedy_top2_gap"], "greedy32_text": d["greedy32_text"],
         "batch_vs_incremental_max_abs_diff": d["batch_vs_incremental_max_abs_diff"],
         "batch_vs_incremental_max_abs_diff_top20": d["batch_vs_incremental_max_abs_diff_top20"]}
    res.append(p)
    print(f"{os.path.basename(dest)}: {text[:40]!r} ({d['n_prompt']} tokens) -> {d['greedy32_text'][:60]!r}", file=sys.stderr)
doc = {
    "source": "llama.cpp from the PyPI sdist llama-cpp-python==0.3.36 (vendor/llama.cpp), "
              "built by scripts/llamacpp/build-llamacpp.sh, run by scripts/llamacpp/dump_logits.cpp "
              "via scripts/llamacpp/make-logit-fixtures.sh",
    "model": os.path.basename(model),
    "model_sha256": h.hexdigest(),
    "settings": {"n_ctx": 512, "n_batch": 512, "n_ubatch": 512, "n_threads": 1, "n_threads_batch": 1,
                 "flash_attn": False, "kv_cache_type": "f32", "add_special": True, "n_pos": 64, "n_greedy": 32,
                 "top20": "logits of the 64 tokens decoded as one batch at positions 0..63; entry i predicts token i+1",
                 "greedy32": "argmax (lowest id on ties), prompt decoded as one batch then one token per decode, no stop at EOG",
                 "logit_digits": 5},
    "prompts": res,
}
with open(dest, "w", encoding="utf-8") as f:
    json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
    f.write("\n")
PY
done

data="${TINYSHAKESPEARE:-$root/../shared/data/tinyshakespeare.txt}"
[ -f "$data" ] || data=/work/shared/data/tinyshakespeare.txt
if [ "${SKIP_PPL:-0}" != 1 ] && [ "${#variants[@]}" -gt 0 ]; then
    entries=()
    for v in "${variants[@]}"; do
        name="${v%%:*}"; model="${v#*:}"
        log="$build/perplexity-$name.log"
        "$build/bin/llama-perplexity" -m "$model" -f "$data" -c 512 --chunks 40 -t 2 >"$log" 2>&1
        entries+=("$name|$(basename "$model")|$(sha256sum "$model" | cut -d' ' -f1)|$(grep 'Final estimate' "$log")")
    done
    python3 - "$out/llamacpp-perplexity.json" "$(sha256sum "$data" | cut -d' ' -f1)" "${entries[@]}" <<'PY'
import json, re, sys
dest, data_sha = sys.argv[1:3]
runs = []
for e in sys.argv[3:]:
    name, model, sha, line = e.split("|", 3)
    m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", line)
    runs.append({"quant": name, "model": model, "model_sha256": sha, "ppl": float(m.group(1)), "ppl_pm": float(m.group(2)),
                 "command": f"llama-perplexity -m {model} -f tinyshakespeare.txt -c 512 --chunks 40 -t 2"})
doc = {"source": "llama.cpp from the PyPI sdist llama-cpp-python==0.3.36, built by scripts/llamacpp/build-llamacpp.sh",
       "data": "shared/data/tinyshakespeare.txt", "data_sha256": data_sha,
       "settings": "llama-perplexity defaults (KV cache F16, flash attention auto, n_batch 2048 = 4 chunks of 512 as parallel sequences, n_ubatch 512) except -c 512 --chunks 40 -t 2",
       "runs": runs}
with open(dest, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print(json.dumps(runs, indent=1), file=sys.stderr)
PY
fi
if [ "${SKIP_PPL:-0}" != 1 ] && [ "${SKIP_GEMMA3:-0}" != 1 ]; then
    log="$build/perplexity-gemma3-q4_k_m.log"
    start=$(date +%s.%N)
    "$build/bin/llama-perplexity" -m "$gemma3" -f "$data" -c 512 --chunks "$gemma3_chunks" -t 2 >"$log" 2>&1
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    python3 - "$out/llamacpp-perplexity-gemma3.json" "$(sha256sum "$data" | cut -d' ' -f1)" "$gemma3_chunks" "$secs" \
        "q4_k_m|$(basename "$gemma3")|$(sha256sum "$gemma3" | cut -d' ' -f1)|$(grep 'Final estimate' "$log")" <<'PY'
import json, re, sys
dest, data_sha, chunks, secs, entry = sys.argv[1:6]
name, model, sha, line = entry.split("|", 3)
m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", line)
runs = [{"quant": name, "model": model, "model_sha256": sha, "ppl": float(m.group(1)), "ppl_pm": float(m.group(2)),
         "command": f"llama-perplexity -m {model} -f tinyshakespeare.txt -c 512 --chunks {chunks} -t 2",
         "seconds": round(float(secs), 1)}]
doc = {"source": "llama.cpp from the PyPI sdist llama-cpp-python==0.3.36, built by scripts/llamacpp/build-llamacpp.sh",
       "data": "shared/data/tinyshakespeare.txt", "data_sha256": data_sha,
       "settings": f"llama-perplexity defaults (KV cache F16, flash attention auto, n_batch 2048 = 4 chunks of 512 as parallel sequences, n_ubatch 512) except -c 512 --chunks {chunks} -t 2; "
                   "add_bos_token is true for Gemma: the whole text is tokenized with BOS (2) first, cut into 512-token chunks, and llama-perplexity "
                   "overwrites the first token of every chunk with BOS (tools/perplexity/perplexity.cpp perplexity()); the second half of each chunk is scored",
       "runs": runs}
with open(dest, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print(json.dumps(runs, indent=1), file=sys.stderr)
PY
fi
ls -la "$out" >&2
