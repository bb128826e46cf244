#!/usr/bin/env bash
# Installs s3s-fs (the s3s project's file-backed S3 server, from crates.io) into the cache once and prints
# its path. tests/buckets.rs trains from a bucket it serves: a real S3 server over HTTP with signed
# requests, not a mock. Built with its own target folder in the cache (a few minutes on 2 cores, once).
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
version=0.14.1
root="${RINGTRAIN_CACHE:-$(default_cache)}/s3s-fs-$version"
if [ ! -x "$root/bin/s3s-fs" ]; then
  say "installing s3s-fs $version into $root (once; a few minutes on 2 cores)"
  CARGO_TARGET_DIR="$root/target" cargo install -q --locked s3s-fs --version "$version" --features binary \
    --root "$root" >&2
  rm -rf "$root/target"
fi
echo "$root/bin/s3s-fs"
