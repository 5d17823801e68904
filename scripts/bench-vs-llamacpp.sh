#!/usr/bin/env bash
# Side-by-side speed and memory of cachefit and llama.cpp's llama-bench on
# this machine, in one run. Two llama.cpp builds (scripts/llamacpp/
# build-llamacpp.sh): AMX (the fastest on CPUs that have it; with the GCC 12
# fix; skipped on a CPU without AMX, where -march=native makes it the same
# build as the plain one) and plain (AMX off: what most users get). For each model and thread
# count the three alternate test by test (so drift in the machine's load
# hits all of them), several repetitions each; the table reports each
# tool's mean ± stdev and cachefit's ratio to each build. Peak RSS: one run
# of each tool on tg128 at depth 1024 (context 1152), cachefit with
# --no-probe (its bandwidth probe's buffer is not the model's memory).
#   scripts/bench-vs-llamacpp.sh                 # SmolLM2 Q4_1, Q8_0, Q4_0, Q4_K_M; -t 1,2
#   MODELS="Q4_1" THREADS="2" REPS=3 scripts/bench-vs-llamacpp.sh
# Writes target/bench-vs-llamacpp/{raw.jsonl,rss.tsv,table.md}; paste the
# table into docs/PERFORMANCE.md with the date, CPU and this command line.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/bench-vs-llamacpp
mkdir -p "$out"
: > "$out/raw.jsonl"
: > "$out/rss.tsv"
models_dir="$(scripts/fetch-models.sh)"
if grep -qw amx_int8 /proc/cpuinfo; then
    amx_build="$(AMX=1 scripts/llamacpp/build-llamacpp.sh)"
else
    echo "*** this CPU has no AMX: the AMX build would equal the plain one; comparing with the plain build only ***" >&2
    amx_build=""
fi
plain_build="$(scripts/llamacpp/build-llamacpp.sh)"
cargo build --release --quiet -p cachefit
cf=target/release/cachefit
reps="${REPS:-5}"

src="$models_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
paths=()
for q in ${MODELS:-Q4_1 Q8_0 Q4_0 Q4_K_M}; do
    if [ "$q" = Q4_1 ]; then paths+=("$src"); continue; fi
    p="$models_dir/SmolLM2-135M-Instruct.$q.cachefit.gguf"
    [ -f "$p" ] || "$cf" quantize "$src" "$p" "$q" --allow-requantize >&2
    paths+=("$p")
done

tag() { # tool: JSON lines on stdin, tagged
    python3 -c 'import sys,json
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"): d=json.loads(l); d["tool"]=sys.argv[1]; print(json.dumps(d))' "$1"
}
run_all() { # model threads args...
    local m="$1" t="$2"; shift 2
    if [ -n "$amx_build" ]; then
        "$amx_build/bin/llama-bench" -m "$m" -t "$t" -r "$reps" -o jsonl "$@" 2>/dev/null | tag "llama.cpp AMX" >> "$out/raw.jsonl"
    fi
    "$plain_build/bin/llama-bench" -m "$m" -t "$t" -r "$reps" -o jsonl "$@" 2>/dev/null | tag "llama.cpp plain" >> "$out/raw.jsonl"
    "$cf" bench -m "$m" -t "$t" -r "$reps" -o jsonl "$@" 2>/dev/null | tag cachefit >> "$out/raw.jsonl"
}
rss_kb() { # command...: peak RSS in KiB
    /usr/bin/time -f "%M" "$@" 2>&1 >/dev/null | tail -1
}
for m in "${paths[@]}"; do
    for t in ${THREADS:-1 2}; do
        echo "== $(basename "$m") -t $t" >&2
        run_all "$m" "$t" -p 512 -n 0
        run_all "$m" "$t" -p 0 -n 128
        run_all "$m" "$t" -p 0 -n 128 -d 1024
    done
    rss=(-p 0 -n 128 -d 1024 -r 1 -t 2)
    amx_rss=0
    [ -z "$amx_build" ] || amx_rss="$(rss_kb "$amx_build/bin/llama-bench" -m "$m" "${rss[@]}")"
    printf '%s\t%s\t%s\t%s\n' "$(basename "$m")" "$amx_rss" \
        "$(rss_kb "$plain_build/bin/llama-bench" -m "$m" "${rss[@]}")" \
        "$(rss_kb "$cf" bench -m "$m" "${rss[@]}" --no-probe)" >> "$out/rss.tsv"
done

python3 - "$out/raw.jsonl" "$out/rss.tsv" > "$out/table.md" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def test(r):
    name = f"pp{r['n_prompt']}" if r["n_prompt"] and not r["n_gen"] else f"tg{r['n_gen']}"
    return name + (f" @ d{r['n_depth']}" if r.get("n_depth") else "")
key = lambda r: (os.path.basename(r["model_filename"]), r["n_threads"], test(r))
by = {}
for r in rows:
    by.setdefault(key(r), {})[r["tool"]] = r
tools = ["llama.cpp AMX", "llama.cpp plain", "cachefit"]
print("| model | threads | test | llama.cpp AMX t/s | llama.cpp plain t/s | cachefit t/s | vs AMX | vs plain |")
print("|---|---:|---|---:|---:|---:|---:|---:|")
f = lambda r: f"{r['avg_ts']:.1f} ± {r['stddev_ts']:.1f}" if r else "n/a"
ratio = lambda a, b: f"{b['avg_ts'] / a['avg_ts']:.2f}×" if a and b else "-"
for k in sorted(by):
    a, p, c = (by[k].get(t) for t in tools)
    print(f"| {k[0]} | {k[1]} | {k[2]} | {f(a)} | {f(p)} | {f(c)} | {ratio(a, c)} | {ratio(p, c)} |")
print()
print("Peak RSS, tg128 at depth 1024 (context 1152), -t 2, one repetition:")
print()
print("| model | llama.cpp AMX MiB | llama.cpp plain MiB | cachefit MiB | cachefit / plain |")
print("|---|---:|---:|---:|---:|")
for line in open(sys.argv[2]):
    name, a, p, c = line.split()
    a, p, c = (int(x) / 1024 for x in (a, p, c))
    print(f"| {name} | {f'{a:.0f}' if a else 'n/a'} | {p:.0f} | {c:.0f} | {c / p:.2f} |")
PY
cat "$out/table.md"
