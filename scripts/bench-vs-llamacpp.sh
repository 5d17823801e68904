#!/usr/bin/env bash
# Side-by-side speed and memory of cachefit and llama.cpp's llama-bench on
# this machine, in one run. Two llama.cpp builds (scripts/llamacpp/
# build-llamacpp.sh): AMX (the fastest on CPUs that have it; with the GCC 12
# fix; skipped on a CPU without AMX, where -march=native makes it the same
# build as the plain one) and plain (AMX off: what most users get).
#
# Shared machines are noisy: a neighbour on the host takes a vCPU away for
# milliseconds at a time (the "steal" column of /proc/stat), and a -t 2
# run waits for the vCPU that was taken at every barrier. So each test runs
# in ROUNDS rounds; in each round the tools run one after the other, REPS
# repetitions each (after llama-bench's and our warm-up). A round's ratio
# compares runs seconds apart; the table gives the median ratio over the
# rounds, each tool's mean ± stdev over all its repetitions, the share of
# CPU time stolen while the test ran, and whether issue #4's target is met.
# Peak RSS: one run of each tool on tg128 at depth 1024 (context 1152),
# cachefit with --no-probe (its bandwidth probe's buffer is not the
# model's memory).
#   scripts/bench-vs-llamacpp.sh                 # SmolLM2 Q4_1, Q8_0, Q4_0, Q4_K_M, Qwen2.5-Coder-0.5B Q4_K_M; -t 1,2
#   MODELS="Q4_1" THREADS="2" ROUNDS=3 REPS=2 scripts/bench-vs-llamacpp.sh
#   MODELS="gemma3" scripts/bench-vs-llamacpp.sh   # Gemma 3 270M Q4_K_M as shipped
#   MODELS="qwen" scripts/bench-vs-llamacpp.sh     # Qwen2.5-Coder-0.5B-Instruct Q4_K_M
#   DEPTH=1 scripts/bench-vs-llamacpp.sh           # also -d 4096: tg128 and pp512 (issue 23)
# The table has issue 23's targets (pp512 at least 2× llama.cpp, 5× on
# SmolLM2 Q4_1; tg128 streaming at least 90% of the read bandwidth of the
# level the model lives in, cachefit's `bandwidth_pct`, measured in the same
# run; at depth, decode keeping its depth-0 lead and prefill falling off no
# more than llama.cpp's) and the fraction for every tg row.
#   BASELINE=/path/to/older/cachefit scripts/bench-vs-llamacpp.sh
# BASELINE adds an older cachefit binary to every round, and a before/after
# table (median over rounds of now/before) for changes that must not slow
# anything down.
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
reps="${REPS:-2}"
rounds="${ROUNDS:-3}"

src="$models_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
paths=()
for q in ${MODELS:-Q4_1 Q8_0 Q4_0 Q4_K_M qwen}; do
    if [ "$q" = Q4_1 ]; then paths+=("$src"); continue; fi
    if [ "$q" = gemma3 ]; then paths+=("$models_dir/gemma-3-270m-Q4_K_M.gguf"); continue; fi
    if [ "$q" = qwen ]; then paths+=("$models_dir/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"); continue; fi
    p="$models_dir/SmolLM2-135M-Instruct.$q.cachefit.gguf"
    [ -f "$p" ] || "$cf" quantize "$src" "$p" "$q" --allow-requantize >&2
    paths+=("$p")
done

