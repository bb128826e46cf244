# Shell helpers shared by the scripts (sourced, not run).

say() { echo "$(basename "$0"): $*" >&2; }

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Installs the Debian packages that are missing; apt-get update at most once per script run.
APT_UPDATED=0
apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  if [ "$APT_UPDATED" -eq 0 ]; then as_root apt-get update -qq; APT_UPDATED=1; fi
  # shellcheck disable=SC2086 # APT_OPTIONS: options, split on purpose
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${APT_OPTIONS:-} "${missing[@]}" >/dev/null
}

# The cache of libtorch, the cargo target folder and the tools (RINGTRAIN_CACHE wins). For root it is
# system-wide, /var/cache/ringtrain: ranks and model checks run as the unprivileged ringtrain-rank account
# there, and must be able to execute the ringtrain binary and load libtorch, which ~root (0700) would hide.
default_cache() {
  if [ "$(id -u)" -eq 0 ]; then echo /var/cache/ringtrain; else echo "${XDG_CACHE_HOME:-$HOME/.cache}/ringtrain"; fi
}

# A virtual environment in the cache with pinned PyPI packages, made once: `tool_venv NAME PACKAGE...`.
# Prints its folder.
tool_venv() {
  local venv="${RINGTRAIN_CACHE:-$(default_cache)}/$1"
  shift
  if [ ! -f "$venv/.complete" ]; then
    apt_install python3-venv
    say "installing $* into $venv (once)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "$@" >&2
    touch "$venv/.complete"
  fi
  echo "$venv"
}
