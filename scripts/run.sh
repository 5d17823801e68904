#!/usr/bin/env bash
# The main job. Until the embedded default model exists (issue #5), this
# fetches the SmolLM2-135M test model and generates from a prompt with it.
#   scripts/run.sh ["PROMPT"] [more cachefit run flags]
set -euo pipefail
cd "$(dirname "$0")/.."
models="$(scripts/fetch-models.sh)"
cargo build --release --quiet -p cachefit
prompt="${1:-The capital of France is}"
shift || true
exec target/release/cachefit run -m "$models/SmolLM2-135M-Instruct.Q4_1.gguf" -p "$prompt" -n 48 "$@"
