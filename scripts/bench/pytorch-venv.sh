#!/usr/bin/env bash
# Prints the path of a Python with torch 2.11.0 for `ringtrain-bench pytorch --python`, installing it first
# when needed: python3's own torch when it is that version, else the full torch (with its CUDA wheels: PyPI
# ships 2.11.0 only so; ~3.5 GB once) in $RINGTRAIN_CACHE/torch-2.11.0-venv, the same virtual environment
# scripts/device/build-gpu-binary.sh links against (scripts/torch.sh). Idempotent.
#
#   ringtrain-bench pytorch --python "$(scripts/bench/pytorch-venv.sh)"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=../common.sh
source "$ROOT/scripts/common.sh"
CACHE="${RINGTRAIN_CACHE:-$(default_cache)}"
mkdir -p "$CACHE"
# shellcheck source=../torch.sh
source "$ROOT/scripts/torch.sh"

if python3_torch >/dev/null; then
  command -v python3
else
  venv_torch >/dev/null
  echo "$CACHE/torch-$TORCH_VERSION-venv/bin/python"
fi
