#!/usr/bin/env bash
# The fault suite of issue 19: what an attacker or an operations accident
# does to a running cachefit, and the outcome each must have. Run by CI
# (scripts/test.sh) against the release binary; a few minutes.
#
#   scripts/faults.sh [--bin target/release/cachefit]
#
# Outcomes, not timings: every wait is generous (a shared 2-vCPU machine)
# and checks that something happened within it, never how fast. Nothing
# is retried: none of these outcomes depends on a race.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=target/release/cachefit
[ "${1:-}" = "--bin" ] && bin=$2
[ -x "$bin" ] || { echo "no binary at $bin (cargo build --release -p cachefit)" >&2; exit 1; }
bin=$(realpath "$bin")
for tool in python3 truncate timeout mkfifo; do
    if ! command -v $tool >/dev/null; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq coreutils python3) >/dev/null 2>&1 || true
    fi
    command -v $tool >/dev/null || { echo "faults.sh needs $tool" >&2; exit 1; }
done
client="python3 $PWD/scripts/faults/client.py"
models="${CACHEFIT_MODELS:-$HOME/.cache/cachefit/models}"
smollm="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
builtin="$PWD/models/cachefit-ternary.gguf"
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
passed=0
failed=0
ok() { echo "ok   - $1"; passed=$((passed + 1)); }
bad() { echo "FAIL - $1"; shift; for l in "$@"; do echo "       $l"; done; failed=$((failed + 1)); }
# A long generation needs a model slow enough to still be running when the
# file changes: SmolLM2 (scripts/fetch-models.sh), else the built-in one.
[ -f "$smollm" ] && long_model=$smollm || long_model=$builtin

# wait_for FILE PATTERN SECONDS: until FILE contains PATTERN.
wait_for() {
    local end=$((SECONDS + $3))
    until grep -q -- "$2" "$1" 2>/dev/null; do
        [ $SECONDS -ge $end ] && return 1
        sleep 0.2
    done
}

# start_server LOG ARGS...: runs `cachefit serve --port 0 ARGS` in the
# background; sets $server_pid and $addr once it listens.
start_server() {
    local log=$1
    shift
    "$bin" serve --port 0 -t 1 "$@" > /dev/null 2> "$log" &
    server_pid=$!
    pids+=("$server_pid")
    if ! wait_for "$log" "listening on http://" 120; then
        addr=""
        return 1
    fi
    addr=$(sed -n 's/.*listening on http:\/\/\([^ ]*\).*/\1/p' "$log" | head -1)
}

# exit_status PID SECONDS: sets $st to the exit status of a background
# job of this shell, or 999 if it has not exited in time (it is killed).
exit_status() {
    local end=$((SECONDS + $2))
    while kill -0 "$1" 2>/dev/null; do
        if [ $SECONDS -ge $end ]; then
            kill -9 "$1" 2>/dev/null
            wait "$1" 2>/dev/null
            st=999
            return
        fi
        sleep 0.2
    done
    wait "$1"
    st=$?
}

echo "fault suite: $bin, long-running model $(basename "$long_model")"

# 1. The model file truncated while `run` has it mapped (also --mlock).
for lock in "" "--mlock"; do
    name="run: model truncated while mapped${lock:+ ($lock)}"
    cp "$long_model" "$work/m.gguf"
    rm -f "$work/run.out"
    "$bin" run -m "$work/m.gguf" $lock -t 1 -c 2048 -n 100000 --ignore-eos \
        -p "1, 2, 3, 4, 5, 6, 7, 8," > "$work/run.out" 2> "$work/run.err" &
    pid=$!
    pids+=("$pid")
    end=$((SECONDS + 120))
    until [ -s "$work/run.out" ] || [ $SECONDS -ge $end ] || ! kill -0 $pid 2>/dev/null; do sleep 0.2; done
    truncate -s 4096 "$work/m.gguf"
    exit_status $pid 60
    if [ "$st" = 1 ] && grep -q "changed on disk while in use" "$work/run.err"; then
        ok "$name"
    elif grep -q "mlock of .* refused" "$work/run.err"; then
        ok "$name (skipped: mlock refused here: $(tail -1 "$work/run.err"))"
    else
        bad "$name" "exit status $st (135 = SIGBUS)" "$(tail -3 "$work/run.err")"
    fi
