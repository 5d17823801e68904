#!/usr/bin/env bash
# Regenerate crates/model/tests/fixtures/arch/: tiny random-weight GGUF models
# (llama with Llama-3 / YaRN / linear RoPE, ternary TQ2_0 / TQ1_0 llama, phi3, qwen3moe, Mixtral-style llama
# MoE, gemma3, gemma2) and llama.cpp's logits for them. See
# make-arch-fixtures.py and crates/model/tests/fixtures/README.md.
#   scripts/llamacpp/make-arch-fixtures.sh                     # build (if needed) + all models
#   LLAMACPP_BUILD=~/.cache/cachefit/llamacpp-build scripts/llamacpp/make-arch-fixtures.sh --only phi3
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# LLAMACPP_BUILD=DIR: use an existing build-llamacpp.sh build folder as is.
build="${LLAMACPP_BUILD:-$("$here/build-llamacpp.sh")}"
python3 -c 'import numpy, gguf' 2>/dev/null || python3 -m pip install --quiet numpy 'gguf==0.19.0' >&2
python3 -c 'import importlib.metadata as m, sys; v = m.version("gguf"); sys.exit(0 if v == "0.19.0" else "gguf " + v + " installed, the fixtures were made with 0.19.0")'
exec python3 "$here/make-arch-fixtures.py" --build "$build" "$@"
