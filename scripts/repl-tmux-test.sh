#!/usr/bin/env bash
# The chat REPL's key handling through tmux (issue 22): installs tmux when
# missing (apt), then runs the REPL tests, tmux_key_handling among them,
# which skips with a loud message only when tmux is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v tmux >/dev/null; then
    apt-get update -qq && apt-get install -y -qq tmux >/dev/null
fi
cargo test -p cachefit --test chat_repl "$@"
