"""Hostile HTTP clients for scripts/faults.sh: each subcommand plays one
misbehaving client against a running `cachefit serve` and exits 0 when the
server's outcome is the right one (printing what it saw otherwise).

Outcomes, not timings: every bound here is generous (a loaded 2-vCPU
machine), and what is checked is that an answer or a close happened at all
within it, never how fast.
"""

import json
import socket
import sys
import time


# Greedy decoding goes on counting: a generation that lasts.
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"


def connect(addr, timeout=30.0):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    return s


def read_until_closed(s, limit):
    """(bytes, closed) after reading until EOF/reset or `limit` seconds."""
    deadline = time.monotonic() + limit
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, False
        s.settimeout(min(left, 1.0))
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return data, True
        if not chunk:
            return data, True
        data += chunk


def status(data):
    try:
        return int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def fail(msg):
    print(msg)
    sys.exit(1)


def get(addr, path, timeout=30.0, headers=""):
    s = connect(addr, timeout)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n".encode())
    data, _ = read_until_closed(s, timeout)
    return data


def cmd_health(addr):
    data = get(addr, "/health")
    if status(data) != 200:
        fail(f"/health: {data[:300]!r}")


def cmd_wait_busy(addr, bound):
    """Until /health says a slot is busy."""
    deadline = time.monotonic() + float(bound)
    while time.monotonic() < deadline:
        data = get(addr, "/health")
        if b'"slots_busy":1' in data:
            return
        time.sleep(0.2)
    fail("no slot became busy")


def cmd_slow_clients(addr, bound):
    """Idle, half-head, half-body and kept-alive connections are closed
    within `bound` seconds (the server runs with 1-2 s timeouts)."""
    bound = float(bound)
    idle = connect(addr)
    head = connect(addr)
    head.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
    body = connect(addr)
    body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"pro")
    kept = connect(addr)
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    for name, s, want in [("idle", idle, None), ("half head", head, None),
                          ("half body", body, 408), ("kept alive", kept, 200)]:
        data, closed = read_until_closed(s, bound)
        if not closed:
            fail(f"{name}: still open after {bound} s")
        if status(data) != want:
            fail(f"{name}: expected status {want}, got {data[:200]!r}")


def cmd_declared_too_large(addr):
    """100 MB declared, 7 bytes sent: an immediate 413 (no 100 Continue)."""
    for expect in ["", "Expect: 100-continue\r\n"]:
        s = connect(addr)
        s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: 100000000\r\n{expect}\r\n" + '{"a": 1').encode())
        data, _ = read_until_closed(s, 30)
        if status(data) != 413 or b"100 Continue" in data:
            fail(f"declared 100 MB ({expect.strip() or 'no Expect'}): {data[:300]!r}")
    s = connect(addr)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\nConnection: close\r\n\r\n")
    data, _ = read_until_closed(s, 30)
    if status(data) != 417:
        fail(f"Expect: teapot: {data[:300]!r}")
    s = connect(addr)
    s.sendall(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    data, _ = read_until_closed(s, 30)
    if status(data) != 400:
        fail(f"no Host: {data[:300]!r}")


def cmd_half_close(addr):
    """The client shuts its sending side after the request: the answer
    still comes."""
    body = json.dumps({"prompt": "ROMEO:", "max_tokens": 4, "temperature": 0})
    s = connect(addr)
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    s.shutdown(socket.SHUT_WR)
    data, _ = read_until_closed(s, 120)
    if status(data) != 200 or b'"choices"' not in data:
        fail(f"half-close: {data[:300]!r}")


def cmd_fd_exhaustion(addr, n):
    """Hold `n` idle sockets open (more than the server's open-file limit
    allows), then /health must still be answered: evicting an idle
    connection, not hanging in the accept queue."""
    held = []
    for _ in range(int(n)):
        try:
            held.append(connect(addr, 10))
        except OSError:
            break
    time.sleep(1.0)
    for attempt in range(5):
        try:
            data = get(addr, "/health", 20)
        except OSError as e:
            data = repr(e).encode()
        if status(data) == 200:
            return
        time.sleep(1.0)
    fail(f"/health with {len(held)} idle sockets open: {data[:300]!r}")


def cmd_stream_until_error(addr, started_file, bound):
    """Start a long streamed completion, touch `started_file` once text
    flows, then read until the stream ends: it must end with an error
    event (the model file changed), not hang and not end normally."""
    body = json.dumps({"prompt": COUNTING, "max_tokens": 100000,
                       "temperature": 0, "stream": True})
    s = connect(addr, 120)
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    data = b""
    deadline = time.monotonic() + 120
    while data.count(b"data: ") < 3:
        if time.monotonic() > deadline:
            fail(f"the stream never started: {data[:300]!r}")
        s.settimeout(5)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            fail(f"closed before streaming: {data[:300]!r}")
        data += chunk
    open(started_file, "w").close()
    rest, closed = read_until_closed(s, float(bound))
    data += rest
    if not closed:
        fail(f"the stream did not end within {bound} s after the file changed")
    if b"changed on disk" not in data:
        fail(f"the stream ended without the error: ...{data[-400:]!r}")
    if b"[DONE]" in data:
        fail("the stream ended normally")


def cmd_long_request(addr, out_file):
    """A non-streamed request that runs long; writes its status (or the
    error) to `out_file` when it ends."""
    body = json.dumps({"prompt": COUNTING, "max_tokens": 100000, "temperature": 0})
    try:
        s = connect(addr, 300)
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        data, _ = read_until_closed(s, 300)
        result = str(status(data))
    except OSError as e:
        result = repr(e)
    with open(out_file, "w") as f:
        f.write(result)


def main():
    name, *args = sys.argv[1:]
    globals()["cmd_" + name.replace("-", "_")](*args)


if __name__ == "__main__":
    main()
