#!/usr/bin/env bash
# bench-vs-fio.sh: run fio and lockstep-agent on the SAME job files on this machine, alternating,
# and report medians and ratios (IOPS, CPU time per IO, clat mean/p99, peak RSS).
#
# This is a measurement, not a test: it exits non-zero only when something fails (a build, an
# install, a run), never because a ratio misses its target. See scripts/README.md.
#
#   scripts/bench-vs-fio.sh [--runs N] [--scratch DIR] [--cases 1,2,3,4,5,6] [--out FILE]
#                           [--no-perf] [--no-build] [--quick] [--keep-json DIR] [--cpus LIST]
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/bench-vs-fio.sh [options]

  --runs N         timed runs per tool and case, alternating fio/lockstep (default 5)
  --scratch DIR    directory for job files and data files, on a real disk, never tmpfs
                   (default: ./bench-scratch under the repository; removed at the end)
  --cases LIST     comma-separated subset of 1,2,3,4,5,6 (default: all)
                     1  4k randread, direct, io_uring, iodepth 32, 1 GiB file, 20 s
                     5  case 1 with iodepth_batch_complete_max=32 for both tools: every
                        visible completion taken at once, so clat ends when the device's
                        completion is seen (both tools' default takes one per submit)
                     6  case 1 with fixedbufs=1 registerfiles=1 for fio, which lockstep's
                        io_uring engine does by default: registration like for like
                     2  null engine, 4k, iodepth 32 (examples/jobs/null-4k.fio), 10 s
                     3  4 jobs x iodepth 32, 4k randread direct io_uring, 10 s (memory)
                     4  seed job files: examples/jobs/hadoop-rand{read,write}.fio,
                        alteryx-randrw.fio, alteryx-seqwrite.fio (unmodified)
  --out FILE       markdown report (default: docs/benchmarks.md; "-" for none)
  --no-perf        skip the extra `perf stat` pass (syscalls and context switches per IO)
  --no-build       use the existing target/release/lockstep-agent
  --quick          smoke test of this script: every runtime becomes 3 s in copies of the job
                   files, and no report is written unless --out is given. Not a benchmark.
  --keep-json DIR  copy every raw fio/lockstep JSON and /usr/bin/time output into DIR
  --cpus LIST      run both tools under `taskset -c LIST` (default: not pinned). Where the
                   job's thread runs relative to the CPU taking the device's interrupts moves
                   IOPS by ~10% on a 2-vCPU VM, and the scheduler decides that anew in every
                   run; pinning both tools to the same CPUs removes that part of the noise.
EOF
}

die() { echo "bench-vs-fio: error: $*" >&2; exit 2; }
note() { echo "bench-vs-fio: $*" >&2; }

RUNS=5
SCRATCH=""
CASES="1,2,3,4,5,6"
OUT=""
PERF=1
BUILD=1
QUICK=0
KEEP_JSON=""
CPUS=""
ORIG_ARGS=("$@")
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) RUNS="${2:?--runs needs a number}"; shift 2 ;;
        --runs=*) RUNS="${1#*=}"; shift ;;
        --scratch) SCRATCH="${2:?--scratch needs a directory}"; shift 2 ;;
        --scratch=*) SCRATCH="${1#*=}"; shift ;;
        --cases) CASES="${2:?--cases needs a list}"; shift 2 ;;
        --cases=*) CASES="${1#*=}"; shift ;;
        --out) OUT="${2:?--out needs a file}"; shift 2 ;;
        --out=*) OUT="${1#*=}"; shift ;;
        --keep-json) KEEP_JSON="${2:?--keep-json needs a directory}"; shift 2 ;;
        --keep-json=*) KEEP_JSON="${1#*=}"; shift ;;
        --cpus) CPUS="${2:?--cpus needs a CPU list}"; shift 2 ;;
        --cpus=*) CPUS="${1#*=}"; shift ;;
        --no-perf) PERF=0; shift ;;
        --no-build) BUILD=0; shift ;;
        --quick) QUICK=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "--runs must be a positive integer, got '$RUNS'"
