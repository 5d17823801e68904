#!/usr/bin/env bash
# Scale benchmark of the long-memory store (issue 18 §4): a synthetic
# 100M-token history in SmolLM2's geometry (~31 GB on disk, ~2 GB index
# file) with planted needles, then search latency, recall per tier, index
# memory and open times. Not part of CI (tests/scale.rs runs 1M tokens).
#   scripts/memory-scale.sh [TOKENS] [DIR]     # defaults: 100000000, /tmp
# Needs ~33 GB free in DIR for 100M tokens; the files are deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
tokens="${1:-100000000}"
dir="${2:-/tmp}"
file="$dir/memory-scale-$tokens.mem"
cargo build --release --quiet -p cachefit-memory --example memory_scale
bin=target/release/examples/memory_scale
# Write the haystack, then search it with a fresh process: a writer's open
# (writes the index file), a reader's open from it, cold opens with and
# without it, then the searches.
"$bin" --tokens "$tokens" --path "$file" --keep --no-search
"$bin" --path "$file" --reuse --reopen --keep
"$bin" --path "$file" --reuse --cold
