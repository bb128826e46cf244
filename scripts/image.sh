#!/usr/bin/env bash
# Builds ringtrain's OCI image with podman, FROM scratch: no base image is pulled (none can be, here). Its
# root filesystem is assembled from this machine: the ringtrain binary (stripped), the minimal CPU libtorch
# from the cache, every shared library the two need as the dynamic loader resolves them (from Debian's
# packages), the system's CA certificates, the Fashion-MNIST files the built-in data set reads, and the
# accounts ringtrain (10001: the server) and ringtrain-rank (10002: tenant code, under the agent). Prints the
# image's name.
#
#   scripts/image.sh [--tag ringtrain:0.1.0] [--binary PATH] [--libtorch DIR]
#
# --binary: default, a release build of the workspace. --libtorch: default, the minimal CPU libtorch of the
# cache. The GPU variant: --libtorch the `torch` folder of the full CUDA torch wheel (the one the binary was
# built against, see scripts/device/) and --binary that GPU build; the CUDA libraries libtorch links, which
# the wheels keep beside it in site-packages/nvidia/*/lib, are copied into the image's libtorch folder. The
# GPU driver (libcuda) is not in the image: the container runtime mounts the host's (NVIDIA's toolkit, or
# the device plugin on Kubernetes). The GPU variant has not been built here: this machine has only the
# minimal CPU libtorch.
#
# The entrypoint is `ringtrain`: `podman run IMAGE serve`, `IMAGE agent ...`, `IMAGE doctor`.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
tag="ringtrain:$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)"
binary=""
libtorch=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --libtorch) libtorch="$2"; shift 2 ;;
    *) say "unknown argument $1 (give --tag NAME:VERSION, --binary PATH, --libtorch DIR)"; exit 2 ;;
  esac
done
apt_install podman binutils
# shellcheck disable=SC1090
source "$("$ROOT/scripts/setup.sh")"
if [ -z "$binary" ]; then
  say "building ringtrain (release)"
  (cd "$ROOT" && cargo build -q --release -p ringtrain)
  binary="$CARGO_TARGET_DIR/release/ringtrain"
fi
[ -x "$binary" ] || { say "no ringtrain binary at $binary"; exit 1; }
libtorch="${libtorch:-$LIBTORCH}"
[ -e "$libtorch/lib/libtorch_cpu.so" ] || { say "no libtorch at $libtorch (no lib/libtorch_cpu.so)"; exit 1; }
variant="CPU"
[ -e "$libtorch/lib/libtorch_cuda.so" ] && variant="GPU (CUDA)"
# the full wheels' CUDA libraries, where libtorch_cuda's RUNPATH finds them (none for the CPU layout)
nvidia_libs=$(find "$libtorch/../nvidia" -mindepth 2 -maxdepth 2 -type d -name lib 2>/dev/null | tr '\n' ':' || true)
datasets=/usr/share/datasets/fashion-mnist

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
lib="$rootfs/usr/local/lib/ringtrain/libtorch/lib"
mkdir -p "$rootfs/usr/local/bin" "$lib" "$rootfs/etc/ssl/certs" "$rootfs/tmp" "$rootfs/var/lib/ringtrain" \
  "$rootfs/var/lib/ringtrain-agent" "$rootfs/proc" "$rootfs/dev" "$rootfs/sys" "$rootfs$datasets"
chmod 1777 "$rootfs/tmp"
say "assembling the root filesystem in $rootfs"
strip -o "$rootfs/usr/local/bin/ringtrain" "$binary"
cp -a "$libtorch/lib/." "$lib/"
cp "$datasets"/*.gz "$rootfs$datasets/"
cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"

# Every library the binary and libtorch load, where the loader finds them on this machine (links followed,
# kept under the name asked for), and the loader itself.
copy_lib() {
  local path="$1"
  [ -e "$rootfs$path" ] && return 0
  mkdir -p "$rootfs$(dirname "$path")"
  cp -L "$path" "$rootfs$path"
}
# CUDA libraries go into the libtorch folder (the image's library path) rather than a copy of site-packages;
# twice round, so the libraries those bring are resolved too.
export LD_LIBRARY_PATH="$lib:$nvidia_libs"
for _ in 1 2; do
  for object in "$rootfs/usr/local/bin/ringtrain" "$lib"/*.so*; do
    while read -r path; do
      case "$path" in
        "$lib"/*) ;;
        */nvidia/*/lib/*) [ -e "$lib/$(basename "$path")" ] || cp -L "$path" "$lib/" ;;
        /*) copy_lib "$path" ;;
      esac
    done < <(ldd "$object" | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (.*/\1/p')
  done
done
loader=$(ldd "$rootfs/usr/local/bin/ringtrain" | sed -n 's/^[[:space:]]*\(\/[^ ]*ld-linux[^ ]*\) .*/\1/p' | head -1)
copy_lib "$loader"

cat > "$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
ringtrain:x:10001:10001:ringtrain server:/var/lib/ringtrain:/usr/sbin/nologin
ringtrain-rank:x:10002:10002:ringtrain tenant code:/nonexistent:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
cat > "$rootfs/etc/group" <<'EOF'
root:x:0:
ringtrain:x:10001:
ringtrain-rank:x:10002:
nogroup:x:65534:
EOF
chown 10001:10001 "$rootfs/var/lib/ringtrain"
chmod 0700 "$rootfs/var/lib/ringtrain" "$rootfs/var/lib/ringtrain-agent"

cat > "$work/Containerfile" <<EOF
FROM scratch
COPY rootfs/ /
ENV LD_LIBRARY_PATH=/usr/local/lib/ringtrain/libtorch/lib \\
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \\
    RINGTRAIN_RANK_USER=ringtrain-rank
LABEL org.opencontainers.image.title="ringtrain" \\
      org.opencontainers.image.description="Training as a service: server, node agent and ranks ($variant libtorch)"
ENTRYPOINT ["/usr/local/bin/ringtrain"]
CMD ["--help"]
EOF
say "building $tag with podman"
podman build -q --tag "$tag" --file "$work/Containerfile" "$work" >/dev/null
say "$tag ($variant): $(podman image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}')"
echo "$tag"
