#!/usr/bin/env bash
# The etcd registry at scale (not a test: the figures depend on how busy the machine is).
# Starts a scratch etcd (Debian's etcd-server) in a temp dir on free loopback ports, registers
# N agents in it the way agents register (one lease each) and reads them with the
# coordinator's own functions: registration, listing, `lockstep agents`, watch, expiry, etcd's
# DB size, CPU and RSS. Prints one table; stops etcd and removes its data on exit.
# Usage: scripts/registry-scale.sh [--agents 10000] [--volumes 8] [--expire 100] [--ttl-s 5]
#        [--clients 1] (0: one etcd connection per agent, as N agent processes have)
# Debug builds: PROFILE=dev scripts/registry-scale.sh --agents 1000
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${PROFILE:-release}
dir=target/$([ "$profile" = dev ] && echo debug || echo release)
command -v etcd >/dev/null || apt-get install -y etcd-server
cargo build --profile "$profile" -q -p lockstep --bin lockstep --example registry_scale

tmp=$(mktemp -d)
etcd_pid=
cleanup() {
  [ -n "$etcd_pid" ] && kill "$etcd_pid" 2>/dev/null && wait "$etcd_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
client=$(free_port); peer=$(free_port)
url=http://127.0.0.1:$client
etcd --name scale --data-dir "$tmp/data" \
  --listen-client-urls "$url" --advertise-client-urls "$url" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "scale=http://127.0.0.1:$peer" >"$tmp/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 100); do
  curl -sf "$url/health" >/dev/null 2>&1 && break
  kill -0 "$etcd_pid" 2>/dev/null || { cat "$tmp/etcd.log"; exit 1; }
  sleep 0.1
done
echo "etcd $(etcd --version | head -1 | awk '{print $3}') at $url (pid $etcd_pid); $(nproc) cores; $(uptime | sed 's/.*load/load/')"
"$dir/examples/registry_scale" --etcd "$url" --etcd-pid "$etcd_pid" \
  --lockstep-bin "$dir/lockstep" "$@"
