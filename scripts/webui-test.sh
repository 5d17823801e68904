#!/usr/bin/env bash
# The chat page in headless Chromium (issue 22): installs what it needs
# (Debian's chromium, the websocket-client Python package), builds the
# release binary, fetches the test models, and runs tests/webui/browser_test.py. Screenshots go to
# target/webui/ (screenshot.png, screenshot-api-key.png, markdown.png;
# failure.png when a check fails).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
rm -rf target/webui
if ! command -v chromium >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null
fi
python3 -c "import websocket" 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check "websocket-client>=1.6" 2>&1 | grep -v "Running pip as the 'root'" || true
cargo build --release --quiet -p cachefit
models="$(scripts/fetch-models.sh)"
python3 tests/webui/browser_test.py --bin target/release/cachefit --out target/webui \
    --model "$models/SmolLM2-135M-Instruct.Q4_1.gguf"
echo "webui-test.sh: $((SECONDS - start)) s"
