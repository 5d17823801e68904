#!/usr/bin/env bash
# Unpack llama.cpp's source from the PyPI sdist `llama-cpp-python==0.3.36`
# (vendor/llama.cpp) into a cache folder outside git; prints its path.
#   scripts/llamacpp/fetch-source.sh
set -euo pipefail
cache="${CACHEFIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cachefit}"
src="$cache/llama_cpp_python-0.3.36"
if [ ! -f "$src/vendor/llama.cpp/ggml/src/ggml-quants.c" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    echo "downloading the llama-cpp-python 0.3.36 sdist from PyPI ..." >&2
    # --no-build-isolation --no-deps: fetch the archive without preparing a
    # build environment for it (we build only ggml, with cmake).
    # pip prepares metadata even for `download`; give it the build backend.
    python3 -m pip install --quiet scikit-build-core >/dev/null 2>&1 || true
    python3 -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
        --dest "$tmp" "llama-cpp-python==0.3.36" >&2 || true
    archive="$(ls "$tmp"/llama_cpp_python-0.3.36.tar.gz 2>/dev/null || true)"
    if [ -z "$archive" ]; then
        echo "error: could not download llama_cpp_python-0.3.36.tar.gz" >&2
        exit 1
    fi
    mkdir -p "$cache"
    tar -xzf "$archive" -C "$cache"
fi
echo "$src/vendor/llama.cpp"
