#!/usr/bin/env bash
# The Python tools of tests/python_client.rs, pinned, in a virtual environment in the cache (made once):
# openapi-python-client, which generates a client from /openapi.json, and what the generated client imports
# (httpx, attrs, python-dateutil). Prints the environment's folder.
set -euo pipefail
# shellcheck source=../common.sh
source "$(dirname "$0")/../common.sh"
GENERATOR_VERSION=0.29.1
tool_venv "openapi-python-client-$GENERATOR_VERSION" "openapi-python-client==$GENERATOR_VERSION" "python-dateutil>=2.8,<3"
