#!/usr/bin/env bash
# Installs what building and testing lockstep needs on a fresh Debian machine, and nothing that
# is already there: protoc (tonic's code generation), fio (the reference the benchmarks compare
# with), etcd (cluster-mode tests), bindfs (a FUSE filesystem the hung-device tests stop) and a
# running Docker engine (container tests, with --docker).
set -euo pipefail
need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v fio >/dev/null || need+=(fio)
command -v etcd >/dev/null || need+=(etcd-server)
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v bindfs >/dev/null || need+=(bindfs)
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
