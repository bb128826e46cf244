#!/usr/bin/env bash
# The one-GPU device check (issue 10, item 10): run from the repository root on a machine with one GPU, no Rust
# and no network, whose python3 has torch 2.11.0+cu130:
#
#   bash scripts/device/check.sh
#
# It needs .device/ringtrain (and .device/ringtrain-bench for the `shards` step), built on a CPU machine by
# scripts/device/build-gpu-binary.sh. Every step is
# bounded, logs under $OUT (10 small files: env, nccl, faults, equivalence, pipeline, sandbox, resnet50, shards and up
# logs, and table.md), and the script ends by printing the table of all steps (also $OUT/table.md). A failed step never
# stops the others. Steps, cheapest and most telling first:
#   env          GPU, python torch/NCCL/cuDNN versions, every library of the binary resolves
#   doctor       `ringtrain doctor` and `doctor --json`: CUDA available, NCCL loadable
#   nccl-world1  NCCL all-reduce, world 1: 1, 16 and 256 MB exact
#   nccl-dup     two ranks on the one GPU without NCCL_HOSTID: both fail fast with "Duplicate GPU"
#   nccl-hostid  two ranks on the one GPU as two NCCL "hosts" (--share-gpu-for-tests): 1 and 64 MB exact
#   equivalence  LeNet-5 k=2, one epoch: NCCL and the ring against --virtual-ranks 2, loss within 1e-4 rel.
#   pipeline     ResNet-20 cut after layer2 and the composite multi-input example on 2 stages, 2 workers × 2
#                stage processes on the one GPU, against 2 unsplit processes: loss within 1e-4 rel. (issue 48)
#   sandbox      the same NCCL run with both ranks confined as agents confine them (--sandbox-dir): NCCL
#                initialises and trains under the sandbox's Unix-socket rules (issue 53)
#   crash        rank 1 aborts at iteration 20: rank 0 exits non-zero within the comm timeout, saying why
#   sigstop      rank 1 is stopped (SIGSTOP) mid-training: the same
#   resnet50     ResNet-50 img/s, bf16 and fp32, batch 64 and 128: ringtrain against PyTorch eager
#   up           `ringtrain up --gpus all` runs a ResNet-20 job submitted with curl to `succeeded`
#   share        ResNet-50 bf16 k=2 on the one GPU (NCCL over loopback sockets): all-reduce share of a step
#   overlap      the same with the all-reduce overlapped with backward (--overlap on: NCCL on a stream of its
#                own, started bucket by bucket from gradient hooks): bit-level sums are not compared here
#                (training.rs does that on CPUs); img/s and the exposed all-reduce against the share step's
#   input        ResNet-50 bf16 batch 128: batches gathered on the GPU (data set kept there) against copied
#                from the host each step (--data host)
#   shards       ResNet-50 bf16 batch 128 trained from JPEG shards (synthetic ImageNet-sized photographs packed
#                here, 12 loader threads) against the resnet50-bf16-b128 step's synthetic in-memory img/s
#
#   OUT               where logs and the table go (default /tmp/ringtrain-check-out)
#   CHECK_STEPS=a,b   run only these steps (for a rerun); CHECK_BUDGET_S (default 450) bounds the whole
#                     run: a step that no longer fits is skipped and says so
#   RINGTRAIN_BIN     another binary (default .device/ringtrain)
#   RINGTRAIN_BENCH_BIN  another ringtrain-bench (default .device/ringtrain-bench; the `shards` step's)
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
B="${RINGTRAIN_BIN:-$ROOT/.device/ringtrain}"
RB="${RINGTRAIN_BENCH_BIN:-$ROOT/.device/ringtrain-bench}"
OUT="${OUT:-${TMPDIR:-/tmp}/ringtrain-check-out}"
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ringtrain-check.XXXXXX")
PARSE=(python3 "$ROOT/scripts/device/parse.py")
EAGER="$ROOT/scripts/device/resnet50_eager.py"
BUDGET=${CHECK_BUDGET_S:-450}
START=$SECONDS
RESULTS="$WORK/results.tsv"
R50="$WORK/resnet50.tsv"
: >"$RESULTS"
: >"$R50"
rm -f "$OUT"/{env,nccl,faults,equivalence,sandbox,resnet50,shards,up}.log "$OUT/table.md"
ulimit -c 0 # an aborted rank (the crash step) must not write a core dump of a CUDA process
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export RUST_BACKTRACE=0

