#!/usr/bin/env bash
# Build the plain reference llama.cpp (from the PyPI sdist
# llama-cpp-python==0.3.36, see fetch-source.sh) into a cache folder outside
# git, plus scripts/llamacpp/dump_logits.cpp linked against it. Prints the
# build folder; binaries are in $build/bin.
#   scripts/llamacpp/build-llamacpp.sh          # plain: AMX disabled
#   AMX=1 scripts/llamacpp/build-llamacpp.sh    # AMX, with the fix below
#
# Flags: Release, GGML_NATIVE=ON, no curl, no server, no tests. The plain
# build disables AMX (-mno-amx-*): with GCC 12 a native build crashes in
# ggml's AMX tile setup, the compiler dropping the stores that fill the
# tile config before `_tile_loadconfig` reads it (upstream PR #26954). The
# AMX build (what this CPU runs fastest) adds one compiler barrier before
# that call, `asm volatile("" ::"r"(&tc):"memory")`, patched into the
# unpacked source (a no-op everywhere else).
# Targets: llama (shared), llama-perplexity, llama-quantize, llama-bench, then
# dump_logits by hand.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$("$here/fetch-source.sh")"
build="${CACHEFIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cachefit}/llamacpp-build"
jobs="${JOBS:-2}"
command -v cmake >/dev/null || python3 -m pip install --quiet cmake
noamx='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'
if [ "${AMX:-0}" = 1 ]; then
    build="$build-amx"
    noamx=''
    mmq="$src/ggml/src/ggml-cpu/amx/mmq.cpp"
    if ! grep -q 'asm volatile("" ::"r"(&tc):"memory");' "$mmq"; then
        sed -i 's|^\(\s*\)_tile_loadconfig(&tc);|\1asm volatile("" ::"r"(\&tc):"memory");\n\1_tile_loadconfig(\&tc);|' "$mmq"
    fi
    grep -q 'asm volatile("" ::"r"(&tc):"memory");' "$mmq" || { echo "error: could not patch $mmq" >&2; exit 1; }
fi
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF >&2
cmake --build "$build" --target llama llama-perplexity llama-quantize llama-bench -j"$jobs" >&2
c++ -O2 -std=c++17 $noamx -o "$build/bin/dump_logits" "$here/dump_logits.cpp" \
    -I"$src/include" -I"$src/ggml/include" -L"$build/bin" \
    -lllama -lggml -lggml-base -Wl,-rpath,"$build/bin" >&2
echo "$build"
