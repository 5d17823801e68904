#!/usr/bin/env python3
"""Distilled training text for a SmolLM2 draft model: what SmolLM2 itself
says (issue 23 §4).

    scripts/distill-smollm2.py --dir target/draft-smollm2 --out distilled.jsonl \
        [--model FILE] [--bin target/release/cachefit] [--count 1200] [-n 192]
        [--threads 2] [--slots 8] [--max-seconds S] [--exact-ids]

Prompts (seeded, so the same every run) are built from the `data` stage's
training text in DIR (corpus.train.txt; never the validation text, which the
benchmark uses) and from fixed lists below; a third of them are plain text
(no chat markers, as `cachefit run -p` is benchmarked), the rest SmolLM2's
chat format (its default system line, a user turn, the assistant turn open):

- summarise / rewrite in plain English / repeat exactly / continue a passage
  of the corpus (input-grounded: the answer reuses the prompt's words);
- explain a topic, write a short story, write a Python function;
- plain text: a passage then "In short," / "Summary:", a story opening, the
  start of a Python function.

Each prompt is generated once, greedily for 3 in 4 (the benchmark decodes
greedily, and a draft must guess the greedy token), else at temperature 0.7
with a seed fixed per prompt; at most -n tokens, stopping at SmolLM2's end
of turn. By default one `cachefit serve` with --slots slots generates them
(requests in flight share each pass over the weights, ~5x the tokens per
CPU-second of one `run`) and its text is recorded; with --exact-ids, one
`cachefit run -t 1 --json --logprobs 0 --lookup` per prompt records
SmolLM2's own token ids. --max-seconds bounds the time: no generation starts
after it (the file then holds the prompts done, in order). Output: JSON
lines {"prompt", "text" or "ids", "stop", "kind", "temp"} in prompt order,
for `cachefit-train pack --distilled`. Prints the amount generated and the
time taken on stderr.
"""

import argparse
import concurrent.futures
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

TOPICS = [
    "photosynthesis", "the water cycle", "how a bicycle works", "why the sky is blue",
    "compound interest", "how vaccines work", "the French Revolution", "black holes",
    "how a refrigerator keeps food cold", "the difference between weather and climate",
    "what a prime number is", "how bees make honey", "the causes of earthquakes",
    "what inflation is", "how the internet sends data", "why we sleep", "how rainbows form",
    "the role of the heart", "what gravity is", "how plants grow from seeds",
    "the printing press", "how a computer stores numbers", "recycling", "the moon's phases",
    "how muscles get stronger", "what a democracy is", "volcanoes", "the immune system",
    "electric circuits", "why leaves change colour in autumn", "the Roman Empire",
    "how a camera works", "ocean tides", "the solar system", "how to make bread rise",
    "what a recursive function is", "sorting algorithms", "the greenhouse effect",
    "how birds migrate", "the stock market",
]

STORY_SUBJECTS = [
    "a dragon who is afraid of the dark", "a robot learning to paint", "two friends lost in a forest",
    "a girl who finds a map in her attic", "a fisherman and a talking fish", "a city where it never stops raining",
    "a cat who becomes mayor", "an old clock that runs backwards", "a boy who can speak to birds",
    "a baker with a secret recipe", "a knight who refuses to fight", "a ship caught in a storm",
    "a garden that grows overnight", "a detective solving a missing necklace", "a village under the snow",
    "the last tree on a planet", "a musician who loses her voice", "a fox and a crow",
    "a train that travels between stars", "a shy giant", "a library that is alive",
    "a queen who trades places with a servant", "a boy and his grandfather's violin", "a mouse in a castle",
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a string", "finds the largest element of a list", "removes duplicates from a list",
    "checks whether a string is a palindrome", "computes the factorial of a number",
    "merges two dictionaries", "returns the average of a list of numbers", "sorts a list with bubble sort",
    "converts Celsius to Fahrenheit", "counts how often each word occurs in a text",
    "flattens a nested list", "returns the greatest common divisor of two numbers",
    "reads a file and returns its lines", "checks whether two strings are anagrams",
    "finds the second largest number in a list", "capitalizes the first letter of each word",
    "returns all even numbers from a list", "implements binary search", "transposes a matrix",
    "computes the sum of the digits of a number", "validates an email address with a regular expression",
]

