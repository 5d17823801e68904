#!/usr/bin/env bash
# The main job. Until the embedded default model exists, this fetches the
# SmolLM2-135M test model and inspects it.
set -euo pipefail
cd "$(dirname "$0")/.."
models="$(scripts/fetch-models.sh)"
cargo build --release --quiet -p cachefit
exec target/release/cachefit inspect "$models/SmolLM2-135M-Instruct.Q4_1.gguf" "$@"
