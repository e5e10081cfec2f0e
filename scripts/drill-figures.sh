#!/usr/bin/env bash
# drill-figures.sh: measures the failure-drill figures issue 5 asks for, on this machine, with
# release binaries and the full-length runs the tests shorten:
#
#   1. open-loop accuracy: a 5,000 IOPS target per volume (2 local agents, 30 s, linear and
#      poisson arrivals): achieved IOPS and the error in percent;
#   2. a 200 ms stall on one of those volumes: p99.9 from the intended issue (corrected) and
#      from the actual issue (uncorrected);
#   3. a 60 GiB gp2 model at 3,000 IOPS with time_scale 60: when IOPS falls to 180 against
#      the prediction 5.4M / (3000 - 180) / 60 = 31.9 s (50 s run);
#   4. drop_writes on 1% of writes: blocks found by the verifier against the blocks whose last
#      acknowledged write was dropped, and a clean run.
#
# A measurement, not a test: it exits non-zero only when a run cannot be done.
#
#   scripts/drill-figures.sh [--no-build] [--scratch DIR] [--only 1,2,3,4]
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=1
SCRATCH="$ROOT/target/drill-figures"
ONLY="1,2,3,4"
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) BUILD=0 ;;
        --scratch) SCRATCH="$2"; shift ;;
        --only) ONLY="$2"; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "drill-figures: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
want() { [[ ",$ONLY," == *",$1,"* ]]; }

if [ "$BUILD" = 1 ]; then
    cargo build --release --bins >&2
fi
BIN="$ROOT/target/release"
export LOCKSTEP_AGENT_BIN="$BIN/lockstep-agent"
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"

# run NAME PLAN_TEXT [--local N] [extra args]: runs lockstep, leaves results in $SCRATCH/NAME/run
run() {
    local name=$1 plan=$2
    shift 2
    mkdir -p "$SCRATCH/$name"
    printf '%s\n' "$plan" > "$SCRATCH/$name/plan.toml"
    echo "+ lockstep run $* $SCRATCH/$name/plan.toml --output $SCRATCH/$name/run" >&2
    set +e
    "$BIN/lockstep" run "$@" "$SCRATCH/$name/plan.toml" --output "$SCRATCH/$name/run" > "$SCRATCH/$name/report.txt" 2> "$SCRATCH/$name/stderr.txt"
    local rc=$?
    set -e
    if [ $rc -ne 0 ] && [ $rc -ne 1 ]; then
        cat "$SCRATCH/$name/stderr.txt" >&2
        echo "drill-figures: run $name failed ($rc)" >&2
        exit 2
    fi
}

rate_plan() {
    cat <<EOF
name = "rate5k-$1"
duration = "30s"
[[role]]
name = "db"
rate_iops = 5000
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 32
size = "256m"
ioengine = "io_uring"
direct = 1
rate_process = "$1"
[[fault]]
at = "15s"
duration = "200ms"
target = { agents = ["agent-2"] }
kind = "stall"
EOF
}

if want 1 || want 2; then
    for process in linear poisson; do
        run "rate-$process" "$(rate_plan $process)" --local 2
        python3 - "$SCRATCH/rate-$process/run/results.json" "$process" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
process = sys.argv[2]
for v in r["volumes"]:
    t = v["summary"]["total"]
    err = (t["iops"] - 5000) / 5000 * 100
    line = f"[1] {process:7} {v['node']}: target 5000 IOPS, achieved {t['iops']:.1f} IOPS ({err:+.3f}%), {t['ios']} IOs in {r['duration_ms']/1000:.1f} s"
    if v["node"] == "agent-2":
        c = t["lat_intended"]["percentiles"]["99.900000"] / 1e6
        u = t["lat"]["percentiles"]["99.900000"] / 1e6
        line += f"\n[2] {process:7} agent-2 with a 200 ms stall at 15 s: p99.9 corrected (from intended issue) {c:.1f} ms, uncorrected (from actual issue) {u:.1f} ms"
    print(line)
EOF
    done
fi

if want 3; then
    run gp2 'name = "gp2-60x"
duration = "50s"
[[role]]
name = "w"
rate_iops = 3000
[role.workload.fio]
rw = "randread"
bs = "4k"
iodepth = 64
size = "256m"
ioengine = "io_uring"
direct = 1
[[fault]]
at = "0s"
target = {}
kind = "ebs"
volume_type = "gp2"
size_gib = 60
time_scale = 60' --local 1
    python3 - "$SCRATCH/gp2/run/timeline.json" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
pts = [p for p in t["volumes"][0]["points"] if p["len_ms"] >= 500]
series = [((p["t_ms"] - p["len_ms"]) / 1000, sum(p["ios"]) * 1000 / p["len_ms"]) for p in pts]
predicted = 5.4e6 / (3000 - 180) / 60
fall = next(i for i, s in enumerate(series) if s[1] < 1500)
start, iops = series[fall]
# Within the interval of the fall, the share still at 3,000 IOPS tells when it fell.
fell_at = start + max(iops - 180, 0) / (3000 - 180)
after = [round(s[1]) for s in series[fall + 1:fall + 6]]
print(f"[3] gp2 60 GiB at 3000 IOPS, time_scale 60: predicted fall at {predicted:.2f} s, measured {fell_at:.2f} s "
      f"(interval {start:.0f}-{start+1:.0f} s at {iops:.0f} IOPS; {fell_at - predicted:+.2f} s); then {after} IOPS")
EOF
fi

if want 4; then
    for case in drop clean; do
        fault=""
        if [ $case = drop ]; then
            fault='[[fault]]
at = "2s"
target = {}
kind = "drop_writes"
fraction = 0.01'
        fi
        run "verify-$case" "name = \"verify-$case\"
duration = \"20s\"
[[role]]
name = \"w\"
rate_iops = 2000
[role.workload.fio]
rw = \"randwrite\"
bs = \"4k\"
iodepth = 32
size = \"32m\"
ioengine = \"io_uring\"
direct = 1
verify = \"crc32c\"
$fault" --local 1
        python3 - "$SCRATCH/verify-$case/run/results.json" "$case" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
v = r["verify"][0]
found = {(f["file"], f["offset"]) for f in v["findings"]}
dropped = {(b["file"], b["offset"]) for b in v["dropped_blocks"]}
print(f"[4] {sys.argv[2]:5}: {v['dropped_writes']} writes dropped, {len(dropped)} blocks left without their last acknowledged write; "
      f"verifier: {v['lost']} lost, {v['stale']} stale, {v['corrupt']} corrupt of {v['blocks']} blocks; "
      f"found == dropped: {found == dropped}")
EOF
    done
fi
echo "drill-figures: raw results under $SCRATCH" >&2
