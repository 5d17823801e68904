#!/usr/bin/env python3
"""Needle-in-a-haystack evaluation of cachefit's long memory.

For a history length, builds a seeded haystack (scripts/memory/haystack.py:
varied sentences, needles "The secret code for the THING is DIGITS." at
depths beyond the hot window, plus distractor needles), ingests it with
`cachefit memory ingest`, and asks each needle's question through `cachefit
run --memory` with a plain chat prompt, greedy. Exact match: the reply holds
the 7 digits. Reported next to two bounds on the same needles:

  in-window  the needle inside the hot window: a memory holding only the
             ~1,800 tokens around it (all in context; what the model can
             do at all);
  random     recall random blocks instead of searching (the baseline a
             search must beat);

and the retrieval hit rate (the needle's digits are in the recalled text).

    python3 scripts/memory/needles.py --tokens 32000 --needles 5
    python3 scripts/memory/needles.py --tokens 8000,32000,128000 --needles 10 --bounds
    python3 scripts/memory/needles.py --tokens 1000000 --needles 10   # ~1 h of ingest

Prints a Markdown table; `--json FILE` writes the rows. Exit status 1 when
`--min-found N` is given and fewer needles of any length were answered.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import haystack as H  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Tokens per haystack word for SmolLM2's tokenizer (measured: 24,000 words
# gave 32,570 tokens).
TOKENS_PER_WORD = 1.357
HOT = 2048


def chatml(question):
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd[:4])} ...\n{r.stderr[-2000:]}")
    return r


def ingest(bin_, model, mem, text_path, threads):
    t = time.time()
    r = run([bin_, "memory", "ingest", mem, "-m", model, "-f", text_path, "--json"]
            + (["-t", str(threads)] if threads else []))
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_seconds"] = time.time() - t
    return out


def ask(bin_, model, mem, question, extra=()):
    r = run([bin_, "run", "-m", model, "--memory", mem, "--temp", "0", "-n", "24",
             "-p", chatml(question), "--json", *extra])
    return json.loads(r.stdout)


def evaluate(a, n_tokens, tmp):
    words = int(n_tokens / TOKENS_PER_WORD)
    # Needles at evenly spread depths before the hot window (and after the
    # first block, the sinks).
    last = max(0.05, 1.0 - (HOT + 400) / n_tokens)
    depths = [0.02 + (last - 0.02) * (i + 0.5) / a.needles for i in range(a.needles)]
    text, needles = H.make(a.seed, words, depths, n_distractors=max(2, a.needles // 2))
    hay = os.path.join(tmp, f"hay-{n_tokens}.txt")
    with open(hay, "w") as f:
        f.write(text)
    mem = os.path.join(tmp, f"hay-{n_tokens}-seed{a.seed}.mem")
    meta = mem + ".ingest.json"
    if a.workdir and os.path.exists(meta):
        # Reuse an earlier ingest of the same haystack (same seed, length).
        with open(meta) as f:
            ing = json.load(f)
    else:
        for p in (mem, mem + ".idx"):
            if os.path.exists(p):
                os.remove(p)
        ing = ingest(a.bin, a.model, mem, hay, a.threads)
        if a.workdir:
            with open(meta, "w") as f:
                json.dump(ing, f)
    row = {"tokens": ing["tokens"], "needles": len(needles), "found": 0, "hit": 0,
           "ingest_tokens_per_second": ing["tokens_per_second"],
           "bytes_per_token": ing["bytes_per_token"], "recall_ms": [], "misses": [],
           # For crates/engine/examples/memory_proxy.rs (its NEEDLES.json).
           "needle_list": [{"thing": n["thing"], "code": n["code"]} for n in needles]}
    if a.bounds:
        row.update({"in_window": 0, "random": 0})
    for n in needles:
        q = H.question(n["thing"])
        v = ask(a.bin, a.model, mem, q, a.extra.split())
        ok = n["code"] in v["text"]
        row["found"] += ok
        row["hit"] += n["code"] in (v["memory"] or {}).get("recalled_text", "")
        row["recall_ms"].append((v["memory"] or {}).get("recall_ms", 0.0))
        if not ok:
            row["misses"].append({"thing": n["thing"], "code": n["code"], "said": v["text"]})
        if a.bounds:
            r = ask(a.bin, a.model, mem, q,
                    a.extra.split() + ["--memory-random-recall", str(a.seed)])
            row["random"] += n["code"] in r["text"]
            # The needle's surroundings alone: ~1,800 tokens, all in context.
            at = text.find(f"The secret code for the {n['thing']}")
            lo = max(0, at - int(1400 * 4.2))
            hi = min(len(text), at + int(300 * 4.2))
            part = os.path.join(tmp, "window.txt")
            with open(part, "w") as f:
                f.write(text[lo:hi])
            wmem = os.path.join(tmp, "window.mem")
            for p in (wmem, wmem + ".idx"):
                if os.path.exists(p):
                    os.remove(p)
            ingest(a.bin, a.model, wmem, part, a.threads)
            w = ask(a.bin, a.model, wmem, q)
            row["in_window"] += n["code"] in w["text"]
    if not a.workdir:
        for p in (mem, mem + ".idx", hay):
            if os.path.exists(p):
                os.remove(p)
    ms = sorted(row["recall_ms"])
    row["recall_ms_median"] = ms[len(ms) // 2] if ms else 0.0
    del row["recall_ms"]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/cachefit"))
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/cachefit/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tokens", default="32000", help="history lengths, comma-separated")
    ap.add_argument("--needles", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--bounds", action="store_true", help="also the in-window and random bounds")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--workdir", help="keep haystacks and memory files here and reuse an "
                    "earlier ingest of the same length and seed (to try retrieval settings)")
    ap.add_argument("--extra", default="", help="more flags for `cachefit run`, space-separated")
    ap.add_argument("--min-found", type=int, help="exit 1 if fewer needles are answered")
    a = ap.parse_args()
    if "CACHEFIT_MODELS" in os.environ and not os.path.exists(a.model):
        a.model = os.path.join(os.environ["CACHEFIT_MODELS"], os.path.basename(a.model))
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = a.workdir or scratch
        if a.workdir:
            os.makedirs(tmp, exist_ok=True)
        for n in [int(x) for x in a.tokens.split(",")]:
            rows.append(evaluate(a, n, tmp))
            r = rows[-1]
            print(f"{r['tokens']} tokens: {r['found']}/{r['needles']} answered, "
                  f"{r['hit']}/{r['needles']} recalled", file=sys.stderr, flush=True)
    bounds = a.bounds
    print("| history (tokens) | needles | answered with memory | needle recalled |"
          + (" in-window bound | random blocks |" if bounds else "")
          + " recall (ms, median) | ingest (tokens/s) | bytes/token |")
    print("|---:|---:|---:|---:|" + ("---:|---:|" if bounds else "") + "---:|---:|---:|")
    for r in rows:
        n = r["needles"]
        pct = lambda k: f"{r[k]}/{n} ({100 * r[k] / n:.0f}%)"  # noqa: E731
        print(f"| {r['tokens']:,} | {n} | {pct('found')} | {pct('hit')} |"
              + (f" {pct('in_window')} | {pct('random')} |" if bounds else "")
              + f" {r['recall_ms_median']:.0f} | {r['ingest_tokens_per_second']:.0f} |"
              f" {r['bytes_per_token']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.min_found is not None and any(r["found"] < a.min_found for r in rows):
        for r in rows:
            for m in r["misses"]:
                print(f"missed at {r['tokens']}: {m}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
