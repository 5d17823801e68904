#!/usr/bin/env bash
# Side-by-side speed of cachefit and llama.cpp's llama-bench on this machine,
# in one run: for each model and thread count, the two tools alternate test
# by test (so drift in the machine's load hits both), several repetitions
# each, and the table reports each tool's mean ± stdev and the ratio.
#   scripts/bench-vs-llamacpp.sh                 # SmolLM2 Q4_1, Q8_0, Q4_0, Q4_K_M; -t 1,2
#   MODELS="Q4_1" THREADS="2" REPS=3 scripts/bench-vs-llamacpp.sh
# Writes target/bench-vs-llamacpp/{raw.jsonl,table.md}; paste the table into
# docs/PERFORMANCE.md with the date, CPU and this command line.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/bench-vs-llamacpp
mkdir -p "$out"
: > "$out/raw.jsonl"
models_dir="$(scripts/fetch-models.sh)"
build="$(scripts/llamacpp/build-llamacpp.sh)"
cargo build --release --quiet -p cachefit
cf=target/release/cachefit
lb="$build/bin/llama-bench"
reps="${REPS:-5}"

src="$models_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
paths=()
for q in ${MODELS:-Q4_1 Q8_0 Q4_0 Q4_K_M}; do
    if [ "$q" = Q4_1 ]; then paths+=("$src"); continue; fi
    p="$models_dir/SmolLM2-135M-Instruct.$q.cachefit.gguf"
    [ -f "$p" ] || "$cf" quantize "$src" "$p" "$q" --allow-requantize >&2
    paths+=("$p")
done

# tests: "pp512", "tg128", "tg128 @ d1024"
run_pair() { # model threads args...
    local m="$1" t="$2"; shift 2
    "$lb" -m "$m" -t "$t" -r "$reps" -o jsonl "$@" 2>/dev/null \
        | python3 -c 'import sys,json
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"): d=json.loads(l); d["tool"]="llama.cpp"; print(json.dumps(d))' >> "$out/raw.jsonl"
    "$cf" bench -m "$m" -t "$t" -r "$reps" -o jsonl "$@" 2>/dev/null \
        | python3 -c 'import sys,json
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"): d=json.loads(l); d["tool"]="cachefit"; print(json.dumps(d))' >> "$out/raw.jsonl"
}
for m in "${paths[@]}"; do
    for t in ${THREADS:-1 2}; do
        echo "== $(basename "$m") -t $t" >&2
        run_pair "$m" "$t" -p 512 -n 0
        run_pair "$m" "$t" -p 0 -n 128
        run_pair "$m" "$t" -p 0 -n 128 -d 1024
    done
done

python3 - "$out/raw.jsonl" > "$out/table.md" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def test(r):
    name = f"pp{r['n_prompt']}" if r["n_prompt"] and not r["n_gen"] else f"tg{r['n_gen']}"
    return name + (f" @ d{r['n_depth']}" if r.get("n_depth") else "")
key = lambda r: (os.path.basename(r["model_filename"]), r["n_threads"], test(r))
by = {}
for r in rows:
    by.setdefault(key(r), {})[r["tool"]] = r
print("| model | threads | test | llama.cpp t/s | cachefit t/s | ratio |")
print("|---|---:|---|---:|---:|---:|")
for k in sorted(by):
    a, b = by[k].get("llama.cpp"), by[k].get("cachefit")
    f = lambda r: f"{r['avg_ts']:.1f} ± {r['stddev_ts']:.1f}" if r else "-"
    ratio = f"{b['avg_ts'] / a['avg_ts']:.2f}×" if a and b else "-"
    print(f"| {k[0]} | {k[1]} | {k[2]} | {f(a)} | {f(b)} | {ratio} |")
PY
cat "$out/table.md"
