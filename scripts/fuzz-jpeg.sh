#!/usr/bin/env bash
# Damaged JPEGs against the rank's decoding shims (data/csrc: jpeg_region.c, jpeg_huffman.c) under
# AddressSanitizer and UndefinedBehaviorSanitizer: data/csrc/fuzz_region.c makes its seeds with libjpeg,
# checks that jpeg_huffman.c decodes them to libjpeg's pixels, then decodes damaged copies, each in a
# buffer of exactly its size; any read or write outside a buffer, or undefined behaviour, fails the run.
# Called by scripts/test.sh; ROUNDS (per seed, 5 seeds) defaults to 5000 (about 12 seconds).
#
#   scripts/fuzz-jpeg.sh [ROUNDS]
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
libjpeg="${RINGTRAIN_LIBJPEG_DIR:-/usr/lib/x86_64-linux-gnu}/libjpeg.a"
[ -f "$libjpeg" ] || libjpeg="$(find /usr/lib /usr/lib64 /usr/local/lib -name libjpeg.a 2>/dev/null | head -1)"
[ -n "$libjpeg" ] || { say "error: libjpeg.a not found (libjpeg62-turbo-dev; scripts/setup.sh installs it)"; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cc -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
  "$ROOT/data/csrc/fuzz_region.c" "$ROOT/data/csrc/jpeg_region.c" "$ROOT/data/csrc/jpeg_huffman.c" \
  "$libjpeg" -o "$out/fuzz_region"
"$out/fuzz_region" "${1:-5000}"
