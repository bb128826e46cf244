#!/usr/bin/env bash
# Installs what ringtrain needs to build and run, idempotently, and writes the environment that cargo and the
# binary need to "$RINGTRAIN_CACHE/env.sh". Quiet when everything is already in place.
#
#   RINGTRAIN_CACHE   the cache (default: ${XDG_CACHE_HOME:-~/.cache}/ringtrain, /var/cache/ringtrain for root); holds libtorch and the
#                     cargo target folder, so fresh clones and CI on the same machine reuse both.
#   LIBTORCH          use this libtorch instead (a folder with include/ and lib/); nothing is downloaded.
#   RINGTRAIN_GPU=0|1 force the CPU or the GPU set-up (default: GPU when nvidia-smi sees a device).
#
# CPU machines get a *minimal* libtorch (~1 GB on disk, ~545 MB downloaded) assembled from PyPI's
# torch==2.11.0 wheel, the only build tch 0.24 accepts: include/ and the four CPU libraries, plus the two small
# CUDA runtime libraries that libtorch_cpu.so lists as NEEDED even on a CPU. libtorch_cuda.so is deliberately
# left out: torch-sys links it whenever it is present, and it drags in gigabytes of CUDA libraries.
# GPU machines use a full torch 2.11.0 (the one python3 already has, else a pip install into the cache).
set -euo pipefail

CUDA_TOOLKIT_VERSION=13.0.2 # the cuda-toolkit pin in torch 2.11.0's wheel metadata
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
CACHE="${RINGTRAIN_CACHE:-$(default_cache)}"
mkdir -p "$CACHE"
# TORCH_VERSION, python3_torch and venv_torch (shared with device/build-gpu-binary.sh)
# shellcheck source=torch.sh
source "$(dirname "${BASH_SOURCE[0]}")/torch.sh"

have_gpu() {
  case "${RINGTRAIN_GPU:-auto}" in
    1) return 0 ;; 0) return 1 ;;
  esac
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

# --- libtorch ---------------------------------------------------------------------------------------------
cpu_libtorch() {
  local dest="$CACHE/libtorch-$TORCH_VERSION"
  if [ -f "$dest/.complete" ]; then echo "$dest"; return; fi
  say "assembling a minimal CPU libtorch $TORCH_VERSION in $dest (once; ~545 MB download)"
  local work; work=$(mktemp -d "$CACHE/.libtorch-work.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
    -d "$work/wheels" "torch==$TORCH_VERSION" >&2
  python3 -m pip download -q --only-binary=:all: -d "$work/wheels" "cuda-toolkit[cudart,cupti]==$CUDA_TOOLKIT_VERSION" >&2
  local stage="$work/libtorch"
  mkdir -p "$stage/lib"
  (cd "$work" && unzip -q -o wheels/torch-*.whl 'torch/include/*' 'torch/lib/libtorch_cpu.so' 'torch/lib/libc10.so' \
    'torch/lib/libtorch.so' 'torch/lib/libgomp.so.1')
  mv "$work/torch/include" "$stage/include"
  mv "$work/torch/lib/"* "$stage/lib/"
  for whl in "$work"/wheels/nvidia_cuda_runtime-*.whl "$work"/wheels/nvidia_cuda_cupti-*.whl; do
    (cd "$work" && unzip -q -o "$whl" 'nvidia/cu13/lib/libcudart.so.13' 'nvidia/cu13/lib/libcupti.so.13' 2>/dev/null || true)
  done
  mv "$work/nvidia/cu13/lib/libcudart.so.13" "$work/nvidia/cu13/lib/libcupti.so.13" "$stage/lib/"
  # `-lgomp` from torch-sys needs the unversioned name.
  ln -sf libgomp.so.1 "$stage/lib/libgomp.so"
  echo "$TORCH_VERSION" >"$stage/build-version"
  rm -rf "$dest"
  mv "$stage" "$dest"
  touch "$dest/.complete"
  say "libtorch ready: $(du -sh "$dest" | cut -f1)"
  echo "$dest"
}

gpu_libtorch() {
  python3_torch || venv_torch
}

if [ -n "${LIBTORCH:-}" ]; then
  libtorch="$LIBTORCH"
elif have_gpu; then
  libtorch=$(gpu_libtorch)
else
  apt_install unzip
  libtorch=$(cpu_libtorch)
fi

# --- data sets and tools ----------------------------------------------------------------------------------
# Real Fashion-MNIST (60k/10k, gzip IDX) under /usr/share/datasets/fashion-mnist, trained on by the tests.
apt_install dataset-fashion-mnist
# libjpeg-turbo's static library and headers: sharded data sets' JPEGs are decoded by it, linked into the
# binary (data/build.rs), so nothing is installed on a worker or carried to a GPU machine.
apt_install libjpeg62-turbo-dev
# The web page's tests drive a real headless Chromium over WebDriver.
apt_install chromium chromium-driver
# tests/deploy.rs checks the systemd units with systemd-analyze (kubectl, for the Kubernetes manifests, is not
# in Debian: the test says so where it is missing).
apt_install systemd
# tests/image.rs builds the OCI image with podman (scripts/image.sh) and runs its root filesystem.
apt_install podman
# tests/multihost.rs partitions a host (a network namespace) with nft.
apt_install nftables
# tests/slurm.rs runs a real Slurm cluster (issue 46): the controller, the node daemon, the commands and
# munge, 22.05 on Debian 12 (14 MiB without the recommended extras; nothing is started by the install).
APT_OPTIONS=--no-install-recommends apt_install slurmctld slurmd slurm-client munge

# --- the account tenant code runs as -------------------------------------------------------------------
# Where the agent or the server runs as root, ranks and model checks run as this unprivileged account
# (ringtrain_sandbox), never as root: it owns nothing but the private folders the agent gives it.
if [ "$(id -u)" -eq 0 ] && ! id ringtrain-rank >/dev/null 2>&1; then
  say "creating the unprivileged account ringtrain-rank (tenant code runs as it)"
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ringtrain-rank
fi

# --- the environment --------------------------------------------------------------------------------------
env_file="$CACHE/env.sh"
new_env=$(cat <<EOF
# written by ringtrain scripts/setup.sh; source it before cargo
export RINGTRAIN_CACHE="$CACHE"
export LIBTORCH="$libtorch"
export LD_LIBRARY_PATH="$libtorch/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CARGO_TARGET_DIR="\${CARGO_TARGET_DIR:-$CACHE/target}"
EOF
)
if [ ! -f "$env_file" ] || [ "$(cat "$env_file")" != "$new_env" ]; then
  echo "$new_env" >"$env_file"
fi
echo "$env_file"
