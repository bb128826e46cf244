#!/usr/bin/env bash
# Every test: installs what is missing (libtorch, the data set, Postgres if none answers), builds the whole
# workspace against the real libtorch and runs all tests. cargo's target folder lives in the per-user cache
# ($RINGTRAIN_CACHE/target), so a later run rebuilds only what changed. Extra arguments go to the runner.
source "$(dirname "$0")/lib.sh"
# shellcheck source=postgres.sh
source "$ROOT/scripts/postgres.sh"
ensure_postgres
say "DATABASE_URL=$DATABASE_URL"
# A full disk fails whichever test happens to write next (once the image test's podman layer, 2026-12-07),
# which says nothing of the code. Below 15 GiB free, cargo's incremental caches go first (only a speed-up:
# ~8 GiB after a workspace build) with the image tests' leftovers of runs that were killed; the space left is
# printed, so a failure for want of it reads as such.
free_gib() { df -P -BG "$1" | awk 'NR == 2 { sub("G", "", $4); print $4 }'; }
mkdir -p "$CARGO_TARGET_DIR"
if [ "$(free_gib "$CARGO_TARGET_DIR")" -lt 15 ]; then
  say "only $(free_gib "$CARGO_TARGET_DIR") GiB free: removing cargo's incremental caches and old test images"
  rm -rf "$CARGO_TARGET_DIR"/*/incremental
  if command -v podman >/dev/null; then
    podman images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/ringtrain-image-test:' | xargs -r podman rmi -f >/dev/null || true
  fi
fi
say "free disk: $(free_gib "$CARGO_TARGET_DIR") GiB where cargo builds, $(free_gib "${TMPDIR:-/tmp}") GiB for temporary files"
# Only `worker` (and the binary) may link libtorch: the server side and the node agent build and test without it.
say "checking that only ringtrain-worker links libtorch (cargo tree; the first time cargo also fetches the crates)..."
for crate in ringtrain-core ringtrain-protocol ringtrain-store ringtrain-scheduler ringtrain-api ringtrain-client ringtrain-agent ringtrain-sandbox ringtrain-data ringtrain-slurm ringtrain-bench; do
  if cargo tree -q -p "$crate" -e normal,build --prefix none | grep -q '^torch-sys '; then
    say "error: $crate depends on libtorch (torch-sys); only ringtrain-worker may"; exit 1
  fi
done
# Benchmarks live in ringtrain-bench (bench/), not in the libraries the product is made of.
say "checking that no library crate declares a bench module..."
if grep -nE '^[[:space:]]*(pub(\([a-z]+\))? )?mod bench\b' "$ROOT"/*/src/lib.rs; then
  say "error: a library declares a bench module (above); benchmarks go into bench/ (ringtrain-bench)"; exit 1
fi
# The rank's JPEG shims against damaged files, under AddressSanitizer (a tenant's shards are hostile).
say "damaged JPEGs against the decoding shims under AddressSanitizer (scripts/fuzz-jpeg.sh)..."
"$ROOT/scripts/fuzz-jpeg.sh"
# The S3 server tests/buckets.rs trains from.
RINGTRAIN_S3S_FS="$("$ROOT/scripts/s3-server.sh")"
export RINGTRAIN_S3S_FS
# The API document against a running server: Schemathesis, every check (a failure fails the run, after
# the tests below have run too).
schemathesis=0
say "Schemathesis: building ringtrain (debug; the first, clean build takes many minutes on 2 cores) and checking the API against its document..."
"$ROOT/scripts/schemathesis/run.sh" || schemathesis=1
say "building the tests and running them (a first run of test.sh took 13 minutes on 2 cores for a fresh clone once apt, libtorch and the dependencies were cached (2026-12-02); later runs rebuild only what changed)..."
if cargo nextest --version >/dev/null 2>&1; then
  # doc tests first (nextest does not run them), so the run ends with nextest's summary of every test
  say "the doc tests first, then every test with cargo-nextest"
  cargo test --workspace --doc --quiet
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
if [ "$schemathesis" -ne 0 ]; then
  say "error: schemathesis failed (its report is above the tests')"
  exit 1
fi
say "done: Schemathesis and every test passed"
