# Sourced by test.sh: makes DATABASE_URL point at a Postgres that answers, for the tests that need one.
#   1. $DATABASE_URL, if it answers;
#   2. else 127.0.0.1:5432 (trust auth), if it answers;
#   3. else a throwaway cluster (Debian's postgresql: initdb + pg_ctl) in a temporary folder on a free port,
#      stopped when the script exits.
# Needs common.sh. RINGTRAIN_TEST_PG=throwaway forces 3 (to test this script). The tests themselves fail, never skip, when
# DATABASE_URL does not answer.

pg_answers() { pg_isready -q -d "$1" -t 3 >/dev/null 2>&1; }

start_throwaway_postgres() {
  apt_install postgresql
  local bindir; bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  local dir; dir=$(mktemp -d /tmp/ringtrain-pg.XXXXXX)
  local port; port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  local as=()
  # initdb refuses to run as root: run the cluster as the postgres system user then.
  if [ "$(id -u)" -eq 0 ]; then chown postgres "$dir"; as=(runuser -u postgres --); fi
  "${as[@]}" "$bindir/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
  "${as[@]}" "$bindir/pg_ctl" -s -D "$dir/data" -l "$dir/log" -w \
    -o "-h 127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=300" start
  # shellcheck disable=SC2064
  trap "${as[*]} '$bindir/pg_ctl' -s -D '$dir/data' -m immediate stop; rm -rf '$dir'" EXIT
  export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
  say "started a throwaway Postgres on port $port"
}

ensure_postgres() {
  local local_default="postgres://postgres@127.0.0.1:5432/postgres"
  command -v pg_isready >/dev/null 2>&1 || apt_install postgresql-client
  if [ "${RINGTRAIN_TEST_PG:-}" = throwaway ]; then
    start_throwaway_postgres
  elif [ -n "${DATABASE_URL:-}" ] && pg_answers "$DATABASE_URL"; then
    :
  elif pg_answers "$local_default"; then
    export DATABASE_URL="$local_default"
  else
    start_throwaway_postgres
  fi
}
