#!/usr/bin/env bash
# Issue 22 part 4: cachefit replicas behind nginx (docs/DEPLOY.md), tested
# on 127.0.0.1 with the configuration of deploy/nginx/cachefit.conf: two
# replicas, 32 concurrent requests, one replica SIGKILLed mid-run, then the
# 1-vs-2-replica throughput table. Installs nginx from Debian's packages
# if it is missing (CI starts from a fresh machine). About 1-2 minutes.
#
#   scripts/deploy-test.sh [--bin target/release/cachefit] [load.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/cachefit
if [ "${1:-}" = "--bin" ]; then bin=$2; shift 2; fi
[ -x "$bin" ] || { echo "no binary at $bin (cargo build --release -p cachefit)" >&2; exit 1; }
if ! command -v nginx >/dev/null; then
    # nginx from the Debian package. The test runs its own nginx in the
    # foreground on free ports; the system one the package may start (on
    # a machine with systemd, on :80) is left alone.
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; } ||
        { echo "deploy-test.sh: could not install nginx with apt-get (root needed)" >&2; exit 1; }
fi
command -v python3 >/dev/null || { echo "deploy-test.sh needs python3" >&2; exit 1; }
exec timeout 300 python3 tests/deploy/load.py --bin "$bin" "$@"
