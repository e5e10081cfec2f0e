#!/usr/bin/env bash
# Installs what building and testing lockstep needs on a fresh Debian machine, and nothing that
# is already there: protoc (tonic's code generation), fio (the reference the benchmarks compare
# with), etcd (cluster-mode tests), bindfs and fuse3 (a FUSE filesystem the hung-device tests
# stop), losetup and mkfs.ext4 (the loop device of the kernel_throttle drill test),
# systemd-analyze (the deploy test verifies the units), chromium (the report.html browser test
# opens it headless), prometheus (the Grafana dashboard's queries are tested on a real one) and a
# running Docker engine (container tests, with --docker). The tests that need these fail, not
# skip, without them.
set -euo pipefail
# On the PATH, or in the sbin directories a non-root PATH may lack (losetup, mkfs.ext4).
have() { command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
need=()
have protoc || need+=(protobuf-compiler)
have fio || need+=(fio)
have etcd || need+=(etcd-server)
have etcdctl || need+=(etcd-client)
have bindfs || need+=(bindfs)
have fusermount3 || need+=(fuse3)
have losetup || need+=(mount)
have mkfs.ext4 || need+=(e2fsprogs)
have systemd-analyze || need+=(systemd)
have chromium || need+=(chromium)
have prometheus || need+=(prometheus)
if [ "${1:-}" = "--docker" ] && ! command -v docker >/dev/null; then need+=(docker.io); fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ "${1:-}" = "--docker" ] && ! docker info >/dev/null 2>&1; then
  echo "setup: starting dockerd" >&2
  (dockerd >/tmp/dockerd.log 2>&1 &)
  for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
fi