STORY_OPENINGS = [
    "The old lighthouse had been dark for years, until one night", "It was the coldest winter anyone could remember, and",
    "When the letter arrived, Maria knew at once that", "Deep in the forest there lived a",
    "On the morning of the fair, the whole village", "Nobody believed Tom when he said",
    "The ship had been at sea for forty days when", "Long ago, before the mountains had names,",
    "The first thing I noticed about the new house was", "Every evening at six o'clock, the baker",
]

CODE_STARTS = [
    'def is_prime(n):\n    """Return True if n is a prime number."""\n',
    'def word_count(text):\n    """Count how often each word occurs in text."""\n',
    'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n',
    'def read_csv(path):\n    """Read a CSV file into a list of dictionaries."""\n',
    'import math\n\n\ndef distance(p, q):\n    """Euclidean distance between two points."""\n',
    'def fizzbuzz(n):\n    """Print the numbers 1 to n, with Fizz, Buzz and FizzBuzz."""\n',
]


def chat(user):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def passages(text, rng, count):
    """`count` passages of 300–1200 characters: runs of whole paragraphs."""
    paras = [p for p in text.split("\n\n") if p.strip()]
    out = []
    while len(out) < count:
        i = rng.randrange(len(paras))
        want = rng.randint(300, 1200)
        chunk = paras[i]
        while len(chunk) < want and i + 1 < len(paras):
            i += 1
            chunk += "\n\n" + paras[i]
        if len(chunk) <= 1600:
            out.append(chunk.strip())
    return out


def prompts(corpus, count, seed):
    rng = random.Random(seed)
    texts = passages(corpus, rng, count)
    items = []
    for k in range(count):
        p = texts[k]
        kind = rng.choice(["summarise", "summarise", "rewrite", "repeat", "continue", "explain",
                           "story", "code", "plain-summary", "plain-summary", "plain-story", "plain-code"])
        if kind == "summarise":
            q = rng.choice(["Summarize the following passage in a few sentences:",
                            "Summarise this text:", "What is this passage about? Answer briefly.",
                            "Give a short summary of the following text."])
            prompt = chat(f"{q}\n\n{p}")
        elif kind == "rewrite":
            prompt = chat(f"Rewrite the following text in plain modern English:\n\n{p}")
        elif kind == "repeat":
            prompt = chat(f"Repeat the following text exactly, word for word:\n\n{p}")
        elif kind == "continue":
            prompt = chat(f"Continue this text for a few more sentences:\n\n{p}")
        elif kind == "explain":
            prompt = chat(rng.choice(["Explain {} in simple terms.", "What is {}?",
                                      "Write a short paragraph about {}."]).format(rng.choice(TOPICS)))
        elif kind == "story":
            prompt = chat(f"Write a short story about {rng.choice(STORY_SUBJECTS)}.")
        elif kind == "code":
            prompt = chat(f"Write a Python function that {rng.choice(CODE_TASKS)}.")
        elif kind == "plain-summary":
            prompt = p + rng.choice(["\n\nIn short,", "\n\nSummary:", "\n\nIn other words,",
                                     "\n\nThe main point of this passage is that"])
        elif kind == "plain-story":
            prompt = rng.choice(STORY_OPENINGS)
        else:
            prompt = rng.choice(CODE_STARTS)
        temp = 0.0 if rng.random() < 0.75 else 0.7
        items.append({"prompt": prompt, "kind": kind, "temp": temp, "seed": 1000 + k})
    return items


