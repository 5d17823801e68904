#!/usr/bin/env python3
"""Load test for `cachefit serve`: N concurrent streaming clients on loopback.

For each concurrency level (default 1, 4, 16) the clients send
max(--min-requests, --requests x clients) streaming /v1/completions
requests in all, each client back to back; reported:
requests/s, generated tokens/s (all clients together), time to first
token p50/p99 and request latency p99. Bounded: a fixed number of requests
per level and --time-limit seconds per level, loopback only. --rounds N
runs the levels N times, alternating, and reports each level's median
round (shared machines are noisy).

    python3 scripts/load.py --model ~/.cache/cachefit/models/SmolLM2-135M-Instruct.Q4_1.gguf

starts target/release/cachefit serve on a free port (with --parallel at
the highest level) and stops it afterwards; --url uses a running server.
Only the Python standard library is needed.

--client rust sends the same requests from a Rust client
(crates/server/examples/load_client.rs, built by cargo on first use): at
tens of thousands of tokens per second this Python client (one process,
one GIL) takes the CPU the server needs on a small machine.
"""

import argparse
import http.client
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}

TOPICS = [
    "the sea", "a mountain", "bread", "a violin", "winter", "a train", "bees", "the moon",
    "a library", "rain", "a garden", "coffee", "a lighthouse", "snow", "a river", "chess",
]


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(host, port, key, prompt, max_tokens, deadline):
    """Stream one completion: (ttft s, latency s, completion tokens) or None."""
    body = json.dumps(
        {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    timeout = max(1.0, deadline - time.monotonic())
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.monotonic()
    ttft, tokens = None, 0
    try:
        conn.request("POST", "/v1/completions", body, headers)
        r = conn.getresponse()
        if r.status != 200:
            r.read()
            return None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            # Once the first token is seen only usage and errors matter:
            # skipping the JSON parse of every other event keeps this
            # client from being the bottleneck at ~10k tokens/s.
            if ttft is not None and '"usage"' not in data and '"error"' not in data:
                if time.monotonic() > deadline:
                    return None
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                return None
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if ttft is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                ttft = time.monotonic() - t0
            if time.monotonic() > deadline:
                return None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    return (ttft if ttft is not None else time.monotonic() - t0, time.monotonic() - t0, tokens)


def run_level(host, port, key, clients, total, max_tokens, time_limit):
    deadline = time.monotonic() + time_limit
    # Client c sends requests c, c + clients, c + 2 clients, ... < total.
    per_client = [len(range(c, total, clients)) for c in range(clients)]
    results, failures = [], [0]
    lock = threading.Lock()

    def client(c):
        for i in range(per_client[c]):
            if time.monotonic() > deadline:
                return
            topic = TOPICS[(c + i * clients) % len(TOPICS)]
            prompt = f"Here is a short story about {topic}. Once upon a time"
            r = one_request(host, port, key, prompt, max_tokens, deadline)
            with lock:
                if r is None:
                    failures[0] += 1
                else:
                    results.append(r)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    ttfts = [r[0] for r in results]
    lats = [r[1] for r in results]
    toks = sum(r[2] for r in results)
    return {
        "clients": clients,
        "requests": len(results),
        "failed": failures[0],
        "seconds": wall,
        "req_s": len(results) / wall,
        "tok_s": toks / wall,
        "tokens": toks,
        "ttft_p50_ms": 1000 * percentile(ttfts, 50),
        "ttft_p99_ms": 1000 * percentile(ttfts, 99),
        "latency_p99_ms": 1000 * percentile(lats, 99),
    }


def run_level_rust(client_bin, host, port, key, clients, total, max_tokens, time_limit):
    """run_level, with the requests sent by the Rust client."""
    cmd = [client_bin, f"{host}:{port}", str(clients), str(total), str(max_tokens), str(time_limit)]
    if key:
        cmd.append(key)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def build_rust_client():
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "-p", "cachefit-server", "--example", "load_client"],
        cwd=ROOT, check=True,
    )
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return str(target / "release" / "examples" / "load_client")