done

# 2. The model file truncated under `serve` with a stream in flight: the
#    stream gets an error event, the server exits non-zero and says why.
cp "$long_model" "$work/s.gguf"
if start_server "$work/serve-trunc.log" -m "$work/s.gguf" -c 2048; then
    $client stream-until-error "$addr" "$work/started" 60 > "$work/stream.out" 2>&1 &
    cpid=$!
    end=$((SECONDS + 120))
    until [ -e "$work/started" ] || [ $SECONDS -ge $end ] || ! kill -0 $cpid 2>/dev/null; do sleep 0.1; done
    truncate -s 4096 "$work/s.gguf"
    exit_status $cpid 90; cst=$st
    exit_status $server_pid 60
    if [ "$cst" = 0 ] && [ "$st" != 0 ] && [ "$st" != 999 ] && [ "$st" != 135 ] \
        && grep -q "changed on disk while in use" "$work/serve-trunc.log"; then
        ok "serve: model truncated mid-stream (stream error event, exit $st)"
    else
        bad "serve: model truncated mid-stream" "client: $cst $(cat "$work/stream.out")" "server exit: $st" "$(tail -3 "$work/serve-trunc.log")"
    fi
else
    bad "serve: model truncated mid-stream" "server did not start: $(tail -3 "$work/serve-trunc.log")"
fi

# 3. Slow and half-open clients, oversized declared bodies, Expect, Host,
#    half-close: the built-in model with short timeouts.
if start_server "$work/serve.log" --timeout-header 1 --timeout-idle 2 --timeout-body 2 --max-body 4096; then
    for t in "slow-clients $addr 30" "declared-too-large $addr" "half-close $addr" "health $addr"; do
        if out=$($client $t 2>&1); then ok "serve: ${t%% *}"; else bad "serve: ${t%% *}" "$out"; fi
    done
    kill -TERM $server_pid
    exit_status $server_pid 60
    [ "$st" = 0 ] && ok "serve: SIGTERM when idle exits 0" || bad "serve: SIGTERM when idle" "exit $st"
else
    bad "serve: slow clients" "server did not start: $(tail -3 "$work/serve.log")"
fi

# 4. File descriptors exhausted: `ulimit -n 128`, 200 idle sockets, and
#    /health is still answered.
(
    ulimit -n 128
    exec "$bin" serve --port 0 -t 1 > /dev/null 2> "$work/serve-fd.log"
) &
server_pid=$!
pids+=("$server_pid")
if wait_for "$work/serve-fd.log" "listening on http://" 120; then
    addr=$(sed -n 's/.*listening on http:\/\/\([^ ]*\).*/\1/p' "$work/serve-fd.log" | head -1)
    if out=$($client fd-exhaustion "$addr" 200 2>&1); then
        ok "serve: ulimit -n 128 and 200 idle sockets, /health answered"
    else
        bad "serve: FD exhaustion" "$out" "$(tail -3 "$work/serve-fd.log")"
    fi
else
    bad "serve: FD exhaustion" "server did not start: $(tail -3 "$work/serve-fd.log")"
fi
{ kill -9 $server_pid; wait $server_pid; } 2>/dev/null

# 5. A second SIGTERM exits at once, a request still running.
if start_server "$work/serve-term.log" -m "$long_model" --shutdown-timeout 600; then
    $client long-request "$addr" "$work/long.status" &
    cpid=$!
    pids+=("$cpid")
    $client wait-busy "$addr" 120 || true
    kill -TERM $server_pid
    wait_for "$work/serve-term.log" "SIGTERM: no new connections" 30
    kill -TERM $server_pid
    exit_status $server_pid 30
    if [ "$st" = 143 ] && grep -q "second SIGTERM" "$work/serve-term.log"; then
        ok "serve: a second SIGTERM exits at once (143)"
    else
        bad "serve: second SIGTERM" "exit $st" "$(tail -3 "$work/serve-term.log")"
    fi
    { kill -9 $cpid; wait $cpid; } 2>/dev/null
else
    bad "serve: second SIGTERM" "server did not start"
fi

