#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this).
# Sets up what it needs on a fresh machine: Python packages for the
# cross-checks, the test models, the aarch64 target for the NEON check.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
step() { printf '\n=== %s (%ds) ===\n' "$*" $((SECONDS - start)); }

step "set-up"
python3 -m pip install --quiet --disable-pip-version-check "gguf==0.19.0" "numpy>=1.26" 2>&1 | grep -v "Running pip as the 'root'" || true
rustup component add rustfmt clippy >/dev/null 2>&1 || true
models="$(scripts/fetch-models.sh)"
export CACHEFIT_MODELS="$models"
# Debian packages the user-path tests drive: tmux (the chat REPL's keys,
# in cargo test), chromium (the chat page), nginx (replicas behind a load
# balancer).
missing=""
for pkg in tmux:tmux chromium:chromium nginx:nginx; do
    command -v "${pkg%%:*}" >/dev/null || missing="$missing ${pkg##*:}"
done
if [ -n "$missing" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) >/dev/null 2>&1 \
        || echo "*** NOTE: could not install$missing; their tests will say so ***"
fi
# The larger training corpus (two Debian packages; the ternary model's
# gates rebuild its validation split from it). apt needs its package
# lists for `apt-get download`: fetched once if the first try fails.
corpus="$(scripts/fetch-corpus.sh 2>/dev/null)" || {
    apt-get update -qq >/dev/null 2>&1 || true
    corpus="$(scripts/fetch-corpus.sh)"
}
export CACHEFIT_CORPUS="$corpus"
# Tests that need a model fail instead of skipping.
export CACHEFIT_REQUIRE_MODELS=1

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "cargo test"
mkdir -p target
set +e
cargo test --workspace --quiet > target/test.log 2>&1
status=$?
set -e
grep -E "^test result:" target/test.log || true
if [ $status -ne 0 ]; then
    tail -100 target/test.log
    echo "cargo test failed" >&2
    exit 1
fi

step "every kernel set forced through CACHEFIT_KERNELS"
cargo build --release --quiet -p cachefit
for k in scalar avx2 avx512 bogus; do
    CACHEFIT_KERNELS=$k cargo test --quiet -p cachefit-kernels --test dispatch_env 2>&1 | grep -E "^test result|panicked" | sed "s/^/[$k] /"
    test "${PIPESTATUS[0]}" -eq 0
done

step "perplexity against llama-perplexity (release build, both SmolLM2 files)"
cargo test --release --quiet -p cachefit --test perplexity -- --ignored --nocapture 2>&1 | grep -E "^test result|PPL|SKIPPING|panicked"
test "${PIPESTATUS[0]}" -eq 0

step "memory ingest killed at random moments: 60 SIGKILLs, every file a prefix of a clean ingest (release build, ~30 s)"
cargo test --release --quiet -p cachefit --test memory_crash -- --ignored --nocapture 2>&1 | grep -E "^test result|^references|kills in|^ +[0-9]+  |panicked|^kill|^SIG"
test "${PIPESTATUS[0]}" -eq 0

step "cross-check against the gguf Python package"
python3 scripts/check_gguf_py.py --bin target/release/cachefit --model "$models/SmolLM2-135M-Instruct.Q4_1.gguf"

step "aarch64: NEON kernels tested under qemu"
# Cross linker and qemu from Debian; the target from rustup.
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross) >/dev/null 2>&1 || true
fi
if rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1; then
    if command -v qemu-aarch64 >/dev/null && command -v aarch64-linux-gnu-gcc >/dev/null; then
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" \
            cargo test --quiet --target aarch64-unknown-linux-gnu -p cachefit-kernels --lib 2>&1 | grep -E "^test result|FAILED|panicked"
        test "${PIPESTATUS[0]}" -eq 0
    else
        echo "*** NOTE: qemu-user / aarch64 cross gcc not installable; NEON code only type-checked ***"
        cargo check --quiet -p cachefit-kernels --target aarch64-unknown-linux-gnu
    fi
else
    echo "*** NOTE: could not install the aarch64 target; NEON code not checked ***"
fi

