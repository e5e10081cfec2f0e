#!/usr/bin/env bash
# Every test: unit and property tests, then end-to-end tests with real agent processes, files
# (O_DIRECT), sockets, etcd and containers. Installs what they need first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --docker
cargo build --workspace --bins
cargo test --workspace --no-fail-fast 2>&1
