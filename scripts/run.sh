#!/usr/bin/env bash
# The main job: build cachefit and generate from a prompt with the model
# built into the binary (models/cachefit-ternary.gguf, issues #5 and #24); no
# download.
#   scripts/run.sh ["PROMPT"] [more cachefit run flags]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p cachefit
prompt="${1:-ROMEO:}"
shift || true
exec target/release/cachefit run "$prompt" -n 120 "$@"
