#!/usr/bin/env bash
# Bits per byte of models on each held-out text of a pipeline folder
# (issue 24: the table in docs/MODEL-CARD.md). Every model reads the same
# bytes with its own tokenizer through `cachefit perplexity` (chunks of
# 1024 tokens, the second half of each scored, as llama-perplexity does),
# so models with different vocabularies compare fairly.
#   scripts/eval-bpb.sh PIPELINE_DIR MODEL.gguf [MODEL.gguf ...]
# PIPELINE_DIR is a `cachefit-train data` output (data.json lists each
# source's held-out bytes; corpus.val.txt holds them in that order).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/eval-bpb.sh PIPELINE_DIR MODEL.gguf...}
shift
[ $# -gt 0 ] || { echo "eval-bpb: no model given" >&2; exit 2; }
cargo build --release --quiet -p cachefit
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$dir" "$tmp" <<'PY'
import json, sys, pathlib
d, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
meta = json.loads((d / "data.json").read_text())
val = (d / "corpus.val.txt").read_bytes()
at = 0
for s in meta["sources"]:
    n = s["val_bytes"]
    (out / f'{s["stem"]}.txt').write_bytes(val[at:at + n])
    at += n + 1  # the held-out parts are joined by one newline
PY
printf '%-48s %-18s %10s %12s %8s\n' model text bytes_scored bits/byte ppl
for m in "$@"; do
    for t in "$tmp"/*.txt; do
        j=$(target/release/cachefit perplexity -m "$m" -f "$t" -c 1024 -b 256 --json 2>/dev/null)
        python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("%-48s %-18s %10d %12.4f %8.2f" % (sys.argv[2][-48:], sys.argv[3], r["scored_bytes"], r["bits_per_byte"], r["ppl"]))' "$j" "$m" "$(basename "$t" .txt)"
    done
done