[ "$RUNS" -ge 3 ] || note "warning: --runs $RUNS: medians of fewer than 3 runs are not worth much"
for c in ${CASES//,/ }; do
    [[ "$c" =~ ^[1-6]$ ]] || die "--cases: unknown case '$c' (expected a subset of 1,2,3,4,5,6)"
done
has_case() { [[ ",$CASES," == *",$1,"* ]]; }

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
if [ -z "$OUT" ]; then
    if [ "$QUICK" = 1 ]; then OUT="-"; else OUT="$REPO/docs/benchmarks.md"; fi
fi
[ -n "$SCRATCH" ] || SCRATCH="$REPO/bench-scratch"
case "$OUT" in -|/*) ;; *) OUT="$PWD/$OUT" ;; esac

# --- tools -------------------------------------------------------------------------------------
as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else die "need root (or sudo) to run: $*"; fi
}
apt_install() { # package
    command -v apt-get >/dev/null 2>&1 || die "$1 is missing and apt-get is not available: install it by hand"
    note "installing the Debian package '$1'"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "$1" >/dev/null ||
        { as_root apt-get update >/dev/null && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "$1" >/dev/null; } ||
        die "apt-get install $1 failed"
}
command -v python3 >/dev/null 2>&1 || die "python3 is needed for the JSON arithmetic"
command -v fio >/dev/null 2>&1 || apt_install fio
[ -x /usr/bin/time ] || apt_install time
FIO="$(command -v fio)"
TIME=/usr/bin/time
# PIN: a command prefix, empty or taskset -c LIST (applied to both tools alike).
PIN=()
if [ -n "$CPUS" ]; then
    command -v taskset >/dev/null 2>&1 || die "--cpus needs taskset (util-linux)"
    taskset -c "$CPUS" true 2>/dev/null || die "--cpus $CPUS: taskset refuses this CPU list"
    PIN=(taskset -c "$CPUS")
fi
if [ "$PERF" = 1 ]; then
    if ! command -v perf >/dev/null 2>&1 || ! perf stat -e task-clock -o /dev/null true >/dev/null 2>&1; then
        note "perf is not usable here: skipping the perf stat pass"; PERF=0
    fi
fi

# --- scratch directory (real disk, removed at the end) ----------------------------------------
CREATED_SCRATCH=0
WORK=""
cleanup() {
    local rc=$?
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then rm -rf -- "$WORK"; fi
    if [ "$CREATED_SCRATCH" = 1 ] && [ -d "$SCRATCH" ]; then rmdir -- "$SCRATCH" 2>/dev/null || true; fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ ! -d "$SCRATCH" ]; then
    mkdir -p -- "$SCRATCH" || die "cannot create scratch directory $SCRATCH"
    CREATED_SCRATCH=1
fi
SCRATCH="$(cd "$SCRATCH" && pwd)"
FSTYPE="$(stat -f -c %T "$SCRATCH")"
NEEDS_DIRECT=0
for c in 1 3 4 5; do has_case $c && NEEDS_DIRECT=1; done
case "$FSTYPE" in
    tmpfs|ramfs)
        if [ "$NEEDS_DIRECT" = 1 ]; then
            die "scratch directory $SCRATCH is on $FSTYPE: the direct=1 (O_DIRECT) jobs of cases 1, 3 and 4 need a real disk (tmpfs has no O_DIRECT and would measure RAM). Pass --scratch DIR on a disk filesystem, or --cases 2 for the null engine only."
        fi ;;
esac
WORK="$(mktemp -d "$SCRATCH/run.XXXXXX")"
NEED_KIB=$((3 * 1024 * 1024))
AVAIL_KIB="$(df -Pk "$SCRATCH" | awk 'NR==2 {print $4}')"
if [ "$NEEDS_DIRECT" = 1 ] && [ "${AVAIL_KIB:-0}" -lt "$NEED_KIB" ]; then
    die "scratch directory $SCRATCH has $((AVAIL_KIB / 1024)) MiB free; the file cases need about 3 GiB"
fi
mkdir -p "$WORK/jobs" "$WORK/data" "$WORK/results" "$WORK/bin"

# --- build once, and freeze the binary (others may rebuild target/ during the run) -------------
tree_id() { git -C "$REPO" rev-parse HEAD 2>/dev/null; git -C "$REPO" diff HEAD -- agent proto Cargo.toml Cargo.lock 2>/dev/null | sha256sum; }
TREE_BEFORE="$(tree_id)"
if [ "$BUILD" = 1 ]; then
    note "building: cargo build --release -p lockstep-agent"
    cargo build --release -p lockstep-agent >&2 || die "cargo build --release -p lockstep-agent failed"
fi
AGENT_SRC="${CARGO_TARGET_DIR:-$REPO/target}/release/lockstep-agent"
[ -x "$AGENT_SRC" ] || die "no lockstep-agent binary at $AGENT_SRC (build it, or drop --no-build)"
cp -- "$AGENT_SRC" "$WORK/bin/lockstep-agent"
AGENT="$WORK/bin/lockstep-agent"
# What was built: recorded now, not at the end (others may commit or edit during the run).
GIT_HEAD="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
GIT_DIRTY="$(git -C "$REPO" status --porcelain -- agent proto Cargo.toml Cargo.lock 2>/dev/null | awk '{print $NF}' | paste -sd' ' -)"
GIT_DIFF_HASH="$(git -C "$REPO" diff HEAD -- agent proto Cargo.toml Cargo.lock 2>/dev/null | sha256sum | cut -c1-12)"
AGENT_HASH="$(sha256sum "$AGENT" | cut -c1-12)"
TREE_MOVED=""
if [ "$(tree_id)" != "$TREE_BEFORE" ]; then
    TREE_MOVED="the checkout changed while lockstep-agent was being built: the commit named below is approximate"
    note "warning: $TREE_MOVED"
fi

# --- job files ---------------------------------------------------------------------------------
# manifest.tsv: case  name  jobfile  lockstep_dir  description  [fio's jobfile when it differs]
MANIFEST="$WORK/manifest.tsv"
: >"$MANIFEST"
RR_FILE="$WORK/data/randread-1g.dat"

if has_case 1 || has_case 5 || has_case 6; then
    cat >"$WORK/jobs/case1-randread-4k.fio" <<EOF
; case 1: 4k random reads, O_DIRECT, io_uring, iodepth 32, one 1 GiB file shared by both tools
[randread-4k]
filename=$RR_FILE
rw=randread
bs=4k
direct=1
ioengine=io_uring
iodepth=32
size=1g
runtime=20
time_based
EOF
    if has_case 1; then
        printf '1\trandread-4k\t%s\t%s\t%s\n' "$WORK/jobs/case1-randread-4k.fio" "$WORK/data" \
            "4k randread, direct=1, io_uring, iodepth=32, 1 GiB file, 20 s time_based" >>"$MANIFEST"
    fi
fi
if has_case 2; then
    printf '2\tnull-4k\t%s\t%s\t%s\n' "$REPO/examples/jobs/null-4k.fio" "$WORK/data" \
        "ioengine=null, randread bs=4k, iodepth=32, size=1g, 10 s time_based (examples/jobs/null-4k.fio)" >>"$MANIFEST"
fi
if has_case 3; then
    cat >"$WORK/jobs/case3-4jobs-qd32.fio" <<EOF
; case 3: 4 jobs x iodepth 32 of 4k random reads (memory: IO buffers are 4 x 32 x 4 KiB = 512 KiB)
[randread-4x32]
filename=$RR_FILE
rw=randread
bs=4k
direct=1
ioengine=io_uring
iodepth=32
numjobs=4
size=1g
runtime=10
time_based
EOF
    printf '3\t4jobs-qd32\t%s\t%s\t%s\n' "$WORK/jobs/case3-4jobs-qd32.fio" "$WORK/data" \
        "numjobs=4, 4k randread, direct=1, io_uring, iodepth=32, same 1 GiB file, 10 s time_based" >>"$MANIFEST"
fi
if has_case 4; then
    for j in hadoop-randread hadoop-randwrite alteryx-randrw alteryx-seqwrite; do
        [ -f "$REPO/examples/jobs/$j.fio" ] || die "missing examples/jobs/$j.fio"
        mkdir -p "$WORK/data/$j"
        printf '4\t%s\t%s\t%s\t%s\n' "$j" "$REPO/examples/jobs/$j.fio" "$WORK/data/$j" \
            "examples/jobs/$j.fio, unmodified (LOCKSTEP_DIR=scratch)" >>"$MANIFEST"
    done
fi
if has_case 5; then
    # Both tools' default loop takes one completion per submit (iodepth_batch_complete_max
    # defaults to iodepth_batch_complete_min=1) and leaves the others waiting, finished, with
    # that wait in their clat. Here both take every visible completion at once.
    { cat "$WORK/jobs/case1-randread-4k.fio"; echo "iodepth_batch_complete_max=32"; } \
        | sed 's/^; case 1: /; case 5: /' >"$WORK/jobs/case5-randread-4k-reapall.fio"
    printf '5\trandread-4k-reapall\t%s\t%s\t%s\n' "$WORK/jobs/case5-randread-4k-reapall.fio" "$WORK/data" \
        "case 1's job with iodepth_batch_complete_max=32 for both tools (every visible completion taken at once)" \
        >>"$MANIFEST"
fi
if has_case 6; then
    # lockstep's io_uring engine registers its files and buffers with the ring by default; fio
    # does only when told. Here fio is told, lockstep runs case 1's job unchanged.
    { cat "$WORK/jobs/case1-randread-4k.fio"; printf 'fixedbufs=1\nregisterfiles=1\n'; } \
        | sed 's/^; case 1: /; case 6 (fio side): /' >"$WORK/jobs/case6-randread-4k-fio-fixed.fio"
    printf '6\trandread-4k-fixedbufs\t%s\t%s\t%s\t%s\n' "$WORK/jobs/case1-randread-4k.fio" "$WORK/data" \
        "case 1's job for lockstep (registered files and buffers by default); fio runs it with fixedbufs=1 registerfiles=1" \
        "$WORK/jobs/case6-randread-4k-fio-fixed.fio" >>"$MANIFEST"
fi

# --quick: copies with runtime=3 (never used for a report unless --out is given).
if [ "$QUICK" = 1 ]; then
    python3 - "$MANIFEST" "$WORK/jobs" <<'PY'
import sys, os, re
manifest, jobs = sys.argv[1], sys.argv[2]
rows = [l.rstrip("\n").split("\t") for l in open(manifest) if l.strip()]
for r in rows:
    for col, tag in ((2, ""), (5, "fio-")):
        if len(r) <= col or not r[col]:
            continue
        src = r[col]
        dst = os.path.join(jobs, "quick-" + tag + r[1] + ".fio")
        text = re.sub(r"(?m)^(\s*runtime\s*=).*$", r"\g<1>3", open(src).read())
        open(dst, "w").write(text)
        r[col] = dst
with open(manifest, "w") as f:
    for r in rows:
        f.write("\t".join(r) + "\n")
PY
fi

# A layout job: the same file with create_only=1 and overwrite=1 at the end of every job section,
# so fio writes every data file in full once, before any timed run (reads then hit real data and
# writes never hit unwritten extents). Both tools then use these files; lockstep reuses existing
# files of the right size and never removes files it did not create.
make_layout_job() { # src dst
    python3 - "$1" "$2" <<'PY'
import sys, re
src, dst = sys.argv[1], sys.argv[2]
out, in_job = [], False
def close():
    if in_job:
        out.extend(["create_only=1", "overwrite=1"])
for line in open(src).read().splitlines():
    m = re.match(r"^\s*\[([^\]]+)\]", line.replace("\u00a0", " "))
    if m:
        close()
        in_job = m.group(1).strip() != "global"
    out.append(line)
close()
open(dst, "w").write("\n".join(out) + "\n")
PY
}

# --- runs --------------------------------------------------------------------------------------
RUNLOG="$WORK/runs.tsv"   # case name i tool json timefile loadavg
: >"$RUNLOG"

run_tool() { # tool case name i jobfile dir prefix [fio's jobfile]
    local tool=$1 case=$2 name=$3 i=$4 job=$5 dir=$6 prefix=$7
    if [ "$tool" = fio ] && [ -n "${8:-}" ]; then job=$8; fi
    local out="$WORK/results/$prefix$case-$name-$tool-$i.json" tm="$WORK/results/$prefix$case-$name-$tool-$i.time"
    local err="$WORK/results/$prefix$case-$name-$tool-$i.stderr" load rc=0
    load="$(cut -d' ' -f1 /proc/loadavg)"
    if [ "$tool" = fio ]; then
        LOCKSTEP_DIR="$dir" ${PIN[@]+"${PIN[@]}"} "$TIME" -v -o "$tm" "$FIO" --output-format=json --output="$out" "$job" 2>"$err" || rc=$?
    else
        LOCKSTEP_DIR="$dir" ${PIN[@]+"${PIN[@]}"} "$TIME" -v -o "$tm" "$AGENT" run "$job" --output-format=json --output="$out" --keep-files 2>"$err" || rc=$?
    fi
    if [ "$rc" != 0 ] || [ ! -s "$out" ]; then
        echo "---- $tool on $job (run $i) failed with exit status $rc; its stderr:" >&2
        cat "$err" >&2 || true
        die "$tool failed on case $case ($name)"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$case" "$name" "$i" "$tool" "$out" "$tm" "$load" >>"$RUNLOG"
}

PERFLOG="$WORK/perf.tsv"  # case name tool json perfout
: >"$PERFLOG"
perf_tool() { # tool case name jobfile dir
    local tool=$1 case=$2 name=$3 job=$4 dir=$5
    local out="$WORK/results/perf-$case-$name-$tool.json" po="$WORK/results/perf-$case-$name-$tool.perf"
    local events="task-clock,context-switches,cpu-migrations,raw_syscalls:sys_enter,syscalls:sys_enter_io_uring_enter,io_uring:io_uring_cqring_wait"
    local cmd
    if [ "$tool" = fio ]; then cmd=("$FIO" --output-format=json --output="$out" "$job")
    else cmd=("$AGENT" run "$job" --output-format=json --output="$out" --keep-files); fi
    cmd=(${PIN[@]+"${PIN[@]}"} "${cmd[@]}")
    if ! LOCKSTEP_DIR="$dir" perf stat -x, -o "$po" -e "$events" -- "${cmd[@]}" 2>/dev/null; then
        # Tracepoints may be unavailable (no tracefs): fall back to the generic counters.
        LOCKSTEP_DIR="$dir" perf stat -x, -o "$po" -e task-clock,context-switches,cpu-migrations -- "${cmd[@]}" 2>/dev/null ||
            { note "perf stat failed for $tool on case $case: skipped"; return 0; }
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$case" "$name" "$tool" "$out" "$po" >>"$PERFLOG"
}

START_DATE="$(date -u '+%Y-%m-%d %H:%M:%S UTC')"
START_S=$SECONDS
laid_out_rr=0
while IFS=$'\t' read -r case name job dir desc fiojob; do
    note "case $case ($name): $desc"
    # Lay out the data files once, untimed, with fio (both tools then reuse them).
    if [ "$case" = 1 ] || [ "$case" = 3 ] || [ "$case" = 5 ]; then
        if [ "$laid_out_rr" = 0 ]; then
            make_layout_job "$job" "$WORK/jobs/layout-$name.fio"
            note "  laying out $RR_FILE (1 GiB, written once)"
            "$FIO" --output-format=terse "$WORK/jobs/layout-$name.fio" >/dev/null || die "layout of $RR_FILE failed"
            laid_out_rr=1
        fi
    elif [ "$case" = 4 ]; then
        make_layout_job "$job" "$WORK/jobs/layout-$name.fio"
        note "  laying out the files of $name in $dir"
        LOCKSTEP_DIR="$dir" "$FIO" --output-format=terse "$WORK/jobs/layout-$name.fio" >/dev/null || die "layout for $name failed"
    fi
    for ((i = 1; i <= RUNS; i++)); do
        # Alternate which tool goes first, so drift (other builds, page cache, SSD state) is shared.
        if ((i % 2 == 1)); then order=(fio lockstep); else order=(lockstep fio); fi
        for tool in "${order[@]}"; do
            note "  run $i/$RUNS: $tool"
            run_tool "$tool" "$case" "$name" "$i" "$job" "$dir" "" "${fiojob:-}"
        done
    done
    if [ "$PERF" = 1 ] && { [ "$case" = 1 ] || [ "$case" = 2 ]; }; then
        for tool in fio lockstep; do
            note "  perf stat pass (not in the medians): $tool"
            perf_tool "$tool" "$case" "$name" "$job" "$dir"
        done
    fi
done <"$MANIFEST"
ELAPSED=$((SECONDS - START_S))

if [ -n "$KEEP_JSON" ]; then
    mkdir -p "$KEEP_JSON" && cp -- "$WORK"/results/* "$KEEP_JSON"/ && cp -- "$WORK"/jobs/*.fio "$KEEP_JSON"/ 2>/dev/null || true
fi

# --- report ------------------------------------------------------------------------------------
CMDLINE="scripts/bench-vs-fio.sh"
for a in "${ORIG_ARGS[@]+"${ORIG_ARGS[@]}"}"; do CMDLINE+=" $(printf '%q' "$a")"; done
CPU_MODEL="$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)"
DEVICE="$(df -P "$SCRATCH" | awk 'NR==2 {print $1}')"

export B_CPUS="$CPUS" B_RUNS="$RUNS" B_DATE="$START_DATE" B_CMD="$CMDLINE" B_NPROC="$(nproc)" B_KERNEL="$(uname -r)" \
    B_FIOVER="$("$FIO" --version)" B_AGENTVER="$("$AGENT" --version 2>/dev/null || echo '?')" \
    B_HEAD="$GIT_HEAD" B_DIRTY="$GIT_DIRTY" B_DIFFHASH="$GIT_DIFF_HASH" B_AGENTHASH="$AGENT_HASH" B_TREEMOVED="$TREE_MOVED" B_CPU="${CPU_MODEL:-unknown}" B_FSTYPE="$FSTYPE" \
    B_DEVICE="$DEVICE" B_ELAPSED="$ELAPSED" B_QUICK="$QUICK" B_REPO="$REPO" B_WORK="$WORK"

python3 - "$MANIFEST" "$RUNLOG" "$PERFLOG" "$OUT" <<'PY'
import json, os, re, statistics, sys

manifest, runlog, perflog, out = sys.argv[1:5]
E = os.environ
work = E["B_WORK"]

def load_json(path):
    text = open(path, errors="replace").read()
    start = text.find("{")  # fio may print a notice before the JSON
    if start < 0:
        raise SystemExit(f"bench-vs-fio: error: no JSON in {path}")
    return json.loads(text[start:])

def parse_time(path):
    t = {}
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("User time (seconds):"):
            t["user"] = float(line.split(":")[-1])
        elif line.startswith("System time (seconds):"):
            t["sys"] = float(line.split(":")[-1])
        elif line.startswith("Maximum resident set size (kbytes):"):
            t["rss_kib"] = int(line.split(":")[-1])
        elif line.startswith("Elapsed (wall clock) time"):
            v = line.split(": ", 1)[-1].strip()
            parts = [float(p) for p in v.split(":")]
            s = 0.0
            for p in parts:
                s = s * 60 + p
            t["wall"] = s
    return t

def metrics(json_path, time_path):
    d = load_json(json_path)
    jobs = d.get("jobs", [])
    m = {"read_iops": 0.0, "write_iops": 0.0, "read_mbs": 0.0, "write_mbs": 0.0, "ios": 0,
         "job_cpu_s": 0.0, "clat_w": 0.0, "lat_w": 0.0, "slat_w": 0.0, "clat_n": 0, "p99": None, "jobs": len(jobs)}
    for j in jobs:
        for dname in ("read", "write"):
            dd = j.get(dname) or {}
            n = int(dd.get("total_ios", 0) or 0)
            m[dname + "_iops"] += float(dd.get("iops", 0) or 0)
            m[dname + "_mbs"] += float(dd.get("bw_bytes", 0) or 0) / 1e6
            m["ios"] += n
            clat = dd.get("clat_ns") or {}
            if n > 0 and clat:
                m["clat_w"] += float(clat.get("mean", 0)) * n
                m["clat_n"] += n
                m["lat_w"] += float((dd.get("lat_ns") or {}).get("mean", 0)) * n
                m["slat_w"] += float((dd.get("slat_ns") or {}).get("mean", 0)) * n
                p = (clat.get("percentile") or {}).get("99.000000")
                if p is not None:
                    m["p99"] = max(m["p99"] or 0, float(p))
        jn = sum(int((j.get(x) or {}).get("total_ios", 0) or 0) for x in ("read", "write"))
        lvl = j.get("iodepth_level") or {}
        m["d32_w"] = m.get("d32_w", 0.0) + float(lvl.get("32", 0) or 0) * jn
        rt = float(j.get("job_runtime", 0) or 0) / 1000.0
        m["job_cpu_s"] += (float(j.get("usr_cpu", 0) or 0) + float(j.get("sys_cpu", 0) or 0)) / 100.0 * rt
    m["iops"] = m["read_iops"] + m["write_iops"]
    m["mbs"] = m["read_mbs"] + m["write_mbs"]
    m["clat_mean"] = m["clat_w"] / m["clat_n"] if m["clat_n"] else None
    m["lat_mean"] = m["lat_w"] / m["clat_n"] if m["clat_n"] else None
    m["slat_mean"] = m["slat_w"] / m["clat_n"] if m["clat_n"] else None
    m["depth32"] = m.get("d32_w", 0.0) / m["ios"] if m["ios"] else None
    t = parse_time(time_path)
    m.update(t)
    m["proc_cpu_s"] = t.get("user", 0.0) + t.get("sys", 0.0)
    m["cpu_job_ns_io"] = m["job_cpu_s"] * 1e9 / m["ios"] if m["ios"] else None
    m["cpu_proc_ns_io"] = m["proc_cpu_s"] * 1e9 / m["ios"] if m["ios"] else None
    m["user_ns_io"] = t.get("user", 0.0) * 1e9 / m["ios"] if m["ios"] else None
    m["sys_ns_io"] = t.get("sys", 0.0) * 1e9 / m["ios"] if m["ios"] else None
    return m

cases = []
for line in open(manifest):
    if not line.strip():
        continue
    c, name, job, d, desc, *rest = line.rstrip("\n").split("\t")
    fio_job = rest[0] if rest and rest[0] else None
    cases.append({"case": c, "name": name, "job": job, "fio_job": fio_job, "desc": desc, "runs": []})
byname = {c["name"]: c for c in cases}
for line in open(runlog):
    if not line.strip():
        continue
    c, name, i, tool, js, tm, load = line.rstrip("\n").split("\t")
    m = metrics(js, tm)
    m.update({"i": int(i), "tool": tool, "load": float(load)})
    byname[name]["runs"].append(m)

def med(case, tool, key):
    vals = [r[key] for r in case["runs"] if r["tool"] == tool and r.get(key) is not None]
    return statistics.median(vals) if vals else None

def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None

def rel(a, b):
    return (a - b) / b if a is not None and b not in (None, 0) else None

def f_num(v, nd=0):
    if v is None:
        return "n/a"
    if nd == 0:
        return f"{v:,.0f}"
    return f"{v:,.{nd}f}"

def f_ratio(v):
    return "n/a" if v is None else f"{v:.3f}"

def f_pct(v):
    return "n/a" if v is None else f"{v * 100:+.1f}%"

def f_us(ns):
    return "n/a" if ns is None else f"{ns / 1000:,.1f}"

def f_mib(kib):
    return "n/a" if kib is None else f"{kib / 1024:,.1f}"

summary = []
for c in cases:
    s = {"case": c["case"], "name": c["name"]}
    for tool in ("fio", "lockstep"):
        for key in ("iops", "read_iops", "write_iops", "mbs", "cpu_proc_ns_io", "cpu_job_ns_io",
                    "user_ns_io", "sys_ns_io", "clat_mean", "lat_mean", "p99", "rss_kib"):
            s[f"{tool}_{key}"] = med(c, tool, key)
    s["iops_ratio"] = ratio(s["lockstep_iops"], s["fio_iops"])
    s["cpu_proc_ratio"] = ratio(s["lockstep_cpu_proc_ns_io"], s["fio_cpu_proc_ns_io"])
    s["cpu_job_ratio"] = ratio(s["lockstep_cpu_job_ns_io"], s["fio_cpu_job_ns_io"])
    s["clat_rel"] = rel(s["lockstep_clat_mean"], s["fio_clat_mean"])
    s["p99_rel"] = rel(s["lockstep_p99"], s["fio_p99"])
    s["lat_rel"] = rel(s["lockstep_lat_mean"], s["fio_lat_mean"])
    # Paired ratios (run i of lockstep vs run i of fio): the spread shows how noisy the machine was.
    pairs = []
    for i in sorted({r["i"] for r in c["runs"]}):
        a = [r for r in c["runs"] if r["i"] == i and r["tool"] == "lockstep"]
        b = [r for r in c["runs"] if r["i"] == i and r["tool"] == "fio"]
        if a and b and b[0]["iops"]:
            pairs.append(a[0]["iops"] / b[0]["iops"])
    s["pair_min"] = min(pairs) if pairs else None
    s["pair_max"] = max(pairs) if pairs else None
    summary.append(s)

BUF_KIB = 4 * 32 * 4  # case 3: 4 jobs x iodepth 32 x 4 KiB
LIMIT_KIB = BUF_KIB + 32 * 1024

targets = []
def target(label, value, ok, shown):
    targets.append((label, shown, "n/a" if ok is None else ("met" if ok else "NOT met")))
S = {s["case"]: s for s in summary}
for cnum, label in (("1", "case 1 (4k randread direct)"), ("2", "case 2 (null engine)")):
    s = S.get(cnum)
    if not s:
        continue
    r = s["iops_ratio"]
    target(f"IOPS ratio lockstep/fio >= 1.0, {label}", r, None if r is None else r >= 1.0, f_ratio(r))
    r = s["cpu_proc_ratio"]
    target(f"CPU per IO (process, /usr/bin/time) lockstep/fio <= 1.0, {label}", r,
           None if r is None else r <= 1.0, f_ratio(r))
    r = s["cpu_job_ratio"]
    target(f"CPU per IO (job usr_cpu+sys_cpu from JSON) lockstep/fio <= 1.0, {label}", r,
           None if r is None else r <= 1.0, f_ratio(r))
s = S.get("1")
if s:
    for key, label in (("clat_rel", "mean clat"), ("p99_rel", "p99 clat")):
        v = s[key]
        target(f"{label} within 10% of fio's, case 1", v, None if v is None else abs(v) <= 0.10, f_pct(v))
    v = s["p99_rel"]
    target("p99 clat at most 10% above fio's, case 1", v, None if v is None else v <= 0.10, f_pct(v))
s = S.get("5")
if s:
    for key, label in (("clat_rel", "mean clat"), ("p99_rel", "p99 clat")):
        v = s[key]
        target(f"{label} within 10% of fio's, case 5 (both taking every visible completion at once)",
               v, None if v is None else abs(v) <= 0.10, f_pct(v))
s = S.get("3")
if s:
    v = s["lockstep_rss_kib"]
    target(f"lockstep peak RSS < buffers {BUF_KIB} KiB + 32 MiB = {LIMIT_KIB / 1024:.1f} MiB, case 3", v,
           None if v is None else v < LIMIT_KIB, f"{f_mib(v)} MiB")

# --- terminal table ---
cols = ["case", "IOPS fio", "IOPS lockstep", "ratio", "paired min-max",
        "CPU ns/IO fio", "CPU ns/IO lockstep", "ratio",
        "clat mean us fio", "lockstep", "diff", "p99 us fio", "lockstep", "diff",
        "RSS MiB fio", "lockstep"]
rows = []
for s in summary:
    rows.append([f"{s['case']} {s['name']}", f_num(s["fio_iops"]), f_num(s["lockstep_iops"]), f_ratio(s["iops_ratio"]),
                 "n/a" if s["pair_min"] is None else f"{s['pair_min']:.2f}-{s['pair_max']:.2f}",
                 f_num(s["fio_cpu_proc_ns_io"]), f_num(s["lockstep_cpu_proc_ns_io"]), f_ratio(s["cpu_proc_ratio"]),
                 f_us(s["fio_clat_mean"]), f_us(s["lockstep_clat_mean"]), f_pct(s["clat_rel"]),
                 f_us(s["fio_p99"]), f_us(s["lockstep_p99"]), f_pct(s["p99_rel"]),
                 f_mib(s["fio_rss_kib"]), f_mib(s["lockstep_rss_kib"])])
widths = [max(len(str(x)) for x in [h] + [r[k] for r in rows]) for k, h in enumerate(cols)]
def line(vals):
    return "  ".join(str(v).rjust(w) if k else str(v).ljust(w) for k, (v, w) in enumerate(zip(vals, widths)))
print()
print(f"medians of {E['B_RUNS']} alternating runs per tool (CPU = /usr/bin/time user+sys / total IOs)")
print(line(cols))
for r in rows:
    print(line(r))
print()
for label, shown, verdict in targets:
    print(f"  {verdict:8} {label}: {shown}")
print()

if out == "-":
    sys.exit(0)

# --- markdown ---
md = []
w = md.append
w("# lockstep vs fio: benchmark results")
w("")
w("Generated by `scripts/bench-vs-fio.sh` (see `scripts/README.md`). Both tools run the **same job**")
w("**file** on the same machine, alternating (fio first on odd runs, lockstep first on even runs);")
w("figures are medians over the runs, ratios are lockstep/fio of those medians. These are")
w("measurements on a shared, noisy machine, not pass/fail tests.")
w("")
if E.get("B_QUICK") == "1":
    w("> **--quick run: every runtime was cut to 3 s. Not a benchmark result.**")
    w("")
w("## Setup")
w("")
w(f"- date: {E['B_DATE']} (the whole run took {int(E['B_ELAPSED']) // 60} min {int(E['B_ELAPSED']) % 60} s)")
w(f"- command: `{E['B_CMD']}` (from the repository root)")
w(f"- machine: {E['B_NPROC']} CPUs ({E['B_CPU']}), kernel {E['B_KERNEL']}")
w(f"- fio: {E['B_FIOVER']} (Debian package); lockstep: {E['B_AGENTVER']}, release build of commit {E['B_HEAD']}"
  + (f" **plus uncommitted changes** to {E['B_DIRTY']} (sha256 of `git diff HEAD` over agent/ proto/ Cargo.*: {E['B_DIFFHASH']})"
     if E['B_DIRTY'] else " (clean tree under agent/, proto/, Cargo.*)")
  + f"; sha256 of the binary: {E['B_AGENTHASH']}"
  + (f" (**warning: {E['B_TREEMOVED']}**)" if E.get("B_TREEMOVED") else ""))
w(f"- scratch: a directory on {E['B_DEVICE']} ({E['B_FSTYPE']}), removed at the end; data files laid out once by fio"
  " (create_only=1, overwrite=1) before any timed run, then reused by both tools")
w(f"- runs: {E['B_RUNS']} per tool per case; peak RSS and process CPU from `/usr/bin/time -v`")
w(f"- CPUs: both tools pinned with `taskset -c {E['B_CPUS']}`" if E.get("B_CPUS") else
  "- CPUs: not pinned (the scheduler places each run's threads)")
w("")
w("## Summary (medians)")
w("")
w("| case | IOPS fio | IOPS lockstep | ratio | paired ratios min-max | CPU ns/IO fio | CPU ns/IO lockstep | ratio | job-CPU ratio | clat mean µs fio | lockstep | diff | clat p99 µs fio | lockstep | diff | lat mean µs fio | lockstep | diff | peak RSS MiB fio | lockstep |")
w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in summary:
    w("| " + " | ".join([
        f"{s['case']} {s['name']}", f_num(s["fio_iops"]), f_num(s["lockstep_iops"]), f_ratio(s["iops_ratio"]),
        "n/a" if s["pair_min"] is None else f"{s['pair_min']:.2f}-{s['pair_max']:.2f}",
        f_num(s["fio_cpu_proc_ns_io"]), f_num(s["lockstep_cpu_proc_ns_io"]), f_ratio(s["cpu_proc_ratio"]),
        f_ratio(s["cpu_job_ratio"]),
        f_us(s["fio_clat_mean"]), f_us(s["lockstep_clat_mean"]), f_pct(s["clat_rel"]),
        f_us(s["fio_p99"]), f_us(s["lockstep_p99"]), f_pct(s["p99_rel"]),
        f_us(s["fio_lat_mean"]), f_us(s["lockstep_lat_mean"]), f_pct(s["lat_rel"]),
        f_mib(s["fio_rss_kib"]), f_mib(s["lockstep_rss_kib"])]) + " |")
w("")
w("- IOPS: read + write IOPS summed over the jobs of the run.")
w("- CPU ns/IO: (user + system CPU of the whole process, from `/usr/bin/time`) / (read + write IOs")
w("  completed, from the JSON). It includes start-up and exit, which both tools pay. *job-CPU ratio*")
w("  is the same ratio computed from each tool's own report, (usr_cpu + sys_cpu)% x job_runtime / IOs.")
w("- clat: each tool's own completion latency. The mean is IO-weighted over jobs and directions; with")
w("  more than one job or direction, p99 is the largest per-job p99 (percentiles cannot be merged")
w("  from fio's JSON). *lat* is slat + clat (issue to completion): a tool that submits IOs in batches")
w("  moves time from clat into slat, so compare lat too. Both tools' default loop takes one")
w("  completion per submit (iodepth_batch_complete_max=1), so when the device finishes many IOs")
w("  together the others wait, finished, and that wait is in their clat. Case 5 gives both tools")
w("  iodepth_batch_complete_max=32: every visible completion is taken at once.")
w("- Registration: lockstep's io_uring engine registers its files and buffers with the ring by")
w("  default (fio's fixedbufs=1 registerfiles=1, off in fio); case 6 gives fio both.")
w("- peak RSS: `Maximum resident set size` from `/usr/bin/time -v`. For fio with numjobs > 1 this is")
w("  the largest single process (fio forks one process per job), not the sum.")
w("")
w("### Seed job files (case 4): throughput side by side")
w("")
if any(s["case"] == "4" for s in summary):
    w("| job file | read IOPS fio | read IOPS lockstep | write IOPS fio | write IOPS lockstep | MB/s fio | MB/s lockstep | ratio |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in summary:
        if s["case"] != "4":
            continue
        w(f"| examples/jobs/{s['name']}.fio | {f_num(s['fio_read_iops'], 1)} | {f_num(s['lockstep_read_iops'], 1)} | "
          f"{f_num(s['fio_write_iops'], 1)} | {f_num(s['lockstep_write_iops'], 1)} | {f_num(s['fio_mbs'], 1)} | "
          f"{f_num(s['lockstep_mbs'], 1)} | {f_ratio(ratio(s['lockstep_mbs'], s['fio_mbs']))} |")
    w("")
    w("All four ran to completion under both tools, unmodified (only `LOCKSTEP_DIR` points them at the")
    w("scratch directory; their sizes were already scaled down in examples/jobs).")
else:
    w("(case 4 not run)")
w("")
w("## Targets (issue 2, \"Must show\")")
w("")
w("| target | measured | verdict |")
w("|---|---:|---|")
for label, shown, verdict in targets:
    w(f"| {label} | {shown} | {verdict} |")
w("")

analysis_at = len(md)

perf = []
if os.path.exists(perflog):
    for line in open(perflog):
        if not line.strip():
            continue
        c, name, tool, js, po = line.rstrip("\n").split("\t")
        ev = {}
        for pl in open(po, errors="replace"):
            parts = pl.strip().split(",")
            if len(parts) >= 3 and parts[0] and not pl.startswith("#"):
                try:
                    ev[parts[2]] = float(parts[0])
                except ValueError:
                    pass
        d = load_json(js)
        ios = sum(int((j.get(dd) or {}).get("total_ios", 0) or 0) for j in d.get("jobs", []) for dd in ("read", "write"))
        iops = sum(float((j.get(dd) or {}).get("iops", 0) or 0) for j in d.get("jobs", []) for dd in ("read", "write"))
        perf.append((c, name, tool, ios, iops, ev))
if perf:
    w("## perf stat pass (one extra run per tool; not in the medians)")
    w("")
    w("Whole-process counts from `perf stat`, divided by the IOs the run completed. *waits* are")
    w("`io_uring:io_uring_cqring_wait` events: enters that had to wait for a completion.")
    w("")
    w("| case | tool | IOPS | IOs | task-clock ns/IO | syscalls/IO | io_uring_enter/IO | waits in io_uring_enter/IO | context switches/IO | migrations |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, name, tool, ios, iops, ev in perf:
        def per(k, nd=3, scale=1.0):
            v = ev.get(k)
            return "n/a" if v is None or not ios else f"{v * scale / ios:.{nd}f}"
        w(f"| {c} {name} | {tool} | {f_num(iops)} | {ios:,} | {per('task-clock', 1, 1e6)} | "
          f"{per('raw_syscalls:sys_enter')} | {per('syscalls:sys_enter_io_uring_enter')} | {per('io_uring:io_uring_cqring_wait')} | "
          f"{per('context-switches', 4)} | {f_num(ev.get('cpu-migrations'))} |")
    w("")

w("## Job files")
w("")
for c in cases:
    w(f"### Case {c['case']}: {c['name']}: {c['desc']}")
    w("")
    for job, who in ((c["job"], ""), (c["fio_job"], "fio's job: ")):
        if not job:
            continue
        shown = job.replace(E["B_REPO"] + "/", "")
        if shown.startswith(work):
            shown = "(generated) " + os.path.basename(job)
        w(f"{who}`{shown}`:")
        w("")
        w("```ini")
        w(open(job).read().replace(work, "$SCRATCH/run.XXXXXX").rstrip("\n"))
        w("```")
        w("")

w("## Raw per-run numbers")
w("")
w("In run order. load = 1-minute load average when the run started (others were compiling).")
w("IO depth 32 % = `iodepth_level[\"32\"]` (the `IO depths` line): the share of IOs issued while 32")
w("were outstanding. Both tools count the IOs not yet *reaped*, including finished ones still")
w("waiting to be taken, so with one completion taken per submit both show ~100% at 32 whatever the")
w("device does (lockstep's normal output also says how many of them were waiting).")
w("")
for c in cases:
    w(f"### Case {c['case']}: {c['name']}")
    w("")
    w("| run | tool | load | IOPS | read IOPS | write IOPS | MB/s | IOs | slat mean µs | clat mean µs | clat p99 µs | lat mean µs | IO depth 32 % | user s | sys s | CPU ns/IO | job-CPU ns/IO | peak RSS KiB | wall s |")
    w("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in c["runs"]:
        w(f"| {r['i']} | {r['tool']} | {r['load']:.2f} | {f_num(r['iops'])} | {f_num(r['read_iops'])} | {f_num(r['write_iops'])} | "
          f"{f_num(r['mbs'], 1)} | {r['ios']:,} | {f_us(r['slat_mean'])} | {f_us(r['clat_mean'])} | {f_us(r['p99'])} | {f_us(r['lat_mean'])} | {f_num(r['depth32'], 1)} | {r.get('user', 0):.2f} | "
          f"{r.get('sys', 0):.2f} | {f_num(r['cpu_proc_ns_io'])} | {f_num(r['cpu_job_ns_io'])} | {r.get('rss_kib', 0):,} | "
          f"{r.get('wall', 0):.2f} |")
    w("")

BEGIN = "<!-- analysis: begin (hand-written; kept when scripts/bench-vs-fio.sh rewrites this file) -->"
END = "<!-- analysis: end -->"
notes = ""
if os.path.exists(out):
    old = open(out).read()
    a, b = old.find(BEGIN), old.find(END)
    if a >= 0 and b > a:
        notes = old[a + len(BEGIN):b].strip("\n")
block = ["## Analysis", "", BEGIN, notes if notes else "(none yet)", END, ""]
md[analysis_at:analysis_at] = block
os.makedirs(os.path.dirname(out), exist_ok=True)
tmp = out + ".tmp"
open(tmp, "w").write("\n".join(md) + "\n")
os.replace(tmp, out)
print(f"report written to {out}")
PY
