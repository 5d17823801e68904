#!/usr/bin/env python3
"""Speculative decoding with a draft model (`-md`, issue 23 §4): SmolLM2
alone against SmolLM2 with the pipeline-trained draft
(scripts/train-draft.sh), greedy, alternating in rounds (the machine is
shared and noisy: compare runs seconds apart), per thread count, task and
draft setting (--draft-max, --draft-p-min). Every speculative run must give
the plain run's text (the script fails otherwise).

    scripts/bench-draft.py [--draft target/draft-smollm2/draft.gguf] [--rounds 2] [-n 200]
                           [--threads 2,1] [--configs 4:0.5,8:0.5,6:0.3,6:0.6]

Tasks: input-grounded (summarise a held-out passage, in the chat format and
as plain text; copy code with edits, as scripts/bench-lookup.py does) and
free writing (a chat story; a plain story opening). Chat tasks stop at
SmolLM2's end of turn (at most -n tokens); plain ones generate -n tokens
(--ignore-eos). Also measures the draft model alone (its tok/s against
SmolLM2's is the cost of one guess). Prints markdown tables.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(user):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def held_out_passage():
    """A passage from the end of tinyshakespeare: the pipeline holds out its
    last 15% for validation, so the draft never trained on it."""
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("\n\n", int(len(text) * 0.93)) + 2
    end = text.rfind("\n\n", start, start + 1100)
    return text[start:end]


def tasks():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_lookup", os.path.join(ROOT, "scripts", "bench-lookup.py"))
    lookup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lookup)
    passage = held_out_passage()
    return [
        # (name, prompt, stops at end of turn)
        ("summarise (chat)", chat(f"Summarize the following passage in a few sentences:\n\n{passage}"), True),
        ("summarise (plain)", passage + "\n\nIn short,", False),
        ("copy code with edits (plain)", lookup.CODE, False),
        ("story (chat)", chat("Write a short story about a lighthouse keeper who finds a message in a bottle."), True),
        ("story (plain)", "Once upon a time, in a kingdom by the sea,", False),
    ]


def run(binary, model, prompt, n, threads, eog, extra=(), ctx=("-c", "2048")):
    args = [binary, "run", "-m", model, "-t", str(threads), "-n", str(n), *ctx, "--json",
            "--temp", "0", "-p", prompt] + ([] if eog else ["--ignore-eos"]) + list(extra)
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args[:10])} ... failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/cachefit"))
    ap.add_argument("--draft", default=os.path.join(ROOT, "target/draft-smollm2/draft.gguf"))
    ap.add_argument("--model", help="default: SmolLM2-135M-Instruct.Q4_1.gguf from scripts/fetch-models.sh")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--threads", default="2,1")
    ap.add_argument("--configs", default="4:0.5,8:0.5,6:0.3,6:0.6",
                    help="draft settings, MAX:P_MIN, comma-separated")
    ap.add_argument("--tasks", help="only tasks whose name contains one of these (comma-separated)")
    a = ap.parse_args()
    model = a.model
    if not model:
        folder = subprocess.run([os.path.join(ROOT, "scripts/fetch-models.sh")], capture_output=True,
                                text=True, check=True).stdout.strip()
        model = os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(a.draft):
        sys.exit(f"{a.draft} does not exist: run scripts/train-draft.sh first")
    configs = [(int(c.split(":")[0]), float(c.split(":")[1])) for c in a.configs.split(",")]
    todo = tasks()
    if a.tasks:
        keys = a.tasks.split(",")
        todo = [t for t in todo if any(k in t[0] for k in keys)]
    failed = False
    rows, alone = [], []
    for threads in [int(t) for t in a.threads.split(",")]:
        # The cost of a guess: each model alone, free writing, -n tokens.
        prompt = "Once upon a time, in a kingdom by the sea,"
        t_rates = [run(a.bin, model, prompt, a.n, threads, False)["gen_tok_s"] for _ in range(a.rounds)]
        d_rates = [run(a.bin, a.draft, prompt, a.n, threads, False, ctx=())["gen_tok_s"] for _ in range(a.rounds)]
        alone.append((threads, statistics.median(t_rates), statistics.median(d_rates)))
        for task, prompt, eog in todo:
            plain_rates = []
            spec = {c: {"rates": [], "ratios": [], "last": None} for c in configs}
            same = {c: True for c in configs}
            for _ in range(a.rounds):
                p = run(a.bin, model, prompt, a.n, threads, eog)
                plain_rates.append(p["gen_tok_s"])
                for c in configs:
                    s = run(a.bin, model, prompt, a.n, threads, eog,
                            ["-md", a.draft, "--draft-max", str(c[0]), "--draft-p-min", str(c[1])])
                    if s["text"] != p["text"]:
                        print(f"MISMATCH: -t {threads} / {task} / {c}: the text differs with -md",
                              file=sys.stderr)
                        failed, same[c] = True, False
                    spec[c]["rates"].append(s["gen_tok_s"])
                    spec[c]["ratios"].append(s["gen_tok_s"] / p["gen_tok_s"])
                    spec[c]["last"] = s
            for c in configs:
                s = spec[c]["last"]
                sp = s["speculation"]
                gen = s["generated_tokens"]
                passes = max(1, gen - sp["accepted"])
                acc = sp["accepted"] / sp["drafted"] if sp["drafted"] else 0.0
                ratio = statistics.median(spec[c]["ratios"])
                rows.append((threads, task, c, gen, statistics.median(plain_rates),
                             statistics.median(spec[c]["rates"]), ratio,
                             ", ".join(f"{r:.2f}" for r in spec[c]["ratios"]), sp["drafted"], acc,
                             gen / passes, sp["draft_model_passes"],
                             ("yes" if same[c] else "**NO**")
                             + f" ({hashlib.sha256(s['text'].encode()).hexdigest()[:8]})"))
                print(f"-t {threads} / {task} / max {c[0]} p-min {c[1]}: {ratio:.2f}x, "
                      f"accepted {acc:.0%}", file=sys.stderr)
    print(f"\n`scripts/bench-draft.py --rounds {a.rounds} -n {a.n}` (greedy; tok/s median of rounds; "
          f"draft: {os.path.basename(a.draft)})\n")
    print("| threads | SmolLM2 alone tok/s | draft alone tok/s | draft cost per token (of SmolLM2's) |")
    print("|---:|---:|---:|---:|")
    for threads, t, d in alone:
        print(f"| {threads} | {t:.1f} | {d:.1f} | {t / d:.1%} |")
    print()
    print("| threads | task | draft-max | p-min | tokens | tok/s plain | tok/s -md | speed-up (rounds) "
          "| guessed | accepted | tokens/pass | draft passes | same text |")
    print("|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|")
    for (th, task, c, gen, p, s, r, rs, drafted, acc, tpp, dpasses, h) in rows:
        print(f"| {th} | {task} | {c[0]} | {c[1]} | {gen} | {p:.1f} | {s:.1f} | **{r:.2f}×** ({rs}) | "
              f"{drafted} | {acc:.0%} | {tpp:.2f} | {dpasses} | {h} |")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
