#!/usr/bin/env bash
# The API document must tell the truth (issue 12): Schemathesis (PyPI, pinned, installed into the cache
# once) runs every check against a `ringtrain serve` on a fresh SQLite data directory and must report no
# failure. Two passes: a platform admin's token over every route except revoking tokens (a stateful run
# would revoke the very token it runs with; api/tests/authorization.rs covers that route), and a node
# agent's token over /v1/agent. Per-operation exceptions, each with its reason: schemathesis.toml.
#
#   scripts/schemathesis/run.sh [RINGTRAIN_BINARY]     (default: the workspace's debug build)
source "$(dirname "$0")/../lib.sh"
SCHEMATHESIS_VERSION=4.32.5
here="$ROOT/scripts/schemathesis"
venv=$(tool_venv "schemathesis-$SCHEMATHESIS_VERSION" "schemathesis==$SCHEMATHESIS_VERSION")

binary="${1:-}"
if [ -z "$binary" ]; then
  cargo build -q -p ringtrain
  binary="$CARGO_TARGET_DIR/debug/ringtrain"
fi
data=$(mktemp -d)
admin="rt_schemathesis_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
log="$data/server.log"
# SQLite in the fresh data directory, never the DATABASE_URL the tests get (serve reads it from the
# environment); no per-token rate limit: the run sends hundreds of requests a second with one token
env -u DATABASE_URL RINGTRAIN_RATE_LIMIT=0 \
  "$binary" serve --listen 127.0.0.1:0 --data-dir "$data/server" --bootstrap-token "$admin" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$data"' EXIT
url=""
for _ in $(seq 1 100); do
  url=$(sed -n 's/^listening on \(.*\)$/\1/p' "$log" | head -1)
  [ -n "$url" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$log" >&2; say "error: the server did not start"; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { cat "$log" >&2; say "error: the server did not say where it listens"; exit 1; }
agent=$(curl -sf -X POST -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
  -d '{"label": "schemathesis"}' "$url/v1/agent-tokens" | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')

st() {
  # a fixed seed: the same cases every run, so a failure is reproducible and CI is not flaky
  "$venv/bin/st" --config-file "$here/schemathesis.toml" run "$url/openapi.json" --checks all \
    --max-examples 30 --seed 20261201 --no-color "$@"
}
status=0
say "schemathesis: every route as a platform admin"
st -H "Authorization: Bearer $admin" --exclude-path '/v1/tokens/{id}' || status=1
say "schemathesis: /v1/agent as a node agent"
st -H "Authorization: Bearer $agent" --include-path-regex '^/v1/agent/' || status=1
if [ "$status" -ne 0 ]; then
  say "error: schemathesis found the API answering other than its document says (see above)"
  tail -50 "$log" >&2
fi
exit "$status"
