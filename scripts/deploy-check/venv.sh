#!/usr/bin/env bash
# The Python tool of tests/deploy.rs, pinned, in a virtual environment in the cache (made once):
# kubernetes-validate, which checks rendered manifests against the Kubernetes API's schemas offline (it
# carries them), and PyYAML with it. Prints the environment's folder.
set -euo pipefail
# shellcheck source=../common.sh
source "$(dirname "$0")/../common.sh"
VALIDATE_VERSION=1.37.0
tool_venv "kubernetes-validate-$VALIDATE_VERSION" "kubernetes-validate==$VALIDATE_VERSION" "PyYAML>=6,<7"
