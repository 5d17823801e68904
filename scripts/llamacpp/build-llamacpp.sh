#!/usr/bin/env bash
# Build the plain reference llama.cpp (from the PyPI sdist
# llama-cpp-python==0.3.36, see fetch-source.sh) into a cache folder outside
# git, plus scripts/llamacpp/dump_logits.cpp linked against it. Prints the
# build folder; binaries are in $build/bin.
#   scripts/llamacpp/build-llamacpp.sh
#
# Flags: Release, GGML_NATIVE=ON, but AMX disabled (-mno-amx-*): with GCC 12
# ggml's AMX path crashes on this CPU. No curl, no server, no tests.
# Targets: llama (shared), llama-perplexity, llama-quantize, llama-bench, then
# dump_logits by hand.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$("$here/fetch-source.sh")"
build="${CACHEFIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cachefit}/llamacpp-build"
jobs="${JOBS:-2}"
command -v cmake >/dev/null || python3 -m pip install --quiet cmake
noamx='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF >&2
cmake --build "$build" --target llama llama-perplexity llama-quantize llama-bench -j"$jobs" >&2
c++ -O2 -std=c++17 $noamx -o "$build/bin/dump_logits" "$here/dump_logits.cpp" \
    -I"$src/include" -I"$src/ggml/include" -L"$build/bin" \
    -lllama -lggml -lggml-base -Wl,-rpath,"$build/bin" >&2
echo "$build"
