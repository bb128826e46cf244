#!/usr/bin/env bash
# The main job on a fresh machine: install libtorch and the data set (once), build ringtrain (release), and
# train LeNet-5 on Fashion-MNIST with 2 local rank processes (k = 2, n = 32, Goyal's linear scaling and
# gradual warmup), printing metrics as JSON lines and the final result. The server and its local workers
# (`ringtrain up`) replace this as they land. Extra arguments go to `ringtrain train`.
source "$(dirname "$0")/lib.sh"
cargo build --release --quiet --bin ringtrain
out="${RINGTRAIN_RUN_OUT:-$RINGTRAIN_CACHE/runs/fashion-mnist-lenet5-$(date +%Y%m%d-%H%M%S)}"
"$CARGO_TARGET_DIR/release/ringtrain" train --spec examples/fashion-mnist-lenet5.json --local 2 --out "$out" "$@"
python3 - "$out/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"\nresult: {sys.argv[1]}")
for e in r["epochs"]:
    print(f"  epoch {e['epoch']}: train loss {e['train_loss']:.4f}, train error {e['train_error']:.4f}, test error {e['test_error']:.4f}")
print(f"final test error {r['final_test_error']:.4f}, {r['samples_per_s']:.0f} samples/s, "
      f"{100 * r['communication_fraction']:.1f}% of step time in all-reduce, {r['wall_seconds']:.0f} s")
PY
