#!/usr/bin/env bash
# Measures the achieved start skew of N local agents over several runs (not a test: it
# depends on how busy the machine is). Usage: scripts/skew.sh [AGENTS=8] [RUNS=9]
set -euo pipefail
cd "$(dirname "$0")/.."
agents=${1:-8}; runs=${2:-9}
cargo build --release --workspace --bins -q
out=$(mkdir -p target/scratch && mktemp -d -p target/scratch)
trap 'rm -rf "$out"' EXIT
skews=()
for i in $(seq 1 "$runs"); do
  target/release/lockstep run --local "$agents" examples/skew.toml --output "$out/r$i" --json >"$out/r$i.json" 2>/dev/null
  s=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['start_skew_ns']/1e6)" "$out/r$i.json")
  echo "run $i: start skew $s ms"
  skews+=("$s")
done
printf '%s\n' "${skews[@]}" | sort -n | awk -v n="$runs" '{a[NR]=$1} END {printf "median start skew over %d runs of %s agents: %.3f ms (min %.3f, max %.3f)\n", n, "'"$agents"'", a[int((n+1)/2)], a[1], a[n]}'
echo "load average during the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
