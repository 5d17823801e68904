#!/usr/bin/env python3
"""cachefit replicas behind nginx (issue 22 part 4), everything on 127.0.0.1.

Run by scripts/deploy-test.sh (which installs nginx); standard library only:

    python3 tests/deploy/load.py --bin target/release/cachefit

1. Two replicas (`serve -t 1 --parallel 2`, the built-in model) and nginx
   with a configuration generated from deploy/nginx/cachefit.conf (ports
   substituted, paths in a temp folder).
2. Wave 1: 32 concurrent chat completions (half streamed; 16 carry an
   X-Conversation-Id of 4 conversations). Every one must succeed; each
   replica's /metrics must show some of them; every request of one
   conversation must have been served by one replica (nginx's access log,
   which names the replica per request id).
3. Wave 2: 32 longer ones; once the second replica is generating it is
   SIGKILLed. Every request must end, within its timeout, in one of:
     ok         200 and a whole answer (a stream: a finish_reason, then
                `data: [DONE]`);
     retryable  502/503/504 with a JSON error body (nginx's error page or
                cachefit's 503), a stream ending in an error event, or a
                stream whose chunked body was cut before its last chunk
                (the transport reports it: a client cannot mistake it for
                a finished answer, and sending the request again is safe);
   anything else (a hang, a clean end without [DONE], another status, a
   reset before any status) fails. Then 8 more requests must all succeed
   (nginx routes around the dead replica).
4. Throughput: the same load (non-streamed, ignore_eos) through nginx to 1
   replica (-t 1, then -t 2) and to 2 replicas (-t 1), in alternating rounds; a table of requests/s
   and completion tokens/s (median round).

Exit status 0 only if every check passed.
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONF = ROOT / "deploy" / "nginx" / "cachefit.conf"
TOPICS = ["the sea", "a mountain", "bread", "a violin", "winter", "a train", "bees", "the moon"]

failures = []


def check(ok, what, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} - {what}" + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(what)
    return ok


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, seconds, step=0.05):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return False


class Replica:
    """One `cachefit serve` on a free port, its stderr in a file."""

    def __init__(self, binary, work, name, parallel, threads=1):
        self.name = name
        self.log = work / f"{name}.log"
        self.proc = subprocess.Popen(
            [binary, "serve", "--port", "0", "-t", str(threads), "--parallel", str(parallel),
             "--log-format", "off"],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
        self.port = None

        def listening():
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log.read_text())
            if m:
                self.port = int(m.group(1))
            return self.port is not None or self.proc.poll() is not None
        wait_until(listening, 60)
        if self.port is None:
            raise RuntimeError(f"replica {name} did not start: {self.log.read_text()[-2000:]}")

    def metrics(self):
        """name{labels} -> value from /metrics."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def chat_200s(self):
        return self.metrics().get('cachefit_http_requests_total{route="/v1/chat/completions",code="200"}', 0)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Nginx:
    """nginx in the foreground with deploy/nginx/cachefit.conf, ports substituted."""

    def __init__(self, work, replicas):
        self.dir = pathlib.Path(tempfile.mkdtemp(dir=work, prefix="nginx-"))
        os.chmod(self.dir, 0o755)  # workers run as nobody when we are root
        self.port = free_port()
        self.access_log = self.dir / "access.log"
        site = CONF.read_text()
        server_line = re.compile(r"^(\s*)server 127\.0\.0\.1:8081( [^;]*)?;\n", re.M)
        if len(server_line.findall(site)) != 2 or site.count("127.0.0.1:8082") != 2:
            raise RuntimeError(f"{CONF}: expected both upstream blocks to list 127.0.0.1:8081 and :8082")
        site = server_line.sub(
            lambda m: "".join(f"{m.group(1)}server 127.0.0.1:{r.port}{m.group(2) or ''};\n" for r in replicas),
            site)
        site = re.sub(r"^\s*server 127\.0\.0\.1:8082[^;]*;\n", "", site, flags=re.M)
        for old, new in [("listen 127.0.0.1:8080;", f"listen 127.0.0.1:{self.port};"),
                         ("/var/log/nginx/cachefit.access.log", str(self.access_log))]:
            if old not in site:
                raise RuntimeError(f"{CONF}: expected `{old}`")
            site = site.replace(old, new)
        temp = "\n".join(f"    {k}_temp_path {self.dir}/{k};" for k in
                         ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"])
        conf = (f"daemon off;\nworker_processes 1;\npid {self.dir}/nginx.pid;\n"
                f"error_log {self.dir}/error.log warn;\nevents {{ worker_connections 1024; }}\n"
                f"http {{\n{temp}\n{site}\n}}\n")
        (self.dir / "nginx.conf").write_text(conf)
        self.proc = subprocess.Popen(["nginx", "-e", str(self.dir / "error.log"), "-p", str(self.dir),
                                      "-c", str(self.dir / "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

        def up():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2).read()
                return True
            except OSError:
                return self.proc.poll() is not None
        if not wait_until(up, 20, 0.1) or self.proc.poll() is not None:
            raise RuntimeError(f"nginx did not start: {self.error_log()}")

    def error_log(self):
        p = self.dir / "error.log"
        return p.read_text()[-2000:] if p.exists() else ""

    def log_entries(self):
        """request id -> access log entry (JSON per line)."""
        out = {}
        for line in self.access_log.read_text().splitlines():
            e = json.loads(line)
            if e["request_id"]:
                out[e["request_id"]] = e
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: finish logging
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# Set by main: logit_bias that keeps the built-in model off the newline
# that ends its turn, so `ignore_eos` requests generate all `max_tokens`.
LONG_BIAS = {}


def chat(port, req_id, *, stream, max_tokens, conv=None, timeout=60.0, ignore_eos=False):
    """One chat completion; returns (kind, detail, completion tokens)."""
    body = {
        "messages": [{"role": "user", "content": f"Write about {TOPICS[hash(req_id) % len(TOPICS)]}."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
        body["logit_bias"] = LONG_BIAS
    headers = {"Content-Type": "application/json", "X-Request-Id": req_id}
    if conv:
        headers["X-Conversation-Id"] = conv
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
            r = conn.getresponse()
        except socket.timeout:
            return "bad", "no response head within the timeout (hang)", 0
        except (OSError, http.client.HTTPException) as e:
            return "bad", f"no HTTP status from nginx: {e!r}", 0
        if r.status != 200:
            try:
                raw = r.read()
                err = json.loads(raw)["error"]["message"]
            except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as e:
                return "bad", f"{r.status} without a JSON error body ({e!r})", 0
            if r.status in (502, 503, 504):
                return "retryable", f"{r.status}: {err}", 0
            return "bad", f"{r.status}: {err}", 0
        if not stream:
            try:
                answer = json.loads(r.read())
                choice = answer["choices"][0]
                assert isinstance(choice["message"]["content"], str)
                assert choice["finish_reason"] in ("stop", "length")
                return "ok", "", answer["usage"]["completion_tokens"]
            except socket.timeout:
                return "bad", "200 but the body did not come within the timeout (hang)", 0
            except (OSError, http.client.HTTPException) as e:
                return "retryable", f"200 body cut: {e!r}", 0
            except (ValueError, KeyError, IndexError, TypeError, AssertionError) as e:
                return "bad", f"200 with an invalid body: {e!r}", 0
        if not r.chunked:
            return "bad", "stream not chunked: a cut could not be told from its end", 0
        finish, done, tokens, pending = None, False, 0, b""
        try:
            # read1, not line iteration: http.client's readline goes
            # through peek, which hides a truncated chunked body as a
            # clean end; read1 raises IncompleteRead.
            while True:
                block = r.read1(65536)
                if not block:
                    break
                *lines, pending = (pending + block).split(b"\n")
                for raw in lines:
                    line = raw.decode().strip()
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        done = True
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        return "retryable", f"stream error event: {chunk['error'].get('message')}", 0
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    for c in chunk.get("choices", []):
                        finish = c.get("finish_reason") or finish
        except socket.timeout:
            return "bad", "stream stalled past the timeout (hang)", 0
        except (OSError, http.client.HTTPException) as e:
            # http.client.IncompleteRead: the chunked body ended without its
            # last chunk; nginx does so when a replica dies mid-stream.
            if done:
                return "bad", f"stream cut after [DONE]: {e!r}", 0
            return "retryable", f"stream cut: {type(e).__name__}", 0
        except ValueError as e:
            return "bad", f"stream event is not JSON: {e!r}", 0
        if done and finish in ("stop", "length"):
            return "ok", "", tokens
        return "bad", f"stream ended cleanly without [DONE] and a finish_reason (finish={finish}, done={done})", 0
    finally:
        conn.close()


def wave(port, specs, pool, on_start=None):
    """Send every spec at once; [(spec, (kind, detail, tokens), seconds)]."""
    def one(spec):
        t0 = time.monotonic()
        return spec, chat(port, **spec), time.monotonic() - t0
    futures = [pool.submit(one, s) for s in specs]
    if on_start:
        on_start()
    return [f.result() for f in futures]


def wave1(nx, replicas, pool):
    print("# wave 1: 32 concurrent requests, 2 replicas")
    before = [r.chat_200s() for r in replicas]
    specs = [dict(req_id=f"w1-{i}", stream=i % 2 == 0, max_tokens=48,
                  conv=f"conv-{i % 4}" if i < 16 else None) for i in range(32)]
    results = wave(nx.port, specs, pool)
    bad = [(s["req_id"], d) for s, (k, d, _), _ in results if k != "ok"]
    check(not bad, "all 32 requests succeeded", str(bad[:5]))
    served = [r.chat_200s() - b for r, b in zip(replicas, before)]
    check(sum(served) == 32, "the replicas' /metrics count 32 chat completions in all", str(served))
    check(all(n > 0 for n in served), "both replicas served some", str(served))
    print(f"       served per replica (/metrics): {[int(n) for n in served]}")
    log = nx.log_entries()
    missing = [s["req_id"] for s in specs if s["req_id"] not in log]
    check(not missing, "every request is in nginx's access log", str(missing[:5]))
    by_conv = {}
    for s in specs:
        e = log.get(s["req_id"])
        if e and s["conv"]:
            by_conv.setdefault(s["conv"], set()).add(e["upstream"])
    check(all(len(u) == 1 for u in by_conv.values()),
          "each conversation's requests went to one replica", str(by_conv))
    print(f"       conversation -> replica: { {c: sorted(u) for c, u in sorted(by_conv.items())} }")


def wave2(nx, replicas, pool):
    print("# wave 2: 32 concurrent requests; one replica SIGKILLed mid-run")
    victim = replicas[1]
    base = victim.metrics().get("cachefit_generated_tokens_total", 0)
    specs = [dict(req_id=f"w2-{i}", stream=i % 2 == 0, max_tokens=900, ignore_eos=True,
                  conv=f"conv-{i % 4}" if i < 8 else None, timeout=60.0) for i in range(32)]
    killed_at = []

    def kill_when_busy():
        # Kill once the victim is generating: some of its requests are
        # running, the rest queued behind them.
        wait_until(lambda: victim.metrics().get("cachefit_generated_tokens_total", 0) > base + 50, 30, 0.02)
        victim.proc.send_signal(signal.SIGKILL)
        killed_at.append(time.monotonic())
    t0 = time.monotonic()
    results = wave(nx.port, specs, pool, on_start=kill_when_busy)
    victim.proc.wait()
    kinds = {}
    for s, (k, d, _), secs in results:
        kinds.setdefault(k, []).append((s["req_id"], d, round(secs, 1)))
    for k in ("ok", "retryable", "bad"):
        items = kinds.get(k, [])
        details = sorted({d for _, d, _ in items})
        print(f"       {k}: {len(items)}" + (f"  ({'; '.join(details)})" if details else ""))
    check(not kinds.get("bad"), "every request completed or got a clean retryable error",
          str(kinds.get("bad", [])[:5]))
    # A non-streamed answer is sent whole at the end, so nothing had
    # reached the client when the replica died: nginx must have retried it.
    plain_bad = [(s["req_id"], d) for s, (k, d, _), _ in results if not s["stream"] and k != "ok"]
    check(not plain_bad, "every non-streamed request completed (nginx retried what the dead replica held)",
          str(plain_bad[:5]))
    check(bool(killed_at), "the victim was killed while generating")
    if killed_at:
        print(f"       killed {killed_at[0] - t0:.2f} s into the wave; wave took {time.monotonic() - t0:.1f} s")
    log = nx.log_entries()
    victim_addr = f"127.0.0.1:{victim.port}"
    retried = [s["req_id"] for s in specs
               if s["req_id"] in log and "," in log[s["req_id"]]["upstream"]]
    touched = [s["req_id"] for s in specs
               if s["req_id"] in log and victim_addr in log[s["req_id"]]["upstream"]]
    print(f"       sent to the victim: {len(touched)}; retried on the other replica by nginx: {len(retried)}")
    check(len(retried) + len(kinds.get("retryable", [])) > 0,
          "the kill hit requests in flight (else this wave tested nothing)")
    after = [dict(req_id=f"w2-after-{i}", stream=i % 2 == 0, max_tokens=32,
                  conv=f"conv-{i % 4}" if i < 4 else None) for i in range(8)]
    results = wave(nx.port, after, pool)
    bad = [(s["req_id"], d) for s, (k, d, _), _ in results if k != "ok"]
    check(not bad, "8 requests after the kill all succeeded (the dead replica is routed around)", str(bad[:5]))


def throughput(binary, work, pool, rounds, requests, clients, max_tokens):
    print(f"# throughput: {requests} non-streamed requests of {max_tokens} tokens "
          f"(ignore_eos), {clients} at a time, through nginx; {rounds} rounds")
    # (replicas, threads each): one replica on one core, on both cores,
    # and two replicas of one core each.
    setups = [(1, 1), (1, 2), (2, 1)]
    rows = {s: [] for s in setups}
    for rnd in range(rounds):
        for n, threads in setups if rnd % 2 == 0 else setups[::-1]:
            replicas = [Replica(binary, work, f"tp{n}x{threads}-{rnd}-{i}", parallel=4, threads=threads)
                        for i in range(n)]
            nx = Nginx(work, replicas)
            try:
                chat(nx.port, "warm", stream=False, max_tokens=8)
                queue = list(range(requests))
                tokens, lat, errors = [], [], []

                def client():
                    while queue:
                        i = queue.pop()
                        t = time.monotonic()
                        kind, detail, toks = chat(nx.port, f"tp-{i}", stream=False,
                                                  max_tokens=max_tokens, ignore_eos=True)
                        if kind == "ok":
                            tokens.append(toks)
                            lat.append(time.monotonic() - t)
                        else:
                            errors.append(detail)
                t0 = time.monotonic()
                for f in [pool.submit(client) for _ in range(clients)]:
                    f.result()
                wall = time.monotonic() - t0
                check(not errors, f"throughput run with {n} replica(s) -t {threads} had no errors",
                      str(errors[:3]))
                rows[n, threads].append((len(lat) / wall, sum(tokens) / wall, statistics.median(lat) if lat else 0))
            finally:
                nx.stop()
                for r in replicas:
                    r.stop()
    print("\n| replicas | threads each | requests/s | completion tokens/s (median; rounds) | p50 latency (s) |")
    print("|---:|---:|---:|---:|---:|")
    med = {}
    for setup in setups:
        med[setup] = sorted(rows[setup], key=lambda r: r[1])[len(rows[setup]) // 2]
        rps, tps, p50 = med[setup]
        spread = ", ".join(f"{r[1]:,.0f}" for r in rows[setup])
        print(f"| {setup[0]} | {setup[1]} | {rps:.1f} | {tps:,.0f} ({spread}) | {p50:.2f} |")
    base = med[1, 1][1]
    print(f"\ncompletion tokens/s vs 1 replica -t 1: 1 replica -t 2 {med[1, 2][1] / base:.2f}x, "
          f"2 replicas -t 1 {med[2, 1][1] / base:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "cachefit"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()
    if not shutil.which("nginx"):
        sys.exit("load.py needs nginx on PATH (scripts/deploy-test.sh installs it)")
    binary = str(pathlib.Path(args.bin).resolve())
    work = pathlib.Path(tempfile.mkdtemp(prefix="cachefit-deploy-"))
    os.chmod(work, 0o755)
    replicas, nx = [], None
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=40)
    try:
        replicas = [Replica(binary, work, f"replica{i}", parallel=2) for i in range(2)]
        req = urllib.request.Request(f"http://127.0.0.1:{replicas[0].port}/tokenize",
                                     json.dumps({"content": "\n"}).encode(),
                                     {"Content-Type": "application/json"})
        newline = json.loads(urllib.request.urlopen(req, timeout=10).read())["tokens"]
        LONG_BIAS.update({str(t): -100 for t in newline})
        nx = Nginx(work, replicas)
        print(f"# nginx on 127.0.0.1:{nx.port}; replicas on {[r.port for r in replicas]}")
        wave1(nx, replicas, pool)
        wave2(nx, replicas, pool)
    except RuntimeError as e:
        check(False, "setup", str(e))
    finally:
        if nx:
            nx.stop()
        for r in replicas:
            r.stop()
    if not args.skip_throughput and not failures:
        try:
            throughput(binary, work, pool, args.rounds, args.requests, args.clients, args.max_tokens)
        except RuntimeError as e:
            check(False, "throughput setup", str(e))
    pool.shutdown()
    if failures:
        print(f"\n{len(failures)} check(s) failed; logs kept in {work}")
        if nx:
            print(nx.error_log())
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)
    print("\nall deployment checks passed")


if __name__ == "__main__":
    main()