def start_server(args, parallel):
    cmd = [
        args.bin, "serve", "-m", args.model, "--host", "127.0.0.1", "--port", "0",
        "--parallel", str(parallel), "-c", str(args.ctx),
    ]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = []
    deadline = time.monotonic() + 60
    for line in proc.stderr:
        log.append(line)
        if "listening on http://" in line:
            addr = line.split("listening on http://", 1)[1].strip()
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, addr
        if time.monotonic() > deadline:
            break
    proc.kill()
    sys.exit("the server did not start:\n" + "".join(log))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF model (to start a server)")
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "cachefit"))
    ap.add_argument("--url", help="use a running server, e.g. http://127.0.0.1:8080 (loopback only)")
    ap.add_argument("--api-key")
    ap.add_argument("--levels", default="1,4,16", help="concurrent clients per level, comma-separated")
    ap.add_argument("--requests", type=int, default=4, help="requests per client per level")
    ap.add_argument("--min-requests", type=int, default=16, help="requests per level at least")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--time-limit", type=float, default=120, help="seconds per level at most")
    ap.add_argument("--ctx", type=int, default=512, help="-c per slot for a started server")
    ap.add_argument("-t", "--threads", type=int)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the levels this many times, alternating; report each level's median-tok/s round")
    ap.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    ap.add_argument("--client", choices=["python", "rust"], default="python",
                    help="who sends the requests: this script, or the Rust client (less CPU per token)")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if min(levels) < 1 or max(levels) > 64 or args.requests > 100 or args.min_requests > 1000:
        sys.exit("levels must be 1..64 clients, --requests at most 100, --min-requests at most 1000")
    if not 1 <= args.rounds <= 9:
        sys.exit("--rounds must be 1..9")

    client_bin = build_rust_client() if args.client == "rust" else None
    proc = None
    if args.url:
        u = urllib.parse.urlparse(args.url)
        if u.hostname not in LOOPBACK:
            sys.exit(f"{u.hostname}: this load test only targets loopback addresses")
        host, port = u.hostname, u.port or 80
    else:
        if not args.model:
            sys.exit("give --model (to start a server) or --url")
        proc, addr = start_server(args, max(levels))
        host, port = addr.rsplit(":", 1)
        port = int(port)
    try:
        # One warm-up request: page the weights in.
        one_request(host, port, args.api_key, "Hello", 4, time.monotonic() + 60)
        # On a shared machine a neighbour can slow one level down: with
        # --rounds the levels alternate and each reports its median round.
        rounds = [[] for _ in levels]
        for _ in range(args.rounds):
            for i, c in enumerate(levels):
                level = (host, port, args.api_key, c, max(args.min_requests, args.requests * c),
                         args.max_tokens, args.time_limit)
                if client_bin:
                    rounds[i].append(run_level_rust(client_bin, *level))
                else:
                    rounds[i].append(run_level(*level))
        rows = []
        for rs in rounds:
            rs = sorted(rs, key=lambda r: r["tok_s"])
            row = dict(rs[len(rs) // 2])
            row["rounds_tok_s"] = [round(r["tok_s"], 1) for r in rs]
            rows.append(row)
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"max_tokens {args.max_tokens}, temperature 0, streaming, {args.ctx} ctx per slot, {args.client} client", end="")
    print(f", median of {args.rounds} alternating rounds\n" if args.rounds > 1 else "\n")
    print("| clients | requests | req/s | gen tok/s | TTFT p50 ms | TTFT p99 ms | latency p99 ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        failed = f" ({r['failed']} failed)" if r["failed"] else ""
        print(
            f"| {r['clients']} | {r['requests']}{failed} | {r['req_s']:.2f} | {r['tok_s']:.1f} | "
            f"{r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['latency_p99_ms']:.0f} |"
        )
    if args.rounds > 1:
        print()
        for r in rows:
            print(f"{r['clients']} clients, gen tok/s per round: {r['rounds_tok_s']}")
    base = rows[0]["tok_s"] if rows and rows[0]["clients"] == 1 else None
    if base:
        for r in rows[1:]:
            print(f"\n{r['clients']} clients: {r['tok_s'] / base:.2f}x the generation tok/s of 1", end="")
        print()


if __name__ == "__main__":
    main()
