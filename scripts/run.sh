#!/usr/bin/env bash
# The main job on a fresh machine: install libtorch and the data set (once), build ringtrain (release), start
# `ringtrain up` (the server on the embedded SQLite database, the scheduler, and a local agent offering this
# machine's devices), submit examples/fashion-mnist-lenet5.json over HTTP exactly as a user would with curl,
# follow it with `ringtrain jobs watch`, print the result, and stop the server.
#
#   RINGTRAIN_SPEC=FILE     another job spec (default examples/fashion-mnist-lenet5.json)
#   RINGTRAIN_KEEP_UP=1     leave the server running afterwards (Ctrl-C stops it)
#   RINGTRAIN_LISTEN, RINGTRAIN_DATA_DIR   as for `ringtrain up` (default 127.0.0.1:8080, $RINGTRAIN_CACHE/up)
# Extra arguments go to `ringtrain up` (e.g. --cpus 4).
source "$(dirname "$0")/lib.sh"
say "building ringtrain (release; a first, clean build takes many minutes on a small machine, later ones seconds)..."
cargo build --release --quiet --bin ringtrain
ringtrain="$CARGO_TARGET_DIR/release/ringtrain"
spec="${RINGTRAIN_SPEC:-examples/fashion-mnist-lenet5.json}"
export RINGTRAIN_LISTEN="${RINGTRAIN_LISTEN:-127.0.0.1:8080}"
export RINGTRAIN_DATA_DIR="${RINGTRAIN_DATA_DIR:-$RINGTRAIN_CACHE/up}"
url="http://$RINGTRAIN_LISTEN"
mkdir -p "$RINGTRAIN_DATA_DIR"
log="$RINGTRAIN_DATA_DIR/up.log"

say "starting ringtrain up (server, scheduler and a local agent; its log: $log)..."
"$ringtrain" up "$@" >"$log" 2>&1 &
up_pid=$!
stop() { kill "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; }
trap stop EXIT
for _ in $(seq 1 100); do
  grep -q '^ringtrain is up' "$log" && break
  kill -0 "$up_pid" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.2
done
grep -q '^ringtrain is up' "$log" || { cat "$log"; say "error: ringtrain up did not come up"; exit 1; }
sed -n '/^ringtrain is up/,$p' "$log" | sed '/^$/q'
export RINGTRAIN_TOKEN="${RINGTRAIN_BOOTSTRAP_TOKEN:-$(cat "$RINGTRAIN_DATA_DIR/admin-token")}"

echo "the web page: $url/ (sign in with the token in $RINGTRAIN_DATA_DIR/admin-token)"
echo "\$ curl -s -H 'Authorization: Bearer ...' -H 'Content-Type: application/json' --data @$spec $url/v1/jobs"
job=$(curl -sS --fail-with-body -H "Authorization: Bearer $RINGTRAIN_TOKEN" -H 'Content-Type: application/json' \
  --data @"$spec" "$url/v1/jobs")
id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' <<<"$job")
echo "job $id queued; the server log is $log"
echo "\$ ringtrain jobs watch $id"
status=0
say "training; the progress bar below follows the job until it ends"
"$ringtrain" jobs watch "$id" --server "$url" || status=$?

final=$(curl -sS -H "Authorization: Bearer $RINGTRAIN_TOKEN" "$url/v1/jobs/$id")
python3 - "$final" <<'PY'
import json, sys
job = json.loads(sys.argv[1])
r = job.get("result") or {}
eff = job.get("effective") or {}
print(f"\njob {job['id']}: {job['state']} (attempt {job['attempt']}, {job['preemptions']} preemptions)")
print(f"  k = {job['workers']}, kn = {eff.get('global_batch')}, lr {eff.get('scaled_lr')} reached after "
      f"{eff.get('warmup_iterations')} warmup iterations")
for e in r.get("epochs", []):
    print(f"  epoch {e['epoch']}: train loss {e['train_loss']:.4f}, train error {e['train_error']:.4f}, "
          f"test error {e['test_error']:.4f}")
if r:
    print(f"  final test error {r['final_test_error']:.4f}, {r['samples_per_s']:.0f} samples/s, "
          f"{100 * r['communication_fraction']:.1f}% of step time in all-reduce, {r['wall_seconds']:.0f} s")
PY
echo "  the whole job: curl -s -H \"Authorization: Bearer \$RINGTRAIN_TOKEN\" $url/v1/jobs/$id (token in $RINGTRAIN_DATA_DIR/admin-token)"
if [[ "${RINGTRAIN_KEEP_UP:-0}" == 1 ]]; then
  echo "ringtrain is still up at $url (Ctrl-C stops it)"
  trap - EXIT
  wait "$up_pid"
fi
exit "$status"
