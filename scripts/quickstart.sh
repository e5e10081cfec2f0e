#!/usr/bin/env bash
# The local quickstart: four agents on this machine, one of them on an emulated 60 GiB gp2
# volume that runs out of burst credits mid-run; lockstep names it. About a minute, plus the
# first build. Extra arguments go to `lockstep run` (e.g. --json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --workspace --bins
exec target/release/lockstep run --local 4 examples/quickstart.toml "$@"
