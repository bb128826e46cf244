# shellcheck shell=bash
# The full (CUDA) torch that GPU builds link against, shared by setup.sh and device/build-gpu-binary.sh
# (sourced, not run). Needs CACHE, and say() and apt_install() from common.sh.

TORCH_VERSION=2.11.0 # the one PyTorch release tch 0.24 accepts; PyPI ships it as a CUDA 13 build only
TORCH_PROBE="import torch, os; print(torch.__version__.split('+')[0], os.path.dirname(torch.__file__))"

# Prints the torch folder (.../site-packages/torch) of python3's own torch when it is $TORCH_VERSION, else
# fails.
python3_torch() {
  local found
  found=$(python3 -c "$TORCH_PROBE" 2>/dev/null) && [ "${found%% *}" = "$TORCH_VERSION" ] || return 1
  echo "${found#* }"
}

# Installs the full torch==$TORCH_VERSION with its CUDA 13 wheels into a virtual environment in the cache
# (once: ~3.5 GB) and prints its torch folder.
venv_torch() {
  local venv="$CACHE/torch-$TORCH_VERSION-venv"
  if [ ! -f "$venv/.complete" ]; then
    say "installing the full torch==$TORCH_VERSION (CUDA) into $venv (once; ~3.5 GB)"
    # Debian's python3 makes virtual environments only with python3-venv installed.
    python3 -c 'import ensurepip' 2>/dev/null || apt_install python3-venv
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "torch==$TORCH_VERSION" >&2
    touch "$venv/.complete"
  fi
  "$venv/bin/python" -c "$TORCH_PROBE" | cut -d' ' -f2-
}