# --- helpers ----------------------------------------------------------------------------------------------
cleanup() { # the background processes this script started and that still run, then its scratch folder
  local pid
  for pid in $(jobs -p); do kill -9 "$pid" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

now_ms() { date +%s%3N; }
left() { echo $((BUDGET - (SECONDS - START))); }
# bound T: T seconds, or what is left of the budget if less (at least 1).
bound() { local l; l=$(left); l=$((l < $1 ? l : $1)); echo $((l > 1 ? l : 1)); }
# want STEP: whether CHECK_STEPS (if set) names the step or a prefix of it (nccl: nccl-world1, nccl-dup, ...).
want() {
  local item
  [ -z "${CHECK_STEPS:-}" ] && return 0
  for item in ${CHECK_STEPS//,/ }; do [[ "$1" == "$item" || "$1" == "$item"-* ]] && return 0; done
  return 1
}
record() { # step status seconds figures
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(echo "$4" | tr '\t\n' '  ')" >>"$RESULTS"
  echo "check: $1: $2 ($3 s) $4"
}
# append LOG TITLE FILE: FILE's text under a heading, at most ~16 KB of it (head and tail).
append() {
  local log="$OUT/$1.log" size
  { echo "### $2"; } >>"$log"
  [ -f "$3" ] || { echo "(no output)" >>"$log"; return; }
  size=$(stat -c %s "$3")
  if [ "$size" -le 16384 ]; then cat "$3" >>"$log"
  else { head -c 4096 "$3"; echo; echo "[... $((size - 16384)) bytes cut ...]"; tail -c 12288 "$3"; } >>"$log"; fi
  echo >>"$log"
}
note() { echo "$2" >>"$OUT/$1.log"; }
# run_step NAME NEEDED_S FUNCTION: runs FUNCTION unless CHECK_STEPS leaves it out or fewer than NEEDED_S
# seconds of the budget are left; FUNCTION sets STATUS and FIG.
run_step() {
  local name=$1 need=$2 fn=$3 t0
  want "$name" || return 0
  if [ "$(left)" -lt "$need" ]; then record "$name" SKIP 0 "budget: $(left) s left, needs ~$need s"; return 0; fi
  STATUS=FAIL FIG=""
  t0=$(now_ms)
  echo "check: $name ..."
  "$fn"
  record "$name" "$STATUS" "$(awk -v a="$t0" -v b="$(now_ms)" 'BEGIN { printf "%.1f", (b - a) / 1000 }')" "$FIG"
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# start_bg LOGFILE [VAR=VALUE...] COMMAND...: starts it in the background (env execs it, so $! is the
# command's own pid); sets BG_PID.
start_bg() {
  local log=$1; shift
  env "$@" >"$log" 2>&1 &
  BG_PID=$!
}
# wait_until PID DEADLINE_MS: waits for PID to exit; kills it at the deadline. Sets WAIT_RC (124: killed).
wait_until() {
  local pid=$1 deadline=$2
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$(now_ms)" -ge "$deadline" ]; then
      kill -9 "$pid" 2>/dev/null
      { wait "$pid"; } 2>/dev/null
      WAIT_RC=124
      return
    fi
    sleep 0.1
  done
  { wait "$pid"; } 2>/dev/null
  WAIT_RC=$?
}
# judge PARSE-ARGS...: sets STATUS and FIG from parse.py's `STATUS<TAB>figures` line (FAIL when it says nothing).
judge() {
  IFS=$'\t' read -r STATUS FIG < <("${PARSE[@]}" "$@")
  STATUS=${STATUS:-FAIL}
}
# names_cause FILE: whether one of ringtrain's own error lines in FILE (not NCCL's log lines) says who or what.
names_cause() {
  grep -iE 'error' "$1" 2>/dev/null | grep -vE 'NCCL (WARN|INFO)' | grep -qiE 'rank 1|peer|nccl|timed out|timeout'
}
first_error() { grep -m1 -iE 'error|panic|fail|timed out|abort' "$1" 2>/dev/null | cut -c1-300; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1000 }'; }

# The environment of one rank of two sharing the GPU as two NCCL "hosts" (what --share-gpu-for-tests sets,
# src/commands/launch.rs).
share_env() {
  echo CUDA_VISIBLE_DEVICES=0 NCCL_HOSTID="ringtrain-test-$1" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_NVLS_ENABLE=0
}

# --- the libraries: the binary's libtorch is the device's python torch -----------------------------------
LIBS=$(timeout 60 python3 - 2>"$WORK/libs.err" <<'PY'
import glob, os, torch
dirs = [os.path.join(os.path.dirname(torch.__file__), "lib")]
try:
    import nvidia
    for p in nvidia.__path__:
        dirs += sorted(glob.glob(os.path.join(p, "*", "lib")))
except ImportError:
    pass
print(":".join(d for d in dirs if os.path.isdir(d)))
PY
)
# A loader that asks for the unversioned name (cudarc's does) finds the same libnccl.so.2 as torch.
NCCL_SO=$(IFS=:; for d in $LIBS; do [ -e "$d/libnccl.so.2" ] && echo "$d/libnccl.so.2" && break; done)
if [ -n "$NCCL_SO" ]; then
  mkdir -p "$WORK/nccl-link" && ln -sf "$NCCL_SO" "$WORK/nccl-link/libnccl.so"
  LIBS="$LIBS:$WORK/nccl-link"
fi
[ -z "$LIBS" ] || export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# --- steps ------------------------------------------------------------------------------------------------
step_env() {
  local f="$WORK/env.out"
  {
    echo "binary: $(ls -l "$B" 2>&1)"
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    cat "$WORK/libs.err"
    echo "gpu: $(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)"
    timeout 60 python3 -c '
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "nccl", ".".join(map(str, torch.cuda.nccl.version())), "cudnn", torch.backends.cudnn.version())
for m in ("torchvision", "safetensors", "numpy"):
    try:
        print(m, __import__(m).__version__)
    except ImportError:
        print(m, "missing")'
    echo "ldd (libtorch, c10, cuda, nccl, not found):"
    ldd "$B" | grep -E 'torch|c10|cuda|nccl|not found'
  } >"$f" 2>&1
  append env "env" "$f"
  local gpu torch missing
  gpu=$(grep -m1 '^gpu: ' "$f" | cut -c6-90)
  torch=$(grep -m1 '^torch ' "$f")
  missing=$(grep -c 'not found' "$f")
  FIG="$gpu; $torch; $missing unresolved libraries"
  [ -x "$B" ] && [ "$missing" -eq 0 ] && grep -q 'available True' "$f" && STATUS=PASS
}

step_doctor() {
  local t; t=$(bound 30)
  timeout "$t" "$B" doctor >"$WORK/doctor.out" 2>&1
  local rc=$?
  append env "ringtrain doctor (rc $rc)" "$WORK/doctor.out"
  timeout "$t" "$B" doctor --json >"$WORK/doctor.json" 2>"$WORK/doctor.err"
  local rcj=$?
  append env "ringtrain doctor --json (rc $rcj)" "$WORK/doctor.json"
  append env "ringtrain doctor --json: stderr" "$WORK/doctor.err"
  judge doctor "$WORK/doctor.json"
  FIG="rc $rc/$rcj; $FIG"
  [ "$rc" -eq 0 ] && [ "$rcj" -eq 0 ] || STATUS=FAIL
}

step_nccl_world1() {
  local f="$WORK/nccl1.out"
  timeout "$(bound 60)" "$B" bench allreduce --backend nccl --world 1 --sizes 1MB,16MB,256MB --json >"$f" 2>&1
  local rc=$?
  append nccl "bench allreduce --backend nccl --world 1 (rc $rc)" "$f"
  judge allreduce "$f" 1 1MB,16MB,256MB
  [ "$rc" -eq 0 ] || { STATUS=FAIL; FIG="rc $rc: $(first_error "$f"); $FIG"; }
}

step_nccl_dup() {
  local port t0 deadline rc0 rc1 t_end dup own r
  port=$(free_port)
  t0=$(now_ms)
  deadline=$((t0 + 1000 * $(bound 90)))
  local pids=()
  for r in 0 1; do
    start_bg "$WORK/dup$r.out" -u NCCL_HOSTID CUDA_VISIBLE_DEVICES=0 "$B" bench allreduce --backend nccl \
      --rank "$r" --world 2 --rendezvous "127.0.0.1:$port" --sizes 1MB --join-timeout-s 30
    pids+=("$BG_PID")
  done
  wait_until "${pids[0]}" "$deadline"; rc0=$WAIT_RC
  wait_until "${pids[1]}" "$deadline"; rc1=$WAIT_RC
  t_end=$(now_ms)
  append nccl "two ranks on one GPU, no NCCL_HOSTID: rank 0 (rc $rc0)" "$WORK/dup0.out"
  append nccl "two ranks on one GPU, no NCCL_HOSTID: rank 1 (rc $rc1)" "$WORK/dup1.out"
  dup=no; grep -qi 'duplicate gpu' "$WORK/dup0.out" "$WORK/dup1.out" && dup=yes
  own=no; grep -iE 'error' "$WORK/dup0.out" "$WORK/dup1.out" | grep -v 'NCCL WARN' | grep -qi 'duplicate gpu' && own=yes
  FIG="rc $rc0/$rc1 after $(secs "$t0" "$t_end") s; 'Duplicate GPU' in the logs: $dup, in ringtrain's error: $own"
  [ "$rc0" -ne 0 ] && [ "$rc1" -ne 0 ] && [ "$rc0" -ne 124 ] && [ "$rc1" -ne 124 ] && [ "$dup" = yes ] \
    && STATUS=PASS
  [ "$STATUS" = PASS ] || FIG="$FIG; $(first_error "$WORK/dup0.out")"
}

step_nccl_hostid() {
  local f="$WORK/hostid.out"
  timeout "$(bound 90)" "$B" bench allreduce --backend nccl --world 2 --share-gpu-for-tests --sizes 1MB,64MB \
    --json >"$f" 2>&1
  local rc=$?
  append nccl "bench allreduce --backend nccl --world 2 --share-gpu-for-tests (rc $rc)" "$f"
  judge allreduce "$f" 2 1MB,64MB
  [ "$rc" -eq 0 ] || { STATUS=FAIL; FIG="rc $rc: $(first_error "$f"); $FIG"; }
}

# LeNet-5 on synthetic data, k = 2; $1 epochs, $2 log every, $3 samples.
lenet_spec() {
  cat <<EOF
{"name": "device-check", "model": {"name": "lenet5"}, "dataset": "synthetic:$3", "workers": 2,
 "per_worker_batch": 32, "epochs": $1,
 "lr": {"base": 0.05, "reference_batch": 64, "warmup": {"kind": "none"}, "decay": {"kind": "none"}},
 "seed": 1, "log_every_iterations": $2, "checkpoint_every_epochs": 0, "device": "gpu"}
EOF
}

step_equivalence() {
  local spec="$WORK/equivalence.json" rc name
  lenet_spec 1 1 4096 >"$spec"
  note equivalence "spec: $(tr -d '\n' <"$spec")"
  local -A args=(
    [nccl]="--local 2 --share-gpu-for-tests --collective nccl"
    [virtual]="--local 1 --virtual-ranks 2"
    [ring]="--local 2 --share-gpu-for-tests --collective ring"
  )
  local rcs=""
  for name in nccl virtual ring; do
    # shellcheck disable=SC2086 # the flags split on purpose
    timeout "$(bound 60)" "$B" train --spec "$spec" ${args[$name]} >"$WORK/eq-$name.out" 2>"$WORK/eq-$name.err"
    rc=$?
    rcs="$rcs $name=$rc"
    append equivalence "train ${args[$name]} (rc $rc): stderr" "$WORK/eq-$name.err"
    tail -n 4 "$WORK/eq-$name.out" >"$WORK/eq-$name.tail"
    append equivalence "train ${args[$name]}: the last metric lines" "$WORK/eq-$name.tail"
  done
  judge equivalence "$WORK/eq-nccl.out" "$WORK/eq-virtual.out" "$WORK/eq-ring.out"
  FIG="rc$rcs; $FIG"
  [[ "$rcs" == " nccl=0 virtual=0 ring=0" ]] || STATUS=FAIL
}

# Pipeline stages on the GPU (issue 48): ResNet-20 cut after layer2, 2 workers × 2 stage processes on the
# one GPU (activations and gradients between stages through host memory; each stage's gradients summed over
# the TCP ring), against 2 unsplit processes; and the composite multi-input example (four TorchScript
# modules, loaded from the archive onto the GPU) placed on 2 stages against the same unsplit. Per-iteration
# loss within the equivalence step's tolerance.
step_pipeline() {
  local rcs="" rc name upload="00000000-0000-4000-8000-000000000048"
  cat >"$WORK/pipeline-resnet.json" <<SPEC
{"name": "device-check-pipeline", "model": {"name": "resnet20"}, "dataset": "synthetic:1024", "workers": 4,
 "per_worker_batch": 32, "epochs": 1, "seed": 1, "log_every_iterations": 1, "checkpoint_every_epochs": 0,
 "lr": {"base": 0.1, "reference_batch": 128, "warmup": {"kind": "gradual", "epochs": 0.5}, "decay": {"kind": "none"}},
 "device": "gpu"}
SPEC
  cat >"$WORK/pipeline-composite.json" <<SPEC
{"name": "device-check-composite", "model": {"uploaded": "$upload"}, "dataset": "$upload", "workers": 4,
 "per_worker_batch": 32, "train_samples": 1024, "epochs": 1, "seed": 1, "log_every_iterations": 1,
 "checkpoint_every_epochs": 0, "device": "gpu",
 "lr": {"base": 0.05, "reference_batch": 128, "warmup": {"kind": "gradual", "epochs": 0.5}, "decay": {"kind": "none"}}}
SPEC
  local placement='"devices_per_worker": 2, "placement": {"stages": [["encode_numeric", "encode_sequence"], ["encode_set", "head"]]},'
  sed "s/\"workers\": 4,/\"workers\": 4, $placement/" "$WORK/pipeline-composite.json" >"$WORK/pipeline-composite-split.json"
  local files="--model-file examples/multi-input/composite.tar --dataset-file examples/multi-input/data.safetensors"
  files="$files --model-inputs numeric,tokens,tokens_mask,set,set_mask"
  local -A runs=(
    [resnet-unsplit]="--spec $WORK/pipeline-resnet.json --local 2"
    [resnet-split]="--spec $WORK/pipeline-resnet.json --local 4 --pipeline-cuts layer2"
    [composite-unsplit]="--spec $WORK/pipeline-composite.json --local 2 $files"
    [composite-split]="--spec $WORK/pipeline-composite-split.json --local 4 $files"
  )
  for name in resnet-unsplit resnet-split composite-unsplit composite-split; do
    # shellcheck disable=SC2086 # the flags split on purpose
    timeout "$(bound 40)" "$B" train ${runs[$name]} --share-gpu-for-tests --collective ring \
      >"$WORK/pipe-$name.out" 2>"$WORK/pipe-$name.err"
    rc=$?
    rcs="$rcs $name=$rc"
    append pipeline "train ${runs[$name]} (rc $rc): stderr" "$WORK/pipe-$name.err"
  done
  judge pipeline "$WORK/pipe-resnet-split.out" "$WORK/pipe-resnet-unsplit.out" \
    "$WORK/pipe-composite-split.out" "$WORK/pipe-composite-unsplit.out"
  FIG="rc$rcs; $FIG"
  [[ "$rcs" == " resnet-unsplit=0 resnet-split=0 composite-unsplit=0 composite-split=0" ]] || STATUS=FAIL
}

# Both ranks confined as an agent confines them (--sandbox-dir; issue 53): Unix sockets only of the datagram
# kind NCCL's proxy binds, scoped to each rank; route netlink for NCCL's interface list; NCCL_CUMEM_ENABLE=0
# and NCCL_NVLS_ENABLE=0 set by the sandbox. LeNet-5 k = 2 over NCCL on the one GPU, one epoch.
step_sandbox() {
  local spec="$WORK/sandbox.json" private="$WORK/sandbox-private" out="$WORK/sandbox-out" rc confined
  lenet_spec 1 50 4096 >"$spec"
  mkdir -p "$private"
  timeout "$(bound 60)" "$B" train --spec "$spec" --local 2 --share-gpu-for-tests --collective nccl \
    --sandbox-dir "$private" --out "$out" >"$WORK/sandbox.out" 2>"$WORK/sandbox.err"
  rc=$?
  append sandbox "train --local 2 --share-gpu-for-tests --collective nccl --sandbox-dir (rc $rc): stderr" \
    "$WORK/sandbox.err"
  confined=$(grep -c 'abstract sockets scoped' "$WORK/sandbox.err")
  FIG="rc $rc; $confined of 2 ranks confined with their sockets scoped"
  if [ "$rc" -eq 0 ] && [ "$confined" -eq 2 ] && [ -f "$out/result.json" ]; then
    STATUS=PASS
  else
    FIG="$FIG; $(first_error "$WORK/sandbox.err")"
  fi
}

# Starts ranks 0 and 1 of $1 (a spec) by hand as two NCCL hosts on the one GPU; extra VAR=VALUE in $2.
start_pair() {
  local spec=$1 extra=$2 port r
  port=$(free_port)
  PAIR=()
  for r in 0 1; do
    # shellcheck disable=SC2046,SC2086 # the environment words split on purpose
    start_bg "$WORK/pair$r.out" $(share_env "$r") $extra "$B" train --spec "$spec" --rank "$r" --world 2 \
      --rendezvous "127.0.0.1:$port" --collective nccl --comm-timeout-s 10 --join-timeout-s 60
    PAIR+=("$BG_PID")
  done
}

step_crash() {
  local spec="$WORK/faults.json" t0 t1 t2 rc0 rc1 named
  lenet_spec 20 5 16384 >"$spec"
  t0=$(now_ms)
  start_pair "$spec" RINGTRAIN_CRASH=1:20
  wait_until "${PAIR[1]}" $((t0 + 1000 * $(bound 60))); rc1=$WAIT_RC
  t1=$(now_ms)
  wait_until "${PAIR[0]}" $((t1 + 1000 * $(bound 45))); rc0=$WAIT_RC
  t2=$(now_ms)
  append faults "crash: rank 1 aborts at iteration 20 (rc $rc1)" "$WORK/pair1.out"
  append faults "crash: rank 0 (rc $rc0)" "$WORK/pair0.out"
  named=no; names_cause "$WORK/pair0.out" && named=yes
  FIG="rank 1 rc $rc1; rank 0 rc $rc0 $(secs "$t1" "$t2") s after rank 1 died; names the cause: $named; $(first_error "$WORK/pair0.out")"
  [ "$rc1" -ne 0 ] && [ "$rc1" -ne 124 ] && [ "$rc0" -ne 0 ] && [ "$rc0" -ne 124 ] && [ $((t2 - t1)) -le 40000 ] \
    && [ "$named" = yes ] && STATUS=PASS
}

step_sigstop() {
  local spec="$WORK/faults.json" t0 t1 t2 rc0 lines=0 named
  lenet_spec 20 5 16384 >"$spec"
  t0=$(now_ms)
  start_pair "$spec" ""
  local ready=$((t0 + 1000 * $(bound 45)))
  while [ "$(now_ms)" -lt "$ready" ] && kill -0 "${PAIR[0]}" 2>/dev/null && kill -0 "${PAIR[1]}" 2>/dev/null; do
    lines=$(grep -c '"kind":"iteration"' "$WORK/pair0.out")
    [ "$lines" -ge 3 ] && break
    sleep 0.1
  done
  if [ "$lines" -lt 3 ]; then
    kill -9 "${PAIR[@]}" 2>/dev/null
    append faults "sigstop: rank 0 never got going" "$WORK/pair0.out"
    append faults "sigstop: rank 1" "$WORK/pair1.out"
    FIG="rank 0 printed $lines iteration lines before the stop was due; $(first_error "$WORK/pair0.out")"
    return
  fi
  kill -STOP "${PAIR[1]}"
  t1=$(now_ms)
  wait_until "${PAIR[0]}" $((t1 + 1000 * $(bound 60))); rc0=$WAIT_RC
  t2=$(now_ms)
  kill -9 "${PAIR[1]}" 2>/dev/null
  { wait "${PAIR[1]}"; } 2>/dev/null
  append faults "sigstop: rank 0 (rc $rc0; rank 1 stopped after $lines of rank 0's iteration lines)" "$WORK/pair0.out"
  append faults "sigstop: rank 1" "$WORK/pair1.out"
  named=no; names_cause "$WORK/pair0.out" && named=yes
  FIG="rank 0 rc $rc0 $(secs "$t1" "$t2") s after SIGSTOP of rank 1; names the cause: $named; $(first_error "$WORK/pair0.out")"
  [ "$rc0" -ne 0 ] && [ "$rc0" -ne 124 ] && [ $((t2 - t1)) -le 40000 ] && [ "$named" = yes ] && STATUS=PASS
}

# A synthetic ImageNet-shaped dataset for ResNet-50 (written on the device, not under $OUT).
R50_DATA="$WORK/resnet50.safetensors"
make_r50_data() {
  [ -f "$R50_DATA" ] && return 0
  timeout "$(bound 60)" python3 - "$R50_DATA" >"$WORK/r50data.out" 2>&1 <<'PY'
import json, random, struct, sys
path, n, shape = sys.argv[1], 1280, (3, 224, 224)
rng = random.Random(0)
labels = [rng.randrange(1000) for _ in range(n)]
labels[0] = 999  # ringtrain counts classes as max label + 1
try:
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)
    save_file({"x": x, "y": torch.tensor(labels, dtype=torch.int64)}, path)
    how = "safetensors"
except ImportError:
    # the format by hand: u64 header length, JSON header, raw little-endian data
    x = rng.randbytes(n * shape[0] * shape[1] * shape[2])
    y = struct.pack(f"<{n}q", *labels)
    header = {"x": {"dtype": "U8", "shape": [n, *shape], "data_offsets": [0, len(x)]},
              "y": {"dtype": "I64", "shape": [n], "data_offsets": [len(x), len(x) + len(y)]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + x + y)
    how = "by hand"
print(f"wrote {path}: x u8 [{n}, 3, 224, 224], y i64 [{n}] ({how})")
PY
  local rc=$?
  append resnet50 "dataset (rc $rc)" "$WORK/r50data.out"
  return $rc
}

step_resnet50_one() { # precision batch
  local p=$1 b=$2 rt py ratio goal rc rcp phases step_ms
  local tag="$p-b$b"
  make_r50_data || { FIG="no dataset: $(tail -n 1 "$WORK/r50data.out")"; return; }
  timeout "$(bound 90)" "$B" bench train --device gpu --model resnet50 --precision "$p" --batch "$b" --world 1 \
    --dataset-file "$R50_DATA" --steps 20 --json >"$WORK/rt-$tag.out" 2>&1
  rc=$?
  append resnet50 "ringtrain bench train resnet50 $p batch $b (rc $rc)" "$WORK/rt-$tag.out"
  timeout "$(bound 90)" python3 "$EAGER" --batch "$b" --precision "$p" --steps 20 >"$WORK/py-$tag.out" 2>&1
  rcp=$?
  append resnet50 "PyTorch eager resnet50 $p batch $b (rc $rcp)" "$WORK/py-$tag.out"
  IFS=$'\t' read -r rt step_ms phases < <("${PARSE[@]}" bench-train "$WORK/rt-$tag.out" 1)
  py=$("${PARSE[@]}" eager "$WORK/py-$tag.out")
  goal=$([ "$p" = bf16 ] && echo 1.00 || echo 0.95)
  if [ "$rc" -eq 0 ] && [ "$rcp" -eq 0 ] && [ -n "${rt:-}" ] && [ -n "$py" ]; then
    ratio=$(awk -v a="$rt" -v b="$py" 'BEGIN { printf "%.3f", a / b }')
    STATUS=$(awk -v r="$ratio" -v g="$goal" 'BEGIN { print (r >= g ? "PASS" : "BELOW-GOAL") }')
    FIG="ringtrain $rt img/s, PyTorch $py img/s, ratio $ratio (goal >= $goal); ringtrain $step_ms ms/step ($phases)"
  else
    ratio="-"
    FIG="ringtrain rc $rc ${rt:-no figure}: $(first_error "$WORK/rt-$tag.out"); PyTorch rc $rcp ${py:-no figure}: $(first_error "$WORK/py-$tag.out")"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t>= %s\t%s\n' "$p" "$b" "${rt:--}" "${py:--}" "$ratio" "$goal" \
    "${step_ms:--} (${phases:-})" >>"$R50"
}

# ResNet-50 bf16, batch 128, one GPU, trained from JPEG shards (issue 55): 4,000 ImageNet-sized synthetic
# photographs (about 400×350, ~110 KB) made and packed here, decoded and augmented by 12 loader threads;
# its img/s against the resnet50-bf16-b128 step's (synthetic 224×224 data in memory), and the pipeline's
# own images/s on those 12 cores.
step_shards() {
  local keep="$WORK/jpeg" f="$WORK/shards.out" rc rt r50
  timeout "$(bound 150)" "$RB" --ringtrain "$B" data --images 4000 --batches 20 --cores 12 --no-pytorch \
    --keep "$keep" --json >"$f" 2>&1
  rc=$?
  append shards "ringtrain-bench data --images 4000 --cores 12 (rc $rc)" "$f"
  local pipeline
  pipeline=$(python3 -c 'import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("%.0f" % (rows[-1]["ringtrain"]["images_per_s"]) if rows else "")' "$f" 2>/dev/null)
  timeout "$(bound 120)" "$B" bench train --device gpu --model resnet50 --precision bf16 --batch 128 --world 1 \
    --dataset "shards:$keep/shards" --loader-threads 12 --steps 20 --json >"$WORK/rt-shards.out" 2>&1
  rc=$?
  append shards "bench train resnet50 bf16 b128 from the shards (rc $rc)" "$WORK/rt-shards.out"
  IFS=$'\t' read -r rt _ _ < <("${PARSE[@]}" bench-train "$WORK/rt-shards.out" 1)
  r50=$(awk -F'\t' '$1 == "bf16" && $2 == "128" { print $3 }' "$R50")
  FIG="from shards ${rt:-no figure} img/s, synthetic in memory ${r50:-not measured} img/s; pipeline ${pipeline:-?} img/s on 12 cores"
  [ "$rc" -eq 0 ] && [ -n "${rt:-}" ] && STATUS=PASS
  [ "$rc" -eq 0 ] || FIG="$FIG; $(first_error "$WORK/rt-shards.out")"
}

step_resnet50_data() {
  make_r50_data && STATUS=PASS
  FIG=$(tail -n 1 "$WORK/r50data.out")
}

step_share() {
  make_r50_data || { FIG="no dataset"; return; }
  local f="$WORK/share.out"
  timeout "$(bound 120)" "$B" bench train --device gpu --model resnet50 --precision bf16 --batch 64 --world 2 \
    --share-gpu-for-tests --dataset-file "$R50_DATA" --steps 10 --json >"$f" 2>&1
  local rc=$?
  append resnet50 "bench train resnet50 bf16 batch 64 --world 2 --share-gpu-for-tests (rc $rc)" "$f"
  judge share "$f" 2
  [ "$rc" -eq 0 ] || { STATUS=FAIL; FIG="rc $rc: $(first_error "$f"); $FIG"; }
}

# The share step again with the all-reduce overlapped with backward (issue 32, item 2): img/s and the exposed
# all-reduce (what a step waited for it after backward) against the share step's run without the overlap.
step_overlap() {
  make_r50_data || { FIG="no dataset"; return; }
  local f="$WORK/overlap.out" rc on off
  timeout "$(bound 120)" "$B" bench train --device gpu --model resnet50 --precision bf16 --batch 64 --world 2 \
    --share-gpu-for-tests --dataset-file "$R50_DATA" --steps 10 --overlap on --json >"$f" 2>&1
  rc=$?
  append resnet50 "bench train resnet50 bf16 batch 64 --world 2 --share-gpu-for-tests --overlap on (rc $rc)" "$f"
  judge share "$f" 2
  on=$("${PARSE[@]}" bench-train "$f" 2 | cut -f1)
  off=$([ -f "$WORK/share.out" ] && "${PARSE[@]}" bench-train "$WORK/share.out" 2 | cut -f1)
  if [ -n "$on" ] && [ -n "$off" ]; then
    FIG="$FIG; on/off img/s $(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.3f", a / b }') (off: the share step)"
  fi
  [ "$rc" -eq 0 ] || { STATUS=FAIL; FIG="rc $rc: $(first_error "$f"); $FIG"; }
}

# ResNet-50 bf16 batch 128 with its batches gathered on the GPU from the data set kept there (the default,
# issue 32 item 4) against gathered on the host and copied each step (--data host, the loader before).
step_input() {
  make_r50_data || { FIG="no dataset"; return; }
  local d rc rt step_ms phases on_device="" on_host="" ran=0
  FIG=""
  for d in device host; do
    timeout "$(bound 90)" "$B" bench train --device gpu --model resnet50 --precision bf16 --batch 128 --world 1 \
      --dataset-file "$R50_DATA" --steps 20 --data "$d" --json >"$WORK/input-$d.out" 2>&1
    rc=$?
    append resnet50 "bench train resnet50 bf16 batch 128 --data $d (rc $rc)" "$WORK/input-$d.out"
    rt="" step_ms=""
    IFS=$'\t' read -r rt step_ms phases < <("${PARSE[@]}" bench-train "$WORK/input-$d.out" 1)
    if [ "$rc" -eq 0 ] && [ -n "$rt" ]; then ran=$((ran + 1)); else rt=""; fi
    [ "$d" = device ] && on_device=$rt || on_host=$rt
    FIG="$FIG--data $d: ${rt:-rc $rc: $(first_error "$WORK/input-$d.out")} img/s, ${step_ms:--} ms/step; "
  done
  if [ "$ran" -eq 2 ]; then
    STATUS=PASS
    FIG="$FIG""device/host $(awk -v a="$on_device" -v b="$on_host" 'BEGIN { printf "%.3f", a / b }')"
  fi
}

# api URL TOKEN OUTFILE [JSONFILE]: GET (or POST the file) with curl, as the user guide does (python3 when the
# machine has no curl); prints the HTTP status.
api() {
  if command -v curl >/dev/null 2>&1; then
    local post=()
    [ -z "${4:-}" ] || post=(-H 'Content-Type: application/json' --data @"$4")
    curl -sS -o "$3" -w '%{http_code}' -H "Authorization: Bearer $2" "${post[@]}" "$1"
  else
    python3 - "$@" <<'PY'
import sys, urllib.request, urllib.error
url, token, out = sys.argv[1:4]
data = open(sys.argv[4], "rb").read() if len(sys.argv) > 4 else None
req = urllib.request.Request(url, data=data, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        code, body = r.status, r.read()
except urllib.error.HTTPError as e:
    code, body = e.code, e.read()
open(out, "wb").write(body)
print(code, end="")
PY
  fi
}

step_up() {
  local port data="$WORK/up" url token id t0 t1 state summary up_pid code
  port=$(free_port)
  url="http://127.0.0.1:$port"
  mkdir -p "$data"
  start_bg "$WORK/up.out" "$B" up --listen "127.0.0.1:$port" --data-dir "$data" --gpus all
  up_pid=$BG_PID
  t0=$(now_ms)
  local ready=$((t0 + 1000 * $(bound 30)))
  while [ "$(now_ms)" -lt "$ready" ] && kill -0 "$up_pid" 2>/dev/null; do
    grep -q '^ringtrain is up' "$WORK/up.out" && break
    sleep 0.2
  done
  if ! grep -q '^ringtrain is up' "$WORK/up.out"; then
    FIG="ringtrain up did not come up: $(first_error "$WORK/up.out")"
    kill -9 "$up_pid" 2>/dev/null
    append up "ringtrain up" "$WORK/up.out"
    return
  fi
  token=$(cat "$data/admin-token")
  local healthy=$(($(now_ms) + 10000))
  until [ "$(api "$url/healthz" "$token" "$WORK/health.out" 2>/dev/null)" = 200 ] || [ "$(now_ms)" -ge "$healthy" ]; do
    sleep 0.2
  done
  cat >"$WORK/up-job.json" <<'EOF'
{"name": "device-check-resnet20", "model": {"name": "resnet20"}, "dataset": "synthetic:4096", "workers": 1,
 "epochs": 1, "lr": {"warmup": {"kind": "none"}, "decay": {"kind": "none"}}, "seed": 1, "device": "gpu"}
EOF
  code=$(api "$url/v1/jobs" "$token" "$WORK/submit.json" "$WORK/up-job.json" 2>&1)
  append up "POST /v1/jobs ($code)" "$WORK/submit.json"
  id=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$WORK/submit.json" 2>/dev/null)
  state=unsubmitted summary="POST /v1/jobs answered $code"
  if [ -n "$id" ]; then
    t1=$(now_ms)
    local until=$((t1 + 1000 * $(bound 90)))
    while [ "$(now_ms)" -lt "$until" ]; do
      api "$url/v1/jobs/$id" "$token" "$WORK/job.json" >/dev/null 2>&1
      IFS=$'\t' read -r state summary < <("${PARSE[@]}" job "$WORK/job.json")
      case "$state" in succeeded | failed | cancelled) break ;; esac
      sleep 1
    done
    append up "GET /v1/jobs/$id" "$WORK/job.json"
    FIG="job $state $(secs "$t1" "$(now_ms)") s after submission; $summary"
  else
    FIG="$summary"
  fi
  api "$url/v1/nodes" "$token" "$WORK/nodes.json" >/dev/null 2>&1
  append up "GET /v1/nodes" "$WORK/nodes.json"
  FIG="$FIG; nodes: $("${PARSE[@]}" nodes "$WORK/nodes.json")"
  [ "$state" = succeeded ] && STATUS=PASS
  kill -TERM "$up_pid" 2>/dev/null
  wait_until "$up_pid" $(($(now_ms) + 10000))
  append up "ringtrain up (the server, the agent and the rank's stderr)" "$WORK/up.out"
}

# --- run --------------------------------------------------------------------------------------------------
echo "check: $(date -u +%FT%TZ), budget ${BUDGET} s, binary $B, logs in $OUT"
if [ ! -x "$B" ]; then
  record binary FAIL 0 "$B is missing: build it with scripts/device/build-gpu-binary.sh and carry .device"
else
  run_step env 15 step_env
  run_step doctor 15 step_doctor
  run_step nccl-world1 20 step_nccl_world1
  run_step nccl-dup 20 step_nccl_dup
  run_step nccl-hostid 25 step_nccl_hostid
  run_step equivalence 45 step_equivalence
  run_step pipeline 120 step_pipeline
  run_step sandbox 30 step_sandbox
  run_step crash 30 step_crash
  run_step sigstop 35 step_sigstop
  run_step resnet50-data 15 step_resnet50_data
  for p in bf16 fp32; do
    for b in 64 128; do
      step_r50() { step_resnet50_one "$p" "$b"; }
      run_step "resnet50-$p-b$b" 35 step_r50
    done
  done
  run_step shards 90 step_shards
  run_step up 45 step_up
  run_step share 40 step_share
  run_step overlap 40 step_overlap
  run_step input 50 step_input
fi

# --- the table --------------------------------------------------------------------------------------------
{
  echo "## ringtrain device check, $(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  echo
  "${PARSE[@]}" table "$RESULTS"
  if [ -s "$R50" ]; then
    echo
    echo "ResNet-50 training throughput (one GPU, synthetic 224×224 uint8 data, 20 timed steps):"
    echo
    "${PARSE[@]}" resnet-table "$R50"
  fi
  echo
  echo "total $((SECONDS - START)) s of a ${BUDGET} s budget"
} >"$OUT/table.md"
echo
cat "$OUT/table.md"
