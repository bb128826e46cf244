# Sourced by run.sh and test.sh: installs what is missing (scripts/setup.sh) and loads its environment.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=common.sh
source "$ROOT/scripts/common.sh"
[ -f "${RINGTRAIN_CACHE:-$(default_cache)}/env.sh" ] ||
  say "first run on this machine: setting up libtorch, the data set and the tools (setup.sh says what it downloads)..."
# shellcheck disable=SC1090
source "$("$ROOT/scripts/setup.sh")"