# 6. Signals during quantize leave no .partial file (nor an output).
if [ -f "$smollm" ]; then
    for sig in INT TERM HUP; do
        rm -f "$work"/q.gguf "$work"/.q.gguf.*
        "$bin" quantize "$smollm" "$work/q.gguf" Q4_K_M --allow-requantize -t 1 > /dev/null 2> "$work/q.err" &
        pid=$!
        pids+=("$pid")
        # The output is written to a hidden .q.gguf.*.partial, then renamed.
        end=$((SECONDS + 60))
        until compgen -G "$work/.q.gguf.*.partial" >/dev/null || [ $SECONDS -ge $end ] || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
        started=$(compgen -G "$work/.q.gguf.*.partial" >/dev/null && echo yes || echo no)
        kill -$sig $pid 2>/dev/null
        exit_status $pid 60
        left=$(ls -A "$work" | grep -E '^\.?q\.gguf' | tr '\n' ' ')
        if [ "$started" = yes ] && [ "$st" != 0 ] && [ "$st" != 999 ] && [ -z "$left" ]; then
            ok "quantize: SIG$sig mid-write leaves nothing behind (exit $st)"
        else
            bad "quantize: SIG$sig" "started writing: $started, exit $st, files left: $left" "$(tail -2 "$work/q.err")"
        fi
    done
    # The input truncated while quantize reads it.
    rm -f "$work"/q.gguf "$work"/.q.gguf.*
    cp "$smollm" "$work/in.gguf"
    "$bin" quantize "$work/in.gguf" "$work/q.gguf" Q4_K_M --allow-requantize -t 1 > /dev/null 2> "$work/q.err" &
    pid=$!
    pids+=("$pid")
    end=$((SECONDS + 60))
    until compgen -G "$work/.q.gguf.*.partial" >/dev/null || [ $SECONDS -ge $end ] || ! kill -0 $pid 2>/dev/null; do sleep 0.05; done
    truncate -s 4096 "$work/in.gguf"
    exit_status $pid 60
    left=$(ls -A "$work" | grep -E '^\.?q\.gguf' | tr '\n' ' ')
    if [ "$st" = 1 ] && [ -z "$left" ] && grep -q "changed on disk while in use" "$work/q.err"; then
        ok "quantize: input truncated mid-read: clear error, nothing left behind"
    else
        bad "quantize: input truncated mid-read" "exit $st, files left: $left" "$(tail -2 "$work/q.err")"
    fi
else
    echo "note - quantize signals skipped: no SmolLM2 at $smollm"
fi

# 7. `memory ingest` (built-in model) stopped by signals, two writers on
#    one file, a full disk, a file made for another model.
python3 - "$work/book.txt" "$work/note.txt" <<'PY'
import random, sys
r = random.Random(18)
who = ["the king", "a weary sailor", "the old miller", "my cousin", "the council", "the widow", "our captain", "a herald"]
did = ["remembers", "carried", "spoke of", "buried", "sold", "counted", "found", "lost", "mended"]
what = ["a silver key", "the long winter", "seven ships", "an old debt", "the harvest", "a lantern", "the bridge toll"]
when = ["before the frost came", "under a pale moon", "as the fog lifted", "while the city slept", "at the market"]
def text(n):
    out = []
    while sum(map(len, out)) < n:
        out.append(f"{r.choice(who).capitalize()} {r.choice(did)} {r.choice(what)} {r.choice(when)}, {r.randrange(10000)} times.")
        out.append("\n\n" if r.random() < 0.15 else " ")
    return "".join(out)
