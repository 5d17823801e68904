#!/usr/bin/env bash
# Regenerate crates/kernels/tests/fixtures/ggml-quants.gguf: ggml's own
# reference quantizer and dequantizer output for every type we implement,
# from llama.cpp's source in the PyPI sdist llama-cpp-python==0.3.36.
# Needs cmake (pip install cmake) and a C compiler. The fixture is committed;
# tests use it, not a live build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
src="$("$here/fetch-source.sh")"
build="${CACHEFIT_CACHE:-$HOME/.cache/cachefit}/ggml-build"
command -v cmake >/dev/null || python3 -m pip install --quiet cmake
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DGGML_NATIVE=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_OPENMP=OFF >/dev/null
cmake --build "$build" --target ggml-base -j"$(nproc)" >/dev/null
lib="$(find "$build" -name 'libggml-base.a' | head -1)"
cc -O2 -c -o "$build/make_quant_fixtures.o" "$here/make_quant_fixtures.c" -I"$src/ggml/include"
c++ -o "$build/make_quant_fixtures" "$build/make_quant_fixtures.o" "$lib" -lm -lpthread
"$build/make_quant_fixtures" "$build/quants.bin"
mkdir -p "$root/crates/kernels/tests/fixtures"
python3 "$here/pack_fixtures.py" "$build/quants.bin" "$root/crates/kernels/tests/fixtures/ggml-quants.gguf"
