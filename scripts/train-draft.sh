#!/usr/bin/env bash
# A draft model for SmolLM2-135M-Instruct (speculative decoding, issue 23
# §4), made from a clean checkout with our own pipeline on SmolLM2's
# vocabulary:
#
#   scripts/train-draft.sh            # → target/draft-smollm2/draft.gguf
#
# 1. fetch SmolLM2-135M-Instruct Q4_1 (scripts/fetch-models.sh) and the
#    English corpus (scripts/fetch-corpus.sh);
# 2. `data`: tinyshakespeare + english.txt, no task passages (they are our
#    own format, not what SmolLM2 says);
# 3. `bpe --from-model`: SmolLM2's tokenizer (49,152 tokens, its chat
#    template) instead of a trained BPE;
# 4. scripts/distill-smollm2.py: SmolLM2's own generations on up to
#    DISTILL_COUNT seeded prompts (summaries, rewrites, copies and
#    continuations of corpus training passages, explanations, stories,
#    Python; chat format and plain text; 3 in 4 greedy), from one
#    `cachefit serve` with 8 slots on THREADS threads; no generation starts
#    after DISTILL_SECONDS (so about 10 CPU-minutes on 2 cores; how many
#    prompts get done depends on the machine); kept if distilled.jsonl is
#    already there (delete it, or DISTILL_FRESH=1, to make it again);
# 5. `pack --distilled`: the corpus, then the generations' training part
#    repeated until it is DISTILLED_SHARE (0.35) of train.bin, or
#    DISTILLED_REPEAT times (every 10th generation is held out and scored
#    first by --eval-windows);
# 6. `train`: int8 `cachefit` network with fixed token codes (no embedding
#    table), d 128, blocks CCACCA; 2 threads, about 25 minutes here;
# 7. `export` to target/draft-smollm2/draft.gguf (SmolLM2's tokenizer keys
#    inside, so `cachefit run -m SmolLM2… -md draft.gguf` accepts it), and
#    one speculative run as a smoke test.
#
# Settings (environment): DRAFT_DIR (target/draft-smollm2), DISTILL_COUNT
# (1600), DISTILL_SECONDS (290), DISTILLED_SHARE (0.35) or DISTILLED_REPEAT,
# STEPS (440), THREADS (2), DISTILL_FRESH.
# Rerunning continues an interrupted `train` from its checkpoint.
# Measure it with scripts/bench-draft.py.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${DRAFT_DIR:-target/draft-smollm2}
count=${DISTILL_COUNT:-1600}
distill_seconds=${DISTILL_SECONDS:-290}
repeat=${DISTILLED_REPEAT:-}
share=${DISTILLED_SHARE:-0.35}
steps=${STEPS:-440}
threads=${THREADS:-2}

cargo build --release --quiet -p cachefit -p cachefit-train
B="${CARGO_TARGET_DIR:-target}/release/cachefit-train"
C="${CARGO_TARGET_DIR:-target}/release/cachefit"

models=$(scripts/fetch-models.sh)
smollm="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$smollm" ] || { echo "train-draft: $smollm is missing (scripts/fetch-models.sh)" >&2; exit 1; }
english=$(scripts/fetch-corpus.sh)

mkdir -p "$dir"
$B -q data --dir "$dir" --corpus data/tinyshakespeare.txt --corpus "$english" \
    --task-ratio 0 --eval-passages 20
$B -q bpe --dir "$dir" --from-model "$smollm"

if [ -n "${DISTILL_FRESH:-}" ] || [ ! -s "$dir/distilled.jsonl" ]; then
    scripts/distill-smollm2.py --dir "$dir" --out "$dir/distilled.jsonl" --bin "$C" \
        --model "$smollm" --count "$count" --threads "$threads" --max-seconds "$distill_seconds"
fi
if [ -z "$repeat" ]; then
    # Repeat the distilled text until it is DISTILLED_SHARE of train.bin.
    $B -q pack --dir "$dir" --distilled "$dir/distilled.jsonl" >/dev/null
    repeat=$(python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
share, d = float(sys.argv[2]), m["distilled"]["train_tokens"]
corpus = m["splits"]["train"]["tokens"] - d
print(max(1, round(share / (1 - share) * corpus / d)))' "$dir/pack.json" "$share")
    echo "distilled text: repeated $repeat times (DISTILLED_SHARE $share)" >&2
fi
$B -q pack --dir "$dir" --distilled "$dir/distilled.jsonl" --distilled-repeat "$repeat"

# d 128: the output head (49,152 × d, int8) is most of the draft's bytes
# and time per token, in training (with the softmax over 49,152) and when
# it runs; blocks are cheap beside it, so six of them.
$B train --dir "$dir" --token-codes 512 --code-seed 1 \
    --d 128 --ffn 384 --heads 4 --kv-heads 2 --head-dim 32 --pattern CCACCA \
    --context 2048 --softcap 0 \
    --steps "$steps" --batch 4 --seq-len 1024 --warmup 20 --lr 3e-3 \
    --eval-every 65 --eval-windows 12 --checkpoint-every 40 -t "$threads"
$B -q export --dir "$dir" --name smollm2-draft --out "$dir/draft.gguf"

# Smoke test: SmolLM2 accepts it as a draft and says the same.
"$C" run -m "$smollm" -md "$dir/draft.gguf" -t "$threads" -n 48 --temp 0 --json \
    -p "Once upon a time, in a kingdom by the sea," | python3 -c '
import json, sys
r = json.load(sys.stdin)
s = r["speculation"]
print("smoke test: %d tokens at %.0f tok/s, %d of %d guesses accepted"
      % (r["generated_tokens"], r["gen_tok_s"], s["accepted"], s["drafted"]), file=sys.stderr)'
echo "draft model: $dir/draft.gguf" >&2