class Server:
    """`cachefit serve` with `slots` slots: the requests in flight are
    decoded together, one pass over the weights for all of them (about 5×
    the tokens per CPU-second of one `run` here)."""

    def __init__(self, binary, model, threads, slots):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [binary, "serve", "-m", model, "-t", str(threads), "--parallel", str(slots), "-c", "2048",
             "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(600):
            if self.proc.poll() is not None:
                raise RuntimeError(f"cachefit serve exited:\n{self.proc.stderr.read()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("cachefit serve did not answer /health in 60 s")

    def generate(self, item, n, deadline):
        if deadline and time.time() > deadline:
            return None
        body = {"prompt": item["prompt"], "max_tokens": n, "temperature": item["temp"],
                "seed": item["seed"]}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions",
                                     json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            choice = json.load(r)["choices"][0]
        # "stop": an end-of-generation token (no stop strings are given).
        stop = "eog" if choice["finish_reason"] == "stop" else choice["finish_reason"]
        return {"prompt": item["prompt"], "text": choice["text"], "stop": stop,
                "kind": item["kind"], "temp": item["temp"]}

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def generate(binary, model, item, n, deadline):
    if deadline and time.time() > deadline:
        return None
    # --lookup: the same greedy text, sooner where it copies the prompt.
    args = [binary, "run", "-m", model, "-t", "1", "-n", str(n), "-c", "2048", "--json",
            "--logprobs", "0", "--temp", str(item["temp"]), "-s", str(item["seed"]), "--lookup",
            "-p", item["prompt"]]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"cachefit run failed on a {item['kind']} prompt:\n{out.stderr[-2000:]}")
    r = json.loads(out.stdout)
    return {"prompt": item["prompt"], "ids": [e["id"] for e in r["logprobs"]], "stop": r["stop"],
            "kind": item["kind"], "temp": item["temp"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="pipeline folder with corpus.train.txt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", help="default: SmolLM2-135M-Instruct.Q4_1.gguf from scripts/fetch-models.sh")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/cachefit"))
    ap.add_argument("--count", type=int, default=1200)
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="start no generation after this many seconds (0: no limit); the file then "
                         "holds the prompts done, in order")
    ap.add_argument("--threads", type=int, default=2, help="threads of the server")
    ap.add_argument("--slots", type=int, default=8, help="requests decoded together")
    ap.add_argument("--exact-ids", action="store_true",
                    help="one `cachefit run -t 1 --logprobs 0` per prompt, --threads at a time, "
                         "recording SmolLM2's own ids (slower) instead of the server's text")
    ap.add_argument("-n", type=int, default=192)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    model = a.model
    if not model:
        folder = subprocess.run([os.path.join(ROOT, "scripts/fetch-models.sh")], capture_output=True,
                                text=True, check=True).stdout.strip()
        model = os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
    with open(os.path.join(a.dir, "corpus.train.txt"), encoding="utf-8") as f:
        corpus = f.read()
    items = prompts(corpus, a.count, a.seed)
    start = time.time()
    deadline = start + a.max_seconds if a.max_seconds > 0 else None
    results = [None] * len(items)
    server = None if a.exact_ids else Server(a.bin, model, a.threads, a.slots)
    try:
        workers = a.threads if a.exact_ids else a.slots
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            if server:
                futures = {pool.submit(server.generate, it, a.n, deadline): i
                           for i, it in enumerate(items)}
            else:
                futures = {pool.submit(generate, a.bin, model, it, a.n, deadline): i
                           for i, it in enumerate(items)}
            for done, fut in enumerate(concurrent.futures.as_completed(futures), 1):
                results[futures[fut]] = fut.result()
                if done % 50 == 0:
                    print(f"{done}/{len(items)} generations, {time.time() - start:.0f} s",
                          file=sys.stderr)
    finally:
        if server:
            server.close()
    skipped = sum(r is None for r in results)
    if skipped:
        print(f"--max-seconds {a.max_seconds:g}: {skipped} prompts not generated", file=sys.stderr)
    results = [r for r in results if r is not None]
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, a.out)
    size = sum(len(r["ids"]) if "ids" in r else len(r["text"]) for r in results)
    unit = "generated tokens" if a.exact_ids else "bytes of generated text"
    print(f"{len(results)} generations, {size} {unit} in {time.time() - start:.0f} s "
          f"-> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
