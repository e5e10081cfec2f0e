#!/usr/bin/env bash
# Builds container images FROM scratch out of binaries already on this machine, plus exactly the
# shared libraries `ldd` says they load (no base image, so nothing to pull: this works with no
# container registry at all).
#
#   deploy/container/build.sh [lockstep|etcd] [--bin-dir DIR] [--tag TAG]
#
# lockstep (default): lockstep-agent and lockstep from DIR (default target/release; run
#   `cargo build --release --bins` first), tagged lockstep:<version> and lockstep:latest.
#   The entry point is lockstep-agent; run the coordinator with --entrypoint /usr/local/bin/lockstep.
# etcd: /usr/bin/etcd and etcdctl from Debian's etcd-server/etcd-client packages, tagged
#   lockstep-etcd:latest (for the container tests; use your real etcd in production).
#
# Binaries are copied with their debug info stripped (images stay small; keep the unstripped
# ones for symbolizing crashes).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
what=lockstep
bin_dir="$root/target/release"
tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    lockstep|etcd) what="$1" ;;
    --bin-dir) bin_dir="$2"; shift ;;
    --tag) tag="$2"; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

ctx="$(mktemp -d)"
log="$(mktemp)"
trap 'rm -rf "$ctx" "$log"' EXIT
mkdir -p "$ctx/rootfs/etc" "$ctx/rootfs/tmp" "$ctx/rootfs/volumes/data"
chmod 1777 "$ctx/rootfs/tmp"
# A user table, so that `USER 65534` has a name and tools that look it up do not fail.
printf 'root:x:0:0:root:/:/nonexistent\nnobody:x:65534:65534:nobody:/:/nonexistent\n' >"$ctx/rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$ctx/rootfs/etc/group"

# copy_bin SRC DEST_DIR: the binary (stripped of debug info) and every library it loads, at the
# same paths as on this machine (so the ELF interpreter path in the binary is right).
copy_bin() {
  local src="$1" dest="$ctx/rootfs$2"
  [ -x "$src" ] || { echo "build.sh: $src is missing or not executable" >&2; exit 2; }
  mkdir -p "$dest"
  cp "$src" "$dest/"
  strip --strip-debug "$dest/$(basename "$src")" 2>/dev/null || true
  ldd "$src" | awk '/=> \//{print $3} /^\t\//{print $1}' | while read -r lib; do
    mkdir -p "$ctx/rootfs$(dirname "$lib")"
    cp -L "$lib" "$ctx/rootfs$lib"
  done
}

# build TAG...: docker build of the context, quiet unless it fails.
build() {
  if ! docker build -q "$@" "$ctx" >"$log" 2>&1; then
    cat "$log" >&2
    echo "build.sh: docker build failed (is the Docker engine running? scripts/setup.sh --docker starts it)" >&2
    exit 1
  fi
}

case "$what" in
  lockstep)
    copy_bin "$bin_dir/lockstep-agent" /usr/local/bin
    copy_bin "$bin_dir/lockstep" /usr/local/bin
    version="$("$bin_dir/lockstep-agent" --version | awk '{print $2}')"
    tag="${tag:-lockstep:$version}"
    cp "$here/Dockerfile" "$ctx/Dockerfile"
    build -t "$tag" -t lockstep:latest
    ;;
  etcd)
    copy_bin "$(command -v etcd)" /usr/local/bin
    copy_bin "$(command -v etcdctl)" /usr/local/bin
    tag="${tag:-lockstep-etcd:latest}"
    mkdir -p "$ctx/rootfs/var/lib/etcd"
    cp "$here/etcd.Dockerfile" "$ctx/Dockerfile"
    build -t "$tag"
    ;;
esac
echo "$tag"