step "fuzz targets (nightly + cargo-fuzz): GGUF header 45 s; HTTP requests, chat templates, tokenizers, memory-file reader 20 s each"
# Seed corpora are committed under fuzz/seeds/TARGET; what the fuzzer adds
# goes to fuzz/corpus/TARGET (not committed). A crash fails the step with
# the input saved under fuzz/artifacts/TARGET/. Short runs (CI's whole job
# stays under 45 minutes); a longer one: cd fuzz && cargo +nightly fuzz run NAME.
if cargo +nightly --version >/dev/null 2>&1; then
    command -v cargo-fuzz >/dev/null 2>&1 || cargo install --quiet --locked cargo-fuzz
    (cd fuzz && cargo +nightly fuzz build --release) > target/fuzz-build.log 2>&1 \
        || { tail -40 target/fuzz-build.log; echo "building the fuzz targets failed" >&2; exit 1; }
    for target in gguf_header:45 http_request:20 chat_template:20 tokenize:20 memory_file:20; do
        name=${target%%:*}
        secs=${target##*:}
        mkdir -p fuzz/corpus/$name
        # -timeout: one input taking 20 s is a hang, not a slow machine.
        if (cd fuzz && cargo +nightly fuzz run --release $name corpus/$name seeds/$name -- \
                -max_total_time=$secs -rss_limit_mb=2048 -timeout=20) > target/fuzz-$name.log 2>&1; then
            echo "[$name] $(grep -E "^Done" target/fuzz-$name.log)"
        else
            grep -vE "^#[0-9]" target/fuzz-$name.log | tail -60
            echo "fuzzing $name found a failure (input saved under fuzz/artifacts/$name/)" >&2
            exit 1
        fi
    done
else
    echo "*** NOTE: no nightly toolchain; fuzzing skipped ***"
fi

step "AddressSanitizer over the kernel and GGUF tests (nightly)"
if cargo +nightly --version >/dev/null 2>&1; then
    RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=target/asan \
        cargo +nightly test --quiet --target x86_64-unknown-linux-gnu -p cachefit-gguf -p cachefit-kernels --lib --tests 2>&1 | grep -E "^test result|ERROR|FAILED" 
    test "${PIPESTATUS[0]}" -eq 0
else
    echo "*** NOTE: no nightly toolchain; AddressSanitizer run skipped ***"
fi

step "valgrind memcheck: the built-in model through cachefit run (AVX2 and scalar kernels)"
if ! command -v valgrind >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind) >/dev/null 2>&1 || true
fi
if command -v valgrind >/dev/null; then
    # valgrind's CPU has no AVX-512, so dispatch picks AVX2; then scalar.
    for k in auto scalar; do
        env $([ $k = auto ] || echo CACHEFIT_KERNELS=$k) valgrind -q --error-exitcode=3 --leak-check=no \
            target/release/cachefit run "ROMEO:" -n 24 --temp 0 -t 2 > /dev/null 2> target/valgrind.log \
            || { cat target/valgrind.log; echo "valgrind found errors ($k kernels)" >&2; exit 1; }
        echo "[$k] no errors"
    done
else
    echo "*** NOTE: valgrind not installable; memcheck skipped ***"
fi

step "gates of the cache-fit models: runtime vs the trainer's forward pass, int8 and ternary (~4 min)"
# Through the workspace build of the cargo test step, so nothing is built
# again (`-p cachefit-train --test gates` resolves other features and took
# two more minutes of compiling); the name filters pick the two tests.
set +e
cargo test --workspace --quiet -- --ignored --exact shipped_model_passes_the_gates_and_matches_docs_gates_json \
    ternary_model_passes_the_gates_and_matches_docs_gates_ternary_json > target/gates.log 2>&1
status=$?
set -e
grep -E "panicked|docs/gates" target/gates.log || true
ran=$(awk '/^test result:/ { p += $4; f += $6 } END { print p + f }' target/gates.log)
echo "gates: $ran test(s) run"
if [ $status -ne 0 ] || [ "$ran" -ne 2 ]; then
    tail -60 target/gates.log
    echo "the gates test failed or did not run" >&2
    exit 1
fi

step "fault suite: hostile clients, changed model files, signals, endless inputs (scripts/faults.sh)"
# Bounded: every wait in it has a limit; the whole suite takes a few minutes.
timeout 900 scripts/faults.sh --bin target/release/cachefit

step "long memory: a 32K-token haystack ingested into SmolLM2's memory, 5 needles beyond the hot window (>= 4 answered)"
python3 scripts/memory/needles.py --bin target/release/cachefit --model "$models/SmolLM2-135M-Instruct.Q4_1.gguf" \
    --tokens 32000 --needles 5 --min-found 4

step "OpenAI client against cachefit serve (tests/openai; structured output: 50 random schemas x greedy/sampled, validated with jsonschema)"
# requirements.txt: openai, pytest, jsonschema.
python3 -m pip install --quiet --disable-pip-version-check -r tests/openai/requirements.txt 2>&1 | grep -v "Running pip as the 'root'" || true
CACHEFIT_BIN="$PWD/target/release/cachefit" timeout 300 python3 -m pytest -q -p no:cacheprovider tests/openai

step "the chat page in headless Chromium: send, stream, stop, reload, the API key (scripts/webui-test.sh; screenshots in target/webui/)"
timeout 300 scripts/webui-test.sh

step "two replicas behind nginx: 32 concurrent requests, one replica killed mid-run, 1 vs 2 replicas (scripts/deploy-test.sh)"
timeout 400 scripts/deploy-test.sh --bin target/release/cachefit

step "done"
# One closing line for CI's reader, summed over every cargo test binary.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "cargo test: %d passed, %d failed, %d skipped\n", p, f, i }' target/test.log