open(sys.argv[1], "w").write(text(300_000))
open(sys.argv[2], "w").write(text(2_000))
PY
# start_ingest MEM LOG ARGS...: `memory ingest MEM --json ARGS` in the
# background (stdout to LOG.json); sets $pid. wait_appended MEM: until MEM
# has records past its header and those already there (signal handlers
# are in place by then).
start_ingest() {
    local mem=$1 log=$2
    shift 2
    "$bin" memory ingest "$mem" --json "$@" > "$log.json" 2> "$log" &
    pid=$!
    pids+=("$pid")
}
size_of() { stat -c %s "$1" 2>/dev/null || echo 0; }
wait_appended() {
    local from end=$((SECONDS + 60))
    from=$(size_of "$1")
    [ "$from" -lt 8192 ] && from=8192
    until [ "$(size_of "$1")" -gt $((from + 4096)) ]; do
        { [ $SECONDS -ge $end ] || ! kill -0 $pid 2>/dev/null; } && return 1
        sleep 0.02
    done
}
# verify_reopens NAME MEM: the file verifies clean and a writer reopens it
# (a following ingest appends).
verify_reopens() {
    local out
    if ! out=$("$bin" memory verify "$2" 2>&1); then
        bad "$1" "memory verify after it: $out"
        return 1
    fi
    if ! out=$("$bin" memory ingest "$2" -f "$work/note.txt" 2>&1 && "$bin" memory verify "$2" 2>&1); then
        bad "$1" "a following ingest: $out"
        return 1
    fi
}
for sig in INT TERM HUP KILL; do
    name="memory ingest: SIG$sig mid-ingest"
    mem="$work/sig-$sig.mem"
    start_ingest "$mem" "$work/ingest-$sig.err" -f "$work/book.txt"
    if ! wait_appended "$mem"; then
        bad "$name" "ingest did not start appending" "$(tail -2 "$work/ingest-$sig.err")"
        continue
    fi
    kill -$sig $pid
    # (2>/dev/null: bash's own "Killed" notice.)
    exit_status $pid 60 2>/dev/null
    case $sig in INT) want=130 ;; TERM) want=143 ;; HUP) want=129 ;; KILL) want=137 ;; esac
    if [ "$st" != "$want" ]; then
        bad "$name" "exit $st, expected $want" "$(tail -2 "$work/ingest-$sig.err")"
        continue
    fi
    if [ $sig != KILL ] && ! { grep -q "stopped by SIG$sig" "$work/ingest-$sig.err" \
        && grep -q '"interrupted":true' "$work/ingest-$sig.err.json"; }; then
        bad "$name" "no report of the stop" "$(tail -2 "$work/ingest-$sig.err")"
        continue
    fi
    verify_reopens "$name" "$mem" && ok "$name: exit $st, the file verifies and takes more"
done

# Two writers: the second is refused by the lock; the first goes on and
# its file verifies with everything it reported.
name="memory ingest: a second writer on one file"
mem="$work/two.mem"
start_ingest "$mem" "$work/first.err" -f "$work/book.txt"
first=$pid
if wait_appended "$mem"; then
    "$bin" memory ingest "$mem" -f "$work/note.txt" > /dev/null 2> "$work/second.err"
    second=$?
    kill -INT $first
    exit_status $first 60
    added=$(sed -n 's/.*"added_tokens":\([0-9]*\).*/\1/p' "$work/first.err.json")
    tokens=$("$bin" memory inspect "$mem" --json 2>/dev/null | sed -n 's/^ *"tokens": \([0-9]*\).*/\1/p')
    if [ $second = 1 ] && grep -q "another writer holds the lock" "$work/second.err" \
        && [ "$st" = 130 ] && [ -n "$added" ] && [ "$added" = "$tokens" ] \
        && "$bin" memory verify "$mem" > /dev/null 2>&1; then
        ok "$name: refused ($(grep -o 'another writer holds the lock' "$work/second.err")), the first unharmed ($added tokens)"
    else
        bad "$name" "second: exit $second $(tail -1 "$work/second.err")" "first: exit $st, added $added, file holds $tokens"
    fi
else
    bad "$name" "the first ingest did not start appending" "$(tail -2 "$work/first.err")"
fi

# A full disk: a small tmpfs when this shell may mount one; else a file
# size limit (EFBIG, the same path in the store as ENOSPC).
name="memory ingest: disk full"
full="$work/full"
mkdir -p "$full"
if mount -t tmpfs -o size=320k tmpfs "$full" 2>/dev/null; then
    how="a 320 KiB tmpfs"
    "$bin" memory ingest "$full/m.mem" -f "$work/book.txt" > /dev/null 2> "$work/full.err"
    st=$?
else
    how="ulimit -f 320"
    (
        trap '' XFSZ
        ulimit -f 320
        exec "$bin" memory ingest "$full/m.mem" -f "$work/book.txt"
    ) > /dev/null 2> "$work/full.err"
    st=$?
