#!/usr/bin/env bash
# Scale benchmark of the long-memory store (issue 18 §4) in the engine's
# geometry of today: a synthetic 100M-token history whose blocks keep 12
# slots of 8-byte codes (~10.5 GB on disk, ~0.7 GB index file), planted
# needles, and per needle one retrieval = 8 queries (the first 8 slots
# search, k = 32 each) through MemoryFile::search_many, next to the same
# queries searched one by one. Reports latency per retrieval, recall per
# tier, index memory, disk bytes and open times. Not part of CI
# (tests/scale.rs runs 2M tokens).
#   scripts/memory-scale.sh [TOKENS] [DIR]     # defaults: 100000000, /tmp
# Needs ~12 GB free in DIR for 100M tokens; the files are deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
tokens="${1:-100000000}"
dir="${2:-/tmp}"
file="$dir/memory-scale-$tokens.mem"
cargo build --release --quiet -p cachefit-memory --example memory_scale
bin=target/release/examples/memory_scale
# Write the haystack, then search it with a fresh process: a writer's open
# (writes the index file if missing), a reader's open from it, cold opens
# with and without it, warm searches; then searches with the page cache
# dropped before each retrieval (the fine pass reads from disk).
"$bin" --tokens "$tokens" --path "$file" --keep --no-search
"$bin" --path "$file" --reuse --reopen --keep
"$bin" --path "$file" --reuse --cold --variant "batch: one" --variant loop
