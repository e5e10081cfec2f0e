#!/usr/bin/env bash
# The real coordinator against simulated agents (`lockstep-agent simulate`) at cluster sizes:
# for each size, N agents x VOLUMES volumes at 1 s intervals for DURATION, and one table row:
# the coordinator's CPU seconds (user+sys, /usr/bin/time), per volume-interval, its peak RSS,
# the time from `lockstep run` to the first complete interval, and the interval lag the run
# loop measured (median, last 10 intervals, worst), and in the status the steady CPU per
# interval (the slope of the coordinator's CPU over the middle half of the run, without
# connecting and the end of the run). A benchmark, not a test: the simulator
# shares the machine with the coordinator (its CPU is printed too), so repeat runs to see the
# noise. docs/scale.md has figures and what they mean.
#
# Usage: scripts/scale-bench.sh [SIZES="100 1000 10000"]
#   env: VOLUMES=8 DURATION=60s INTERVAL=1s DIGITS=3 (the plan's histogram_digits, 2 or 3)
#   BASE_PORT=20000 KEEP=1 (keep the run directories; mind the disk: data/ takes about 2 KB per
#   volume-interval at 3 digits)
#   PERF=1: also record the coordinator's profile (perf record -g at 499 Hz) and print its top
#   functions (perf report --no-children); the profile is kept as target/scratch/perf-nN.data
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${1:-"100 1000 10000"}
volumes=${VOLUMES:-8}
duration=${DURATION:-60s}
interval=${INTERVAL:-1s}
digits=${DIGITS:-3}
base_port=${BASE_PORT:-20000}
# BIN=DIR: the binaries of DIR instead of this checkout's release build (to pair two builds).
if [ -z "${BIN:-}" ]; then cargo build --release --workspace --bins -q; fi
bin=${BIN:-target/release}
out=$(mkdir -p target/scratch && mktemp -d -p target/scratch scale-bench.XXXX)
sims=()
cleanup() {
  for p in "${sims[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -z "${KEEP:-}" ]; then rm -rf "$out"; else echo "runs kept in $out" >&2; fi
}
trap cleanup EXIT

cat > "$out/plan.toml" <<EOF
name = "scale"
duration = "$duration"
interval = "$interval"
histogram_digits = $digits

[[role]]
name = "datanode"
[role.workload.fio]
rw = "randrw"
rwmixread = 70
bs = "4k"
iodepth = 2
size = "1g"
ioengine = "null"
EOF

