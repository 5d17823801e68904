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
    # Straight from PyPI's simple index, checked against its sha256: `pip
    # download` of an sdist first prepares its metadata, which for this
    # package needs cmake and a compiler toolchain set up.
    python3 - "$tmp" <<'PY' >&2
import hashlib, re, sys, urllib.request
name = "llama_cpp_python-0.3.36.tar.gz"
index = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/", timeout=60).read().decode()
url, want = re.search(r'href="([^"#]*/' + re.escape(name) + r')#sha256=([0-9a-f]{64})"', index).groups()
data = urllib.request.urlopen(url, timeout=600).read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"sha256 mismatch for {name}: {got}, index says {want}")
open(f"{sys.argv[1]}/{name}", "wb").write(data)
PY
    archive="$(ls "$tmp"/llama_cpp_python-0.3.36.tar.gz 2>/dev/null || true)"
    if [ -z "$archive" ]; then
        echo "error: could not download llama_cpp_python-0.3.36.tar.gz" >&2
        exit 1
    fi
    mkdir -p "$cache"
    tar -xzf "$archive" -C "$cache"
fi
echo "$src/vendor/llama.cpp"
