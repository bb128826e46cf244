#!/usr/bin/env bash
# Builds, on a machine without a GPU, the stripped release `ringtrain` that scripts/device/check.sh runs on a
# GPU machine, and leaves it in .device/ringtrain (git-ignored; carry that folder to the device), with the
# stripped `ringtrain-bench` beside it (no libtorch; check.sh's `shards` step makes its shards with it).
#
# - Links against the full torch 2.11.0 with its CUDA 13 wheels: python3's own when it is that version with
#   lib/libtorch_cuda.so, else the one scripts/setup.sh's GPU branch installs into
#   $RINGTRAIN_CACHE/torch-2.11.0-venv (once: ~3.5 GB downloaded; the same function, scripts/torch.sh).
#   RINGTRAIN_GPU_LIBTORCH=DIR uses another full torch folder (one with lib/libtorch_cuda.so).
# - Leaves the CPU set-up alone: $RINGTRAIN_CACHE/env.sh is not touched, LIBTORCH from the caller's
#   environment is ignored, and cargo builds into its own target folder, $RINGTRAIN_CACHE/target-gpu.
# - cargo runs under `flock /tmp/cargo.lock` (RINGTRAIN_CARGO_LOCK), so it never builds at the same time as
#   another build that takes the same lock.
# - Fails unless the binary lists libtorch_cuda.so as NEEDED (without it libtorch never registers CUDA and
#   `tch::Cuda::is_available()` is false; worker/rpath.rs keeps it), every library resolves, it starts on
#   this CPU machine, and the two binaries are under 60 MiB together (what the device machine takes in is
#   64 MiB in all).
#
# The binary's RUNPATH names this machine's torch/lib, which the GPU machine does not have: check.sh sets
# LD_LIBRARY_PATH from the device's own python3 torch (torch/lib and every nvidia/*/lib), which the loader
# searches before RUNPATH. libtorch_cuda.so finds its CUDA, cuDNN and NCCL libraries through its own RPATH
# ($ORIGIN/../../nvidia/...), so one copy of each is loaded, torch's own.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck source=../common.sh
source "$ROOT/scripts/common.sh"
CACHE="${RINGTRAIN_CACHE:-$(default_cache)}"
mkdir -p "$CACHE"
# shellcheck source=../torch.sh
source "$ROOT/scripts/torch.sh"

MAX_BYTES=$((60 << 20))
out="$ROOT/.device/ringtrain"
bench_out="$ROOT/.device/ringtrain-bench"
lock="${RINGTRAIN_CARGO_LOCK:-/tmp/cargo.lock}"
die() { say "error: $*"; exit 1; }

# --- the full torch ---------------------------------------------------------------------------------------
if [ -n "${RINGTRAIN_GPU_LIBTORCH:-}" ]; then
  torch="$RINGTRAIN_GPU_LIBTORCH"
else
  torch=$(python3_torch) && [ -f "$torch/lib/libtorch_cuda.so" ] || torch=$(venv_torch)
fi
[ -f "$torch/lib/libtorch_cuda.so" ] || die "$torch/lib/libtorch_cuda.so is missing: not a CUDA build of torch"
say "linking against $torch"

# --- build ------------------------------------------------------------------------------------------------
# Only what torch-sys and worker/rpath.rs read: this torch, no PyTorch discovery, no version bypass (the
# wheel's 2.11.0+cu130 passes torch-sys's check as it is).
unset LIBTORCH_USE_PYTORCH LIBTORCH_INCLUDE LIBTORCH_LIB LIBTORCH_STATIC LIBTORCH_BYPASS_VERSION_CHECK
export LIBTORCH="$torch"
export LD_LIBRARY_PATH="$torch/lib"
export CARGO_TARGET_DIR="$CACHE/target-gpu"
if ! flock -n "$lock" true; then say "waiting for another build to release $lock"; fi
start=$SECONDS
flock "$lock" cargo build --release -p ringtrain -p ringtrain-bench --bin ringtrain --bin ringtrain-bench
say "built in $((SECONDS - start)) s (target folder $CARGO_TARGET_DIR)"

# --- strip and check --------------------------------------------------------------------------------------
mkdir -p "$(dirname "$out")"
rm -f "$out" "$bench_out"
strip --strip-all -o "$out" "$CARGO_TARGET_DIR/release/ringtrain"
strip --strip-all -o "$bench_out" "$CARGO_TARGET_DIR/release/ringtrain-bench"
"$bench_out" --help >/dev/null || die "$bench_out does not start on this machine"

needed=$(readelf -d "$out" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "NEEDED: $(echo "$needed" | tr '\n' ' ')"
readelf -d "$out" | grep -E '\((RUNPATH|RPATH)\)' || true
echo "$needed" | grep -qx 'libtorch_cuda.so' \
  || die "$out does not list libtorch_cuda.so as NEEDED: CUDA would never be available (see worker/rpath.rs)"

unresolved=$(ldd "$out" | grep 'not found' || true)
[ -z "$unresolved" ] || die "libraries that do not resolve (LD_LIBRARY_PATH=$torch/lib):
$unresolved"
"$out" --help >/dev/null || die "$out does not start on this machine"

bytes=$(( $(stat -c %s "$out") + $(stat -c %s "$bench_out") ))
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
[ "$bytes" -lt "$MAX_BYTES" ] || die "$out and $bench_out are $mib MiB, over the 60 MiB the device check allows"
echo "ready: $out and $bench_out ($mib MiB together, stripped; libtorch_cuda.so NEEDED)"
echo "on the GPU machine: bash scripts/device/check.sh (carry .device)"
