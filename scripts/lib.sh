# Sourced by run.sh and test.sh: installs what is missing (scripts/setup.sh) and loads its environment.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=common.sh
source "$ROOT/scripts/common.sh"
# shellcheck disable=SC1090
source "$("$ROOT/scripts/setup.sh")"
