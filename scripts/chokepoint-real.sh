#!/usr/bin/env bash
# The chokepoint finder on real local runs, many times each (not a test: the figures depend on
# how busy the machine is). Runs each plan of examples/chokepoint/ RUNS times and checks the
# verdict against what the plan's header expects; the clean plan runs CLEAN times beside one
# busy loop per core. Prints one line per run and a tally per scenario.
# Usage: scripts/chokepoint-real.sh [RUNS=10] [CLEAN=20]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}; clean=${2:-20}
cargo build --release --workspace --bins -q
out=$(mkdir -p target/scratch && mktemp -d -p target/scratch)
busy=()
cleanup() { for p in "${busy[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$out"; }
trap cleanup EXIT

# verdict FILE EXPECT: prints "right ..." or "wrong ..." for a results.json.
verdict() {
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
want = sys.argv[2]
c = r.get("chokepoint") or {}
v = c.get("verdict") or {"verdict": "none"}
blamed = [x for x in [v] + c.get("also", []) if x.get("verdict") in ("volume", "node")]
if v["verdict"] == "volume":
    got = f"volume {v['node']}/{v['volume']} {v['kind']} from t={v['onset_ms']/1000:.0f}s"
elif v["verdict"] == "node":
    got = f"node {v['node']} from t={v['onset_ms']/1000:.0f}s"
else:
    got = v["verdict"]
if want == "clean":
    ok = not blamed
else:
    kind, who = want.split(":")
    ok = v["verdict"] == kind and (v["node"] if kind == "node" else f"{v['node']}/{v['volume']}") == who
print(("right" if ok else "wrong") + "  " + got)
PY
}

scenario() { # NAME LOCAL EXPECT COUNT
  local name=$1 local_shape=$2 expect=$3 count=$4 right=0
  for i in $(seq 1 "$count"); do
    target/release/lockstep run --local "$local_shape" "examples/chokepoint/$name.toml" \
      --output "$out/$name-$i" >/dev/null 2>"$out/$name-$i.log" || true
    line=$(verdict "$out/$name-$i/results.json" "$expect")
    echo "$name run $i: $line"
    [[ $line == right* ]] && right=$((right + 1))
  done
  echo "== $name: $right of $count right (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  tally+=("$name: $right of $count right")
}

tally=()
scenario moderate-fail-slow 6 volume:agent-4/data "$runs"
scenario intermittent-fail-slow 6 volume:agent-4/data "$runs"
scenario node-limit 3x4 node:agent-2 "$runs"
scenario eio-continue 6 volume:agent-4/data "$runs"
for _ in $(seq 1 "$(nproc)"); do sh -c 'while :; do :; done' & busy+=($!); done
scenario clean 6 clean "$clean"
printf '%s\n' "${tally[@]}"
