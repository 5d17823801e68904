#!/usr/bin/env python3
"""Speculative decoding by prompt lookup (`--lookup`): speed-up, acceptance
and tokens per pass per task, with and without it, alternating in rounds
(the machine is shared and noisy: compare runs seconds apart).

Tasks: copying code with edits (the output repeats the prompt), summarising
a passage (it reuses phrases), and free writing greedy and sampled (it does
not copy: lookup must not cost more than 5% there). Every pair must give
the same text: the check that speculation changes nothing but speed.

    scripts/bench-lookup.py [--bin target/release/cachefit] [--rounds 3] [-n 200] [-t 1]

Prints a markdown table for docs/PERFORMANCE.md.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CODE = '''def merge_sorted(a, b):
    """Merge two sorted lists into one sorted list."""
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    out.extend(a[i:])
    out.extend(b[j:])
    return out


def binary_search(xs, target):
    """Return the index of target in the sorted list xs, or -1."""
    lo, hi = 0, len(xs) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if xs[mid] == target:
            return mid
        if xs[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1

# The same two functions again, with type hints added:

def merge_sorted(a: list, b: list) -> list:
'''


def passage():
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("First Citizen:\nBefore we proceed")
    return text[start:start + 1500]


TASKS = [
    # (name, prompt, sampling flags)
    ("copy code with edits", CODE, ["--temp", "0"]),
    ("summarise a passage",
     passage() + "\n\nIn short, in the citizens' own words: the citizens say that", ["--temp", "0"]),
    ("free writing, greedy", "Once upon a time, in a kingdom by the sea,", ["--temp", "0"]),
    ("free writing, sampled", "Once upon a time, in a kingdom by the sea,", ["--temp", "0.8", "-s", "11"]),
]


def run(binary, model, prompt, flags, n, threads):
    args = [binary, "run", "-m", model, "-t", str(threads), "-n", str(n), "--ignore-eos",
            "-c", "2048", "--json", "-p", prompt] + flags
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args[:8])} ... failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/cachefit"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("-t", type=int, default=1)
    ap.add_argument("--models", default="SmolLM2-135M-Instruct.Q4_1.gguf,Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf")
    a = ap.parse_args()
    models_dir = subprocess.run([os.path.join(ROOT, "scripts/fetch-models.sh")],
                                capture_output=True, text=True, check=True).stdout.strip()
    rows = []
    failed = False
    for name in a.models.split(","):
        model = os.path.join(models_dir, name)
        for task, prompt, sampling in TASKS:
            ratios, plain_rates, spec_rates = [], [], []
            spec = None
            same = True
            for _ in range(a.rounds):
                p = run(a.bin, model, prompt, sampling, a.n, a.t)
                s = run(a.bin, model, prompt, sampling + ["--lookup"], a.n, a.t)
                if p["text"] != s["text"]:
                    print(f"MISMATCH: {name} / {task}: the text differs with --lookup", file=sys.stderr)
                    failed, same = True, False
                plain_rates.append(p["gen_tok_s"])
                spec_rates.append(s["gen_tok_s"])
                ratios.append(s["gen_tok_s"] / p["gen_tok_s"])
                spec = s["speculation"]
            gen = s["generated_tokens"]
            passes = max(1, gen - spec["accepted"])
            acc = spec["accepted"] / spec["drafted"] if spec["drafted"] else 0.0
            rows.append((name.split(".")[0].split("-Instruct")[0], task, statistics.median(plain_rates),
                         statistics.median(spec_rates), statistics.median(ratios),
                         ", ".join(f"{r:.2f}" for r in ratios), spec["drafted"], acc, gen / passes,
                         ("yes" if same else "**NO**") + f" ({hashlib.sha256(s['text'].encode()).hexdigest()[:8]})"))
            print(f"{rows[-1][0]} / {task}: {statistics.median(ratios):.2f}x", file=sys.stderr)
    print(f"\n`scripts/bench-lookup.py --rounds {a.rounds} -n {a.n} -t {a.t}` (greedy unless said; "
          f"draft-max 8; tok/s median of rounds)\n")
    print("| model | task | tok/s plain | tok/s --lookup | speed-up (rounds) | guessed | accepted | tokens/pass | same text |")
    print("|---|---|---:|---:|---|---:|---:|---:|---|")
    for m, task, p, s, r, rs, drafted, acc, tpp, h in rows:
        print(f"| {m} | {task} | {p:.1f} | {s:.1f} | **{r:.2f}×** ({rs}) | {drafted} | {acc:.0%} | {tpp:.2f} | {h} |")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
