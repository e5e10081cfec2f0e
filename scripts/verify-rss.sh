#!/usr/bin/env bash
# Peak memory of a verifying run on a large sparse file (not a test: a benchmark).
# Usage: scripts/verify-rss.sh [AGENT=target/release/lockstep-agent] [SIZE=64G] [SCRATCH=./verify-scratch]
# Runs a 20 s random 4 KiB write job with verify=crc32c at 20,000 IOPS on a sparse file of
# SIZE (so only what is written takes disk), samples the agent's RssAnon (its own memory) and
# RssFile (page cache it maps: the state table, when it is on the volume) every 0.2 s, then
# `lockstep-agent verify` on the kept files under /usr/bin/time. Give another AGENT binary to
# compare builds. The scratch directory must be on a real disk; it is removed at the end (a
# file written at random takes a while to delete on a filesystem mounted with discard).
set -euo pipefail
cd "$(dirname "$0")/.."
agent=${1:-target/release/lockstep-agent}; size=${2:-64G}; dir=${3:-./verify-scratch}
if [ "$agent" = target/release/lockstep-agent ]; then cargo build --release -q -p lockstep-agent; fi
mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/big.fio" <<EOF
[big]
directory=$dir
filename=big.dat
overwrite=1
rw=randwrite
bs=4k
size=$size
verify=crc32c
ioengine=io_uring
iodepth=16
rate_iops=20000
runtime=20s
time_based
EOF
truncate -s "$size" "$dir/big.dat"
"$agent" run "$dir/big.fio" --keep-files >"$dir/out.txt" 2>"$dir/err.txt" &
pid=$!
peak_anon=0; peak_file=0
while kill -0 "$pid" 2>/dev/null; do
  read -r a f < <(awk '/RssAnon/{a=$2} /RssFile/{f=$2} END{print a+0, f+0}' "/proc/$pid/status" 2>/dev/null || echo "0 0")
  [ "${a:-0}" -gt "$peak_anon" ] && peak_anon=$a
  [ "${f:-0}" -gt "$peak_file" ] && peak_file=$f
  sleep 0.2
done
rc=0; wait "$pid" || rc=$?
grep -E 'write: IOPS' "$dir/out.txt" || cat "$dir/err.txt"
echo "run: exit $rc, peak RssAnon $((peak_anon / 1024)) MiB, peak RssFile $((peak_file / 1024)) MiB"
/usr/bin/time -f 'verify after the run: peak RSS %M KiB, %e s' "$agent" verify "$dir" | head -1