fi
if [ $st = 1 ] && grep -q "writing failed .*cut back to its last commit .* still opens" "$work/full.err" \
    && out=$("$bin" memory verify "$full/m.mem" 2>&1) && "$bin" memory inspect "$full/m.mem" > /dev/null 2>&1; then
    ok "$name ($how): $(grep -o 'No space left on device\|File too large' "$work/full.err" | head -1), cut back to its last commit;$(echo "$out" | head -1 | cut -d: -f2) verify clean"
else
    bad "$name ($how)" "exit $st" "$(tail -2 "$work/full.err")" "verify: ${out:-}"
fi
mountpoint -q "$full" 2>/dev/null && umount "$full"

# A memory file made by one model, opened with another.
if [ -f "$smollm" ]; then
    name="memory ingest: a file made for another model"
    mem="$work/sig-INT.mem"
    theirs=$("$bin" memory inspect "$mem" --json | sed -n 's/^ *"fingerprint": "\([0-9a-f]\{16\}\).*/\1/p')
    before=$(size_of "$mem")
    "$bin" memory ingest "$mem" -m "$smollm" -f "$work/note.txt" > /dev/null 2> "$work/other.err"
    st=$?
    if [ $st = 1 ] && grep -q "made with another model (fingerprint $theirs); this model's is [0-9a-f]\{16\}" "$work/other.err" \
        && [ "$(size_of "$mem")" = "$before" ]; then
        ok "$name: $(grep -o 'made with another model[^.]*' "$work/other.err")"
    else
        bad "$name" "exit $st (file fingerprint $theirs)" "$(tail -2 "$work/other.err")"
    fi
else
    echo "note - memory ingest with another model skipped: no SmolLM2 at $smollm"
fi

# 8. /dev/zero, FIFOs and devices as inputs, under a memory limit: a clear
#    error, never an OOM kill or a hang.
mkfifo "$work/fifo"
check_input() {
    local name=$1 want=$2
    shift 2
    (
        ulimit -v 4000000
        exec timeout 60 "$@"
    ) < /dev/zero > /dev/null 2> "$work/in.err"
    local st=$?
    if [ $st = 1 ] && grep -q -- "$want" "$work/in.err"; then
        ok "$name"
    else
        bad "$name" "exit $st (137 = killed, 124 = hung)" "$(tail -2 "$work/in.err")"
    fi
}
check_input "run -f /dev/zero" "longer than" "$bin" run -f /dev/zero -n 1
check_input "perplexity -f /dev/zero --max-prompt-bytes 1000000" "longer than" "$bin" perplexity -m "$builtin" -f /dev/zero --max-prompt-bytes 1000000
check_input "chat < /dev/zero" "longer than" "$bin" chat -n 1
check_input "run -m /dev/zero" "not a regular file" "$bin" run -m /dev/zero -p x
check_input "run -m FIFO (no writer)" "not a regular file" "$bin" run -m "$work/fifo" -p x
check_input "inspect FIFO" "not a regular file" "$bin" inspect "$work/fifo"
check_input "memory inspect FIFO" "not a regular file" "$bin" memory inspect "$work/fifo"
check_input "memory verify FIFO" "not a regular file" "$bin" memory verify "$work/fifo"
check_input "memory ingest into a FIFO" "not a regular file" "$bin" memory ingest "$work/fifo" -f "$work/note.txt"
check_input "memory ingest -f /dev/zero" "longer than" "$bin" memory ingest "$work/zero.mem" -f /dev/zero
[ -e "$work/zero.mem" ] && bad "memory ingest -f /dev/zero" "it made a memory file"
check_input "serve --api-key-file /dev/zero" "longer than" "$bin" serve --port 0 --api-key-file /dev/zero
check_input "serve --api-key ''" "API key is empty" "$bin" serve --port 0 --api-key ""

# 9. -t 1000: capped with a warning, and the run produces its tokens.
timeout 120 "$bin" run -t 1000 -n 8 "ROMEO:" > "$work/t.out" 2> "$work/t.err"
st=$?
if [ $st = 0 ] && [ -s "$work/t.out" ] && grep -q "warning: -t 1000 is more than" "$work/t.err"; then
    ok "run -t 1000: capped with a warning"
else
    bad "run -t 1000" "exit $st" "$(tail -2 "$work/t.err")"
fi

echo "faults: $passed passed, $failed failed"
[ $failed = 0 ]
