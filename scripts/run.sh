#!/usr/bin/env bash
# The main job on a fresh machine: install libtorch and the data set (once), build ringtrain, and run it.
# For now that is the LR-schedule preview of Goyal's ResNet-50 example (k=256, n=32): the server and local
# workers (`ringtrain up`) replace it as they land. Extra arguments go to `ringtrain schedule`.
source "$(dirname "$0")/lib.sh"
cargo build --release --quiet --bin ringtrain
exec "$CARGO_TARGET_DIR/release/ringtrain" schedule --spec examples/goyal-resnet50-imagenet.json \
  --dataset-size 1281167 "$@"