stat_cpu() { # "steal total" CPU ticks of the whole machine so far
    awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat
}
tag() { # tool round "steal total" before: JSON lines on stdin, tagged
    python3 -c 'import sys,json
before = [int(x) for x in sys.argv[3].split()]
with open("/proc/stat") as f:
    after = [int(x) for x in f.readline().split()[1:9]]
steal = 100 * (after[7] - before[0]) / max(1, sum(after) - before[1])
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"):
        d=json.loads(l); d["tool"]=sys.argv[1]; d["round"]=int(sys.argv[2]); d["steal_pct"]=steal
        print(json.dumps(d))' "$@"
}
run_one() { # tool round command...
    local tool="$1" round="$2" before
    shift 2
    before="$(stat_cpu)"
    "$@" -o jsonl 2>/dev/null | tag "$tool" "$round" "$before" >> "$out/raw.jsonl"
}
run_all() { # model threads args...: every tool, ROUNDS rounds
    local m="$1" t="$2" r
    shift 2
    for r in $(seq "$rounds"); do
        if [ -n "$amx_build" ]; then
            run_one "llama.cpp AMX" "$r" "$amx_build/bin/llama-bench" -m "$m" -t "$t" -r "$reps" "$@"
        fi
        run_one "llama.cpp plain" "$r" "$plain_build/bin/llama-bench" -m "$m" -t "$t" -r "$reps" "$@"
        run_one cachefit "$r" "$cf" bench -m "$m" -t "$t" -r "$reps" "$@"
        if [ -n "${BASELINE:-}" ]; then
            run_one "cachefit before" "$r" "$BASELINE" bench -m "$m" -t "$t" -r "$reps" "$@"
        fi
    done
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
        if [ -n "${DEPTH:-}" ]; then
            run_all "$m" "$t" -p 0 -n 128 -d 4096
            run_all "$m" "$t" -p 512 -n 0 -d 4096
        fi
    done
    rss=(-p 0 -n 128 -d 1024 -r 1 -t 2)
    amx_rss=0
    [ -z "$amx_build" ] || amx_rss="$(rss_kb "$amx_build/bin/llama-bench" -m "$m" "${rss[@]}")"
    printf '%s\t%s\t%s\t%s\n' "$(basename "$m")" "$amx_rss" \
        "$(rss_kb "$plain_build/bin/llama-bench" -m "$m" "${rss[@]}")" \
        "$(rss_kb "$cf" bench -m "$m" "${rss[@]}" --no-probe)" >> "$out/rss.tsv"
done

python3 - "$out/raw.jsonl" "$out/rss.tsv" > "$out/table.md" <<'PY'
import json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def test(r):
    name = f"pp{r['n_prompt']}" if r["n_prompt"] and not r["n_gen"] else f"tg{r['n_gen']}"
    return name + (f" @ d{r['n_depth']}" if r.get("n_depth") else "")
# Issue 23's speed targets: cachefit / llama.cpp at least this (pp512: 2×,
# 5× on SmolLM2 Q4_1). Decode's target is the bandwidth fraction below;
# tg rows keep issue 4's 1.25× (1.5× at depth) as the floor on the ratio.
def target(model, name):
    if name.startswith("pp") and "@" not in name:
        return 5.0 if "Q4_1.gguf" in model else 2.0
    return 1.0 if name.startswith("pp") else 1.5 if "@" in name else 1.25
CEILING = 90.0  # % of the level's read bandwidth, tg at depth 0
key = lambda r: (os.path.basename(r["model_filename"]), r["n_threads"], test(r))
by = {}
for r in rows:
    by.setdefault(key(r), {}).setdefault(r["tool"], {})[r["round"]] = r
def stats(runs):
    if not runs:
        return "n/a"
    xs = [x for r in runs.values() for x in r["samples_ts"]]
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.1f} ± {sd:.1f}"
def ratio(peer, ours):
    common = sorted(set(peer) & set(ours))
    if not common:
        return None
    return statistics.median(ours[i]["avg_ts"] / peer[i]["avg_ts"] for i in common)