# CPU seconds (user+sys) a live process has used so far.
cpu_of() { awk -v t="$(getconf CLK_TCK)" '{printf "%.1f", ($14+$15)/t}' "/proc/$1/stat"; }
# CPU seconds (user+sys) of the coordinator's data writer thread (named lockstep-store), 0
# before it exists.
store_cpu_of() {
  local f
  for f in /proc/"$1"/task/*; do
    if [ "$(cat "$f/comm" 2>/dev/null)" = lockstep-store ]; then
      awk -v t="$(getconf CLK_TCK)" '{printf "%.2f", ($14+$15)/t}' "$f/stat" 2>/dev/null && return
    fi
  done
  echo 0
}

# Each simulator process holds 2 open files per agent (listener, connection): split a size
# over processes so each fits the hard limit.
hard=$(ulimit -Hn)
per_proc=$(( (hard - 512) / 2 ))

printf '%-7s %-8s %-9s %-8s %-10s %-9s %-10s %-10s %-10s %-8s %s\n' \
  agents volumes cpu_s us/vol-iv peak_rss first_iv lag_med lag_last10 lag_worst sim_cpu status
for n in $sizes; do
  dir="$out/n$n"; mkdir -p "$dir"
  sims=(); : > "$dir/agents.txt"
  first=0
  while [ "$first" -lt "$n" ]; do
    count=$(( n - first < per_proc ? n - first : per_proc ))
    "$bin/lockstep-agent" simulate --agents "$count" --volumes "$volumes" \
      --first-index "$first" --base-port $((base_port + first)) \
      --addresses "$dir/agents-$first.txt" --seed $((first + 1)) \
      > "$dir/sim-$first.out" 2> "$dir/sim-$first.err" &
    sims+=($!)
    first=$((first + count))
  done
  for f in $(seq 0 "$per_proc" $((n - 1))); do
    until grep -q ready "$dir/sim-$f.out" 2>/dev/null; do
      kill -0 "${sims[0]}" || { cat "$dir/sim-$f.err" >&2; exit 2; }
      sleep 0.5
    done
    cat "$dir/agents-$f.txt" >> "$dir/agents.txt"
  done
  sim_cpu0=0; for p in "${sims[@]}"; do sim_cpu0=$(echo "$sim_cpu0 + $(cpu_of "$p")" | bc); done
  set +e
  prof=()
  [ -z "${PERF:-}" ] || prof=(perf record -q -g -F 499 -o "target/scratch/perf-n$n.data" --)
  /usr/bin/time -v -o "$dir/time.txt" "${prof[@]}" "$bin/lockstep" run "$out/plan.toml" \
    --agents-file "$dir/agents.txt" --output "$dir/run" > "$dir/report.txt" 2> "$dir/live.txt" &
  timer=$!
  # The coordinator's CPU once a second (seconds since it started, CPU seconds so far): the
  # steady cost per interval is the slope over the middle half of the run, without connecting
  # and the end of the run, which dominate a short run's total.
  t0=$(date +%s.%N); coord=""
  while kill -0 "$timer" 2>/dev/null; do
    [ -n "$coord" ] || coord=$(pgrep -n -x lockstep || true)
    [ -z "$coord" ] || echo "$(echo "$(date +%s.%N) - $t0" | bc) $(cpu_of "$coord" 2>/dev/null) $(store_cpu_of "$coord")" >> "$dir/cpu.txt"
    sleep 1
  done
  wait "$timer"; rc=$?
  set -e
  sim_cpu=0; for p in "${sims[@]}"; do sim_cpu=$(echo "$sim_cpu + $(cpu_of "$p")" | bc); done
  for p in "${sims[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  python3 - "$dir" "$n" "$volumes" "$rc" "$(echo "$sim_cpu - $sim_cpu0" | bc)" "$interval" "$duration" <<'PY'
import json, re, sys, os
d, n, m, rc, sim_cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
def secs(x):
    v, unit = re.fullmatch(r"([\d.]+)\s*(ms|s|m|h)?", x).groups()
    return float(v) * {"ms": 1e-3, "s": 1, None: 1, "m": 60, "h": 3600}[unit]
interval_s, duration_s = secs(sys.argv[6]), secs(sys.argv[7])
t = open(os.path.join(d, "time.txt")).read()
num = lambda key: float(re.search(re.escape(key) + r":\s*([\d.]+)", t).group(1))
cpu = num("User time (seconds)") + num("System time (seconds)")
rss_mib = num("Maximum resident set size (kbytes)") / 1024
live = open(os.path.join(d, "live.txt")).read()
m_lag = re.search(r"interval lag: median (\d+) ms, last 10 intervals (\d+) ms, worst (\d+) ms \(interval \d+\), over (\d+) intervals; first interval complete ([\d.]+) s", live)
try:
    r = json.load(open(os.path.join(d, "run", "results.json")))
    skew = (r.get("start_skew_ns") or 0) / 1e6
    status = f"{r['status']} {len(r['volumes'])} vols, start skew {skew:.1f} ms"
    data = r.get("data") or {}
    if data.get("stored_bytes") and m_lag:
        per_vi = data["stored_bytes"] / (n * m * int(m_lag.group(4)))
        status += f", {data.get('histogram_digits', 3)} digits, histograms {per_vi:.0f} B/vol-iv on disk"
except Exception as e:
    status = f"exit {rc}, no results.json"
def steady(first_iv):
    # CPU per interval over the middle half of the measured run: the run starts about one
    # interval before its first interval completes.
    try:
        rows = [tuple(map(float, l.split())) for l in open(os.path.join(d, "cpu.txt")) if len(l.split()) == 3]
    except OSError:
        return None
    start = first_iv - interval_s
    a, b = start + duration_s / 4, start + 3 * duration_s / 4
    inside = [r for r in rows if a <= r[0] <= b]
    if len(inside) < 2 or inside[-1][0] - inside[0][0] < interval_s:
        return None
    (t1, c1, s1), (t2, c2, s2) = inside[0], inside[-1]
    per = interval_s / (t2 - t1)
    return (c2 - c1) * per, (s2 - s1) * per
if m_lag:
    med, last, worst, ivs, first = m_lag.groups()
    st = steady(float(first))
    if st is not None:
        st, store = st
        status += f"; steady {st:.2f} s CPU per interval ({st / (n * m) * 1e6:.1f} us per volume-interval), data writer {store:.3f} s"
    per = cpu / (n * m * int(ivs)) * 1e6
    row = (f"{n:<7} {m:<8} {cpu:<9.1f} {per:<8.1f} {rss_mib:<10.0f} {first + ' s':<9} "
           f"{med + ' ms':<10} {last + ' ms':<10} {worst + ' ms':<10} {sim_cpu:<8.1f} {status}")
else:
    row = f"{n:<7} {m:<8} {cpu:<9.1f} {'-':<8} {rss_mib:<10.0f} {'-':<9} {'-':<10} {'-':<10} {'-':<10} {sim_cpu:<8.1f} {status}"
print(row, flush=True)
PY
  if [ -n "${PERF:-}" ]; then
    perf report -q -i "target/scratch/perf-n$n.data" --no-children --sort symbol 2>/dev/null \
      | grep -v '^$' | grep -v '^ *|' | grep -v '^ *-' | head -40 || true
  fi
  # A run that failed (exit 2 and up: an error, a panic), or whose simulator panicked, keeps
  # its logs, not its data files: the coordinator's stderr (live.txt), the simulators'
  # (sim-*.err) and the report. The last lines alone lost a panic's message once
  # (docs/scale.md), so every panic is printed whole.
  if [ "$rc" -gt 1 ] || grep -q "panicked at" "$dir"/sim-*.err; then
    logs=$(mktemp -d -p target/scratch "scale-bench-failed-n$n.XXXX")
    cp "$dir"/live.txt "$dir"/sim-*.err "$dir"/report.txt "$logs"/ 2>/dev/null || true
    echo "exit $rc: logs kept in $logs" >&2
    grep -h -A 30 "panicked at" "$dir"/live.txt "$dir"/sim-*.err >&2 || tail -5 "$dir/live.txt" >&2
  fi
  # The data files are about 1.4 KB a volume-interval at 3 digits (680 MB for 1,000 x 8 x 60 s):
  # gone at once.
  [ -n "${KEEP:-}" ] || rm -rf "$dir/run"
done