show = lambda x: f"{x:.2f}×" if x is not None else "-"
print("| model | threads | test | llama.cpp AMX t/s | llama.cpp plain t/s | cachefit t/s | vs AMX | vs plain (rounds) | target | met | % of level (tg) | steal |")
print("|---|---:|---|---:|---:|---:|---:|---:|---:|:-:|---:|---:|")
met_all = True
for k in sorted(by):
    a, p, c = (by[k].get(t, {}) for t in ["llama.cpp AMX", "llama.cpp plain", "cachefit"])
    ra, rp = ratio(a, c), ratio(p, c)
    rounds = ", ".join(f"{c[i]['avg_ts'] / p[i]['avg_ts']:.2f}" for i in sorted(set(p) & set(c)))
    # Against the fastest build: the smaller of the two ratios.
    worst = min((x for x in (ra, rp) if x is not None), default=None)
    met = worst is not None and worst >= target(k[0], k[2])
    # Decode at depth 0 must also stream >= CEILING% of its level.
    pct = [r.get("bandwidth_pct") for r in c.values() if r.get("bandwidth_pct") is not None]
    level = next((r.get("mem_level") for r in c.values() if r.get("mem_level")), "")
    frac = statistics.median(pct) if pct and k[2].startswith("tg") else None
    if frac is not None and "@" not in k[2]:
        met = met and frac >= CEILING
    met_all &= met
    steal = statistics.mean(r["steal_pct"] for t in by[k].values() for r in t.values())
    fs = f"{frac:.0f}% {level}" if frac is not None else "-"
    print(f"| {k[0]} | {k[1]} | {k[2]} | {stats(a)} | {stats(p)} | {stats(c)} | {show(ra)} | "
          f"{show(rp)} ({rounds}) | {target(k[0], k[2]):.2f}× | {'yes' if met else '**no**'} | {fs} | {steal:.0f}% |")
print()
print(f"Every target met: {'yes' if met_all else 'no'} (tg at depth 0 also needs {CEILING:.0f}% of its level).")
# Prefill at depth: cachefit's fall-off (pp512 @ d4096 over pp512) against llama.cpp's.
falls = []
for k in sorted(by):
    if not k[2].startswith("pp") or "@" not in k[2]:
        continue
    base = by.get((k[0], k[1], k[2].split(" @")[0]), {})
    def fall(tool):
        d, z = by[k].get(tool, {}), base.get(tool, {})
        common = sorted(set(d) & set(z))
        return statistics.median(d[i]["avg_ts"] / z[i]["avg_ts"] for i in common) if common else None
    falls.append((k, fall("cachefit"), fall("llama.cpp plain")))
if falls:
    print()
    print("Prefill at depth 4096 as a share of depth 0 (issue 23: cachefit's no lower than llama.cpp's):")
    print()
    print("| model | threads | cachefit | llama.cpp plain | met |")
    print("|---|---:|---:|---:|:-:|")
    for k, c, p in falls:
        ok = c is not None and p is not None and c >= p
        print(f"| {k[0]} | {k[1]} | {show(c)} | {show(p)} | {'yes' if ok else '**no**'} |")
print()
print("Peak RSS, tg128 at depth 1024 (context 1152), -t 2, one repetition:")
print()
print("| model | llama.cpp AMX MiB | llama.cpp plain MiB | cachefit MiB | cachefit / plain |")
print("|---|---:|---:|---:|---:|")
for line in open(sys.argv[2]):
    name, a, p, c = line.split()
    a, p, c = (int(x) / 1024 for x in (a, p, c))
    print(f"| {name} | {f'{a:.0f}' if a else 'n/a'} | {p:.0f} | {c:.0f} | {c / p:.2f} |")
if any("cachefit before" in t for t in by.values()):
    print()
    print("cachefit now against BASELINE, in the same rounds:")
    print()
    print("| model | threads | test | before t/s | now t/s | now / before | rounds |")
    print("|---|---:|---|---:|---:|---:|---|")
    for k in sorted(by):
        b, c = by[k].get("cachefit before", {}), by[k].get("cachefit", {})
        rounds = ", ".join(f"{c[i]['avg_ts'] / b[i]['avg_ts']:.2f}" for i in sorted(set(b) & set(c)))
        print(f"| {k[0]} | {k[1]} | {k[2]} | {stats(b)} | {stats(c)} | {show(ratio(b, c))} | {rounds} |")
PY
cat "$out/table.md"
