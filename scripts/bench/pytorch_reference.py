#!/usr/bin/env python3
"""Plain-PyTorch reference figures for ringtrain on a CPU machine (issue 32). Each subcommand prints ONE JSON
object on stdout (progress on stderr); ranks are processes started by torch.multiprocessing (spawn) on
127.0.0.1, talking Gloo. torch and the standard library only.

  allreduce --world K --bytes B [--iters N]          as `ringtrain bench allreduce`
  steps --model lenet5|resnet20 --world K --batch n --steps S --threads T      as `ringtrain bench train`
  recipe --spec SPEC.json --world K --out DIR [--data DIR] [--threads T] [--init pytorch|goyal|tch]
                                                     as `ringtrain train --spec SPEC --local K --out DIR`

Run it with the PyTorch venv, e.g. /var/cache/ringtrain/torch-2.11.0-venv/bin/python.

Where it does NOT match ringtrain (deliberately: these are what a plain PyTorch user gets):
- transport: Gloo over TCP between processes. `ringtrain bench allreduce`/`bench train` run their ranks as
  threads of one process (TCP ring or shared memory); `ringtrain train --local K` uses shared memory on CPU.
- DDP overlaps the bucket all-reduces with backward; ringtrain all-reduces after backward (same 25 MB buckets).
- steps: no per-step loss/error tally (ringtrain sums them inside its all-reduce and checks the loss each step).
- recipe: the epoch permutation is torch.randperm(seed + epoch), not ringtrain's SplitMix64 (same semantics);
  weights come from torch's RNG (with --init as the spec's model.init: the same distributions, other values;
  by default PyTorch's own layer initialisation, what a user's script gets); training loss/error are summed once per
  epoch; the non-finite-loss check is per epoch; no collapse guard; checkpoints are one torch.save by rank 0
  (ringtrain: safetensors written atomically, every rank's BatchNorm statistics gathered); no virtual ranks.
"""

import argparse
import gzip
import json
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"  # worker/src/data/mod.rs FASHION_MNIST_DIR
WARMUP_STEPS = 3  # src/commands/bench/train.rs WARMUP_STEPS
EVAL_BATCH = 1000  # TrainOptions::eval_batch
# core/src/spec.rs OptimizerSpec defaults (Goyal: no weight decay on BN gamma/beta; biases decay)
OPTIMIZER_DEFAULTS = {"momentum": 0.9, "nesterov": True, "momentum_form": "goyal", "weight_decay": 1e-4,
                      "bn_weight_decay": False, "bias_weight_decay": True}
BN = nn.modules.batchnorm._BatchNorm

def process_start():
    """When this process started (epoch seconds, 10 ms resolution), from /proc: `recipe`'s wall_s counts from
    here, so interpreter start-up and `import torch` are inside it."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime, ticks since boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()

# ---- data: worker/src/data/idx.rs and mod.rs ---------------------------------------------------------------
def read_idx(path):
    """An IDX file, gzipped or not, as a uint8 tensor of its shape (type 0x08 only, as ringtrain)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(raw[3])]
    return torch.frombuffer(bytearray(raw[4 + 4 * raw[3] :]), dtype=torch.uint8).view(*dims)

def load_idx_dir(folder):
    """Train and test (x, y) of an MNIST-layout folder (`train-*`, `t10k-*`, each [.gz]): x N×1×H×W uint8."""

    def find(stem):
        for name in (stem + ".gz", stem):
            if os.path.exists(os.path.join(folder, name)):
                return os.path.join(folder, name)
        raise SystemExit(f"{folder} has no {stem}[.gz]")

    def split(prefix, images):
        x = read_idx(find(f"{prefix}-images-idx{images}-ubyte"))
        return (x.unsqueeze(1) if x.dim() == 3 else x), read_idx(find(f"{prefix}-labels-idx1-ubyte")).long()

    return split("train", 3), split("t10k", 3)

class Normalizer:
    """Normalizer::fit: per-channel mean/std over the WHOLE training split (before train_samples cuts it), in
    f64 over chunks, population variance, std clamped at 1e-6; applied as (x·(1/255) - mean) / std in f32."""

    def __init__(self, x):
        total, squares, count = 0.0, 0.0, 0
        for chunk in x.split(4096):
            c = chunk.double() / 255.0
            total, squares = total + c.sum((0, 2, 3)), squares + c.square().sum((0, 2, 3))
            count += c.numel() // c.shape[1]
        mean = total / count
        std = (squares / count - mean.square()).clamp_min(0).sqrt().clamp_min(1e-6)
        self.mean, self.std = mean.float().view(1, -1, 1, 1), std.float().view(1, -1, 1, 1)

    def __call__(self, x):
        return (x.float() * (1.0 / 255.0) - self.mean) / self.std

# ---- models: worker/src/models/mod.rs (LeNet5), resnet.rs, layers.rs ---------------------------------------
def initialise(model, scheme):
    """The built-in models' initialisations (worker/src/models/init.rs), for LeNet-5 and the MLP:
    - "pytorch": PyTorch's own layer defaults (weights and biases U(±1/sqrt(fan_in))): what a user's script gets;
    - "goyal": He-normal weights (convolutions fan-out, as the ResNets; hidden fully connected layers fan-in),
      the last fully connected layer N(0, 0.01), biases 0 (Goyal et al. §5.1);
    - "tch": tch's defaults, ringtrain's before 2026-12-06: weights Kaiming-uniform with the ReLU gain
      (±sqrt(6/fan_in)), convolution biases 0, linear biases U(±1/sqrt(fan_in))."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    for m in layers:
        if scheme == "pytorch":
            m.reset_parameters()
        elif scheme == "tch":
            nn.init.kaiming_uniform_(m.weight, nonlinearity="relu")
            if isinstance(m, nn.Conv2d):
                nn.init.zeros_(m.bias)
        elif scheme == "goyal":
            if m is layers[-1]:
                nn.init.normal_(m.weight, 0.0, 0.01)
            else:
                mode = "fan_out" if isinstance(m, nn.Conv2d) else "fan_in"
                nn.init.kaiming_normal_(m.weight, mode=mode, nonlinearity="relu")
            nn.init.zeros_(m.bias)
        else:
            raise SystemExit(f"init {scheme!r}: use pytorch, goyal or tch")
    return model

class LeNet5(nn.Module):
    """conv 5×5 pad 2 → 6, ReLU, max-pool 2; conv 5×5 → 16, ReLU, max-pool 2; fc 120, ReLU; 84, ReLU; classes.
    No BatchNorm. Initialised by `initialise`."""

    def __init__(self, c, h, w, classes):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(c, 6, 5, padding=2), nn.Conv2d(6, 16, 5)
        side = lambda s: (s // 2 - 4) // 2
        self.fc1 = nn.Linear(16 * side(h) * side(w), 120)
        self.fc2, self.fc3 = nn.Linear(120, 84), nn.Linear(84, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.max_pool2d(F.relu(self.conv1(x)), 2))), 2).flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))

class Mlp(nn.Module):
    """Mlp: flatten, hidden fully connected layers with ReLU (default 256, 128), a linear classifier."""

    def __init__(self, inputs, hidden, classes):
        super().__init__()
        widths = [inputs, *hidden, classes]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        x = x.flatten(1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            x = F.relu(x) if i + 1 < len(self.layers) else x
        return x

def conv(c_in, c_out, k, stride):
    """layers::conv: no bias, padding k/2, He-normal fan-out."""
    m = nn.Conv2d(c_in, c_out, k, stride, k // 2, bias=False)
    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return m

def batch_norm(c, zero_gamma=False):
    """layers::batch_norm: gamma 1 (0 for zero_gamma), beta 0; eps 1e-5 and momentum 0.1 in both libraries."""
    m = nn.BatchNorm2d(c)
    nn.init.constant_(m.weight, 0.0 if zero_gamma else 1.0)
    nn.init.zeros_(m.bias)
    return m

class BasicBlock(nn.Module):
    """conv3×3(stride), BN, ReLU, conv3×3, BN (gamma 0 when zero_last), + shortcut (1×1 conv + BN when the shape
    changes), ReLU."""

    def __init__(self, c_in, c_out, stride, zero_last):
        super().__init__()
        self.conv1, self.bn1 = conv(c_in, c_out, 3, stride), batch_norm(c_out)
        self.conv2, self.bn2 = conv(c_out, c_out, 3, 1), batch_norm(c_out, zero_last)
        changes = stride != 1 or c_in != c_out
        self.down = nn.Sequential(conv(c_in, c_out, 1, stride), batch_norm(c_out)) if changes else None

    def forward(self, x):
        r = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(r + (x if self.down is None else self.down(x)))

class CifarResNet(nn.Module):
    """ResNet::cifar (6n+2 layers): conv3×3 16, BN, ReLU; n blocks each at 16/32/64 channels (first stride 1,
    2, 2); global average pool; fc with weights N(0, 0.01) and bias 0."""

    def __init__(self, c, n, classes, zero_last):
        super().__init__()
        self.conv1, self.bn1 = conv(c, 16, 3, 1), batch_norm(16)
        widths = [w for w in (16, 32, 64) for _ in range(n)]
        self.blocks = nn.Sequential(*[BasicBlock(([16] + widths)[i], w, 2 if i % n == 0 and i else 1, zero_last)
                                      for i, w in enumerate(widths)])
        self.fc = nn.Linear(64, classes)
        nn.init.normal_(self.fc.weight, 0.0, 0.01)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        x = self.blocks(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))

MLP_HIDDEN = [256, 128]  # core/src/spec.rs defaults::mlp_hidden

def build_model(name, shape, classes, zero_last=True, init="pytorch", hidden=None):
    """The model a spec names; LeNet-5 and the MLP initialised by `init` (the ResNets always by Goyal's rule, as
    ringtrain's)."""
    blocks = {"resnet8": 1, "resnet20": 3, "resnet56": 9}
    if name == "lenet5":
        return initialise(LeNet5(*shape, classes), init)
    if name == "mlp":
        return initialise(Mlp(math.prod(shape), hidden or MLP_HIDDEN, classes), init)
    if name in blocks:
        return CifarResNet(shape[0], blocks[name], classes, zero_last)
    raise SystemExit(f"model {name!r}: this reference builds mlp, lenet5, resnet8, resnet20 and resnet56 only")

def sgd(model, lr, opt):
    """optim.rs: g += wd·w (not on BN gamma/beta unless bn_weight_decay; on biases unless bias_weight_decay off),
    u = m·u + g, w -= lr·(g + m·u) (Nesterov). ringtrain's default `goyal` form (u = m·u + lr·g, scaled by
    lr_t/lr_{t-1} when the lr changes) takes exactly these steps (its test goyal_form_with_correction_takes_
    the_pytorch_steps), so torch.optim.SGD (for-loop implementation on CPU) serves for both forms."""
    decay, no_decay = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            rule = opt["bn_weight_decay"] if isinstance(module, BN) else name != "bias" or opt["bias_weight_decay"]
            (decay if rule else no_decay).append(p)
    groups = [{"params": ps, "weight_decay": wd} for ps, wd in ((decay, opt["weight_decay"]), (no_decay, 0.0)) if ps]
    return torch.optim.SGD(groups, lr=lr, momentum=opt["momentum"], nesterov=opt["nesterov"])

def wrap(model, world):
    """DDP over Gloo when K > 1 (25 MB buckets = ringtrain's DEFAULT_BUCKET_BYTES; gradients averaged over k,
    as ringtrain's sum / k), plain eager otherwise. broadcast_buffers=False: ringtrain keeps every rank's own
    BatchNorm statistics (DDP's default would copy rank 0's before every forward)."""
    return DDP(model, bucket_cap_mb=25, broadcast_buffers=False) if world > 1 else model

def launch(fn, world, *args):
    """fn(rank, world, *args, port, queue) in `world` spawned processes; returns what rank 0 put in the queue."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(fn, args=(world, *args, port, queue), nprocs=world, join=True)
    return queue.get()

def join_group(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

# ---- allreduce: src/commands/bench/allreduce.rs measure() --------------------------------------------------
def allreduce_rank(rank, world, nbytes, iters, port, queue):
    """Matched: a buffer of nbytes/4 f32 ones; ONE warm-up all-reduce (connections, page faults), a barrier,
    then a timed loop in which rank 0 decides after every all-reduce whether to go on and broadcasts that (the
    broadcast is timed, as in ringtrain): at least 3 iterations and about a second, at most 50; seconds =
    rank 0's elapsed / iterations; algbw = bytes / seconds / 1e9, busbw = algbw·2(k-1)/k (nccl-tests).
    --iters N runs exactly N timed iterations instead (same loop)."""
    join_group(rank, world, port)
    buf, go = torch.ones(nbytes // 4, dtype=torch.float32), torch.zeros(1)
    least, most = (iters, iters) if iters else (3, 50)
    dist.all_reduce(buf)
    dist.barrier()
    started, iterations = time.perf_counter(), 0
    while True:
        dist.all_reduce(buf)
        iterations += 1
        if rank == 0:
            go[0] = float(iterations < least or (not iters and time.perf_counter() - started < 1.0))
        dist.broadcast(go, 0)
        if go[0] == 0.0 or iterations >= most:
            break
    seconds = (time.perf_counter() - started) / iterations
    if rank == 0:
        algbw = nbytes / seconds / 1e9
        busbw = algbw * 2.0 * (world - 1) / world
        # the keys of ringtrain's `bench allreduce --json`
        queue.put({"bench": "allreduce", "impl": "pytorch-gloo", "backend": "gloo", "size_bytes": nbytes,
                   "world": world, "iterations": iterations, "seconds": seconds, "algbw_gbps": algbw,
                   "busbw_gbps": busbw, "torch": torch.__version__})
    dist.destroy_process_group()

# ---- steps: src/commands/bench/train.rs measure() around Trainer::train_step -------------------------------
def steps_rank(rank, world, a, port, queue):
    """As `ringtrain bench train` on CPU: its spec (train_samples = (steps + 3)·k·n of Fashion-MNIST, seed 0,
    lr 0.1·kn/256 without warmup or decay, optimizer defaults); one shared permutation of those samples in k
    contiguous shards; each step gathers its n uint8 samples, normalises them, forward, mean cross-entropy,
    backward, gradient all-reduce, SGD update. 3 untimed warm-up steps, then `steps` timed; rank 0's wall."""
    torch.set_num_threads(a.threads)
    if world > 1:
        join_group(rank, world, port)
    total = (a.steps + WARMUP_STEPS) * world * a.batch
    (x, y), _ = load_idx_dir(a.data)
    norm, x, y = Normalizer(x), x[:total], y[:total]
    if len(x) < total:
        raise SystemExit(f"{total} training samples needed, the data has {len(x)}")
    torch.manual_seed(0)
    model = build_model(a.model, tuple(x.shape[1:]), 10)
    net, opt = wrap(model, world), sgd(model, 0.1 * world * a.batch / 256, OPTIMIZER_DEFAULTS)
    shard = torch.randperm(total, generator=torch.Generator().manual_seed(0)).chunk(world)[rank]

    def step(t):
        idx = shard[t * a.batch : (t + 1) * a.batch]
        xb, yb = norm(x.index_select(0, idx)), y.index_select(0, idx)
        opt.zero_grad()
        F.cross_entropy(net(xb), yb).backward()  # DDP all-reduces the gradients during backward
        opt.step()

    for t in range(WARMUP_STEPS):
        step(t)
    if world > 1:
        dist.barrier()
    started = time.perf_counter()
    for t in range(WARMUP_STEPS, WARMUP_STEPS + a.steps):
        step(t)
    wall = time.perf_counter() - started
    if rank == 0:
        queue.put({"bench": "train", "impl": "pytorch-ddp-gloo" if world > 1 else "pytorch-eager",
                   "model": a.model, "batch": a.batch, "world": world, "threads": a.threads, "steps": a.steps,
                   "data": a.data, "torch": torch.__version__,
                   "samples_per_s": a.steps * world * a.batch / wall, "step_ms": wall * 1e3 / a.steps})
    if world > 1:
        dist.destroy_process_group()

# ---- recipe: core/src/spec.rs, core/src/schedule.rs, worker/src/trainer.rs and trainer/epochs.rs ----------
def load_spec(path):
    """The spec with ringtrain's defaults (spec.rs) filled in; refuses what this reference does not implement."""
    with open(path) as f:
        s = json.load(f)
    ignored = {"name", "max_restarts", "priority", "guard", "log_every_iterations", "bn_zero_init_last"}
    handled = {"model", "dataset", "train_samples", "test_samples", "workers", "devices", "per_worker_batch",
               "epochs", "lr", "optimizer", "seed", "checkpoint_every_epochs", "device", "precision", "loss"}
    refuse = [f"field {k}" for k in sorted(set(s) - ignored - handled)]
    dataset = s.get("dataset", "fashion-mnist")
    refuse += ["dataset (fashion-mnist or idx:PATH only)"] * (dataset != "fashion-mnist" and dataset[:4] != "idx:")
    refuse += ["devices (no virtual ranks)"] * (s.get("devices", s.get("workers", 1)) != s.get("workers", 1))
    refuse += [f"{k} (only {v})" for k, v in (("device", "cpu"), ("precision", "fp32"), ("loss", "cross_entropy"))
               if s.get(k, v) != v]
    refuse += ["model (built-in mlp/lenet5/resnet* only)"] * ("name" not in s.get("model", {}))
    if refuse:
        raise SystemExit(f"{path}: not supported by this reference: " + ", ".join(refuse))
    lr = s.get("lr", {})
    spec = {"model": s["model"]["name"], "hidden": s["model"].get("hidden"), "dataset": dataset, "train_samples": s.get("train_samples"),
            "test_samples": s.get("test_samples"), "workers": s.get("workers", 1), "n": s.get("per_worker_batch", 32),
            "epochs": s.get("epochs", 90), "seed": s.get("seed", 0),
            "checkpoint_every": s.get("checkpoint_every_epochs", 1),
            "log_every": max(1, s.get("log_every_iterations", 20)), "zero_last": s.get("bn_zero_init_last", True),
            "optimizer": {**OPTIMIZER_DEFAULTS, **s.get("optimizer", {})},
            "lr": {"base": 0.1, "reference_batch": 256, "scaling": "linear", "multiplier": None, "max": None, **lr,
                   "warmup": {"kind": "gradual", **lr.get("warmup", {})},
                   "decay": {"kind": "step", "factor": 0.1, **lr.get("decay", {})}}}
    build_model(spec["model"], (1, 28, 28), 10)  # refuses the models not built here before anything starts
    return spec

def rust_round(v):
    return math.floor(v + 0.5)  # f64::round for v >= 0 (halves away from zero; Python's round() is banker's)

class Schedule:
    """schedule.rs Effective::new and lr_at: ipe = floor(train_size / kn); scaled = base·kn/reference (sqrt, none,
    or lr.multiplier) capped by lr.max; warmup gradual (per iteration, linear from base, the scaled lr reached at
    round(warmup_epochs·ipe)), constant or none, skipped when scaled < base; then step decay by factor^(milestones
    passed) (default milestones 1/3, 2/3, 8/9 of the epochs), cosine or none."""

    def __init__(self, spec, train_size):
        lr, epochs, self.global_batch = spec["lr"], spec["epochs"], spec["workers"] * spec["n"]
        self.ipe = train_size // self.global_batch
        self.total = self.ipe * epochs
        ratio = self.global_batch / lr["reference_batch"]
        factor = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[lr["scaling"]]
        factor = factor if lr["multiplier"] is None else lr["multiplier"]
        self.base, self.max = lr["base"], lr["max"]
        self.scaled = self.cap(lr["base"] * factor)
        w, d = lr["warmup"], lr["decay"]
        asked = w.get("epochs", 0.0 if w["kind"] == "none" else 5.0)
        skipped = w["kind"] != "none" and asked > 0 and self.scaled < self.base
        self.warmup_kind, self.warmup_iterations = w["kind"], rust_round((0.0 if skipped else asked) * self.ipe)
        self.decay_kind, self.factor, milestones = d["kind"], d["factor"], d.get("milestones")
        if milestones is None:
            milestones = [m for m in (rust_round(epochs * f) for f in (1 / 3, 2 / 3, 8 / 9)) if 0 < m < epochs]
            milestones = [m for i, m in enumerate(milestones) if i == 0 or m != milestones[i - 1]]
        self.milestones = milestones if d["kind"] == "step" else []

    def cap(self, lr):
        return lr if self.max is None else min(lr, self.max)

    def lr_at(self, t):
        if t < self.warmup_iterations:
            return self.cap({"gradual": self.base + (self.scaled - self.base) * t / self.warmup_iterations,
                             "constant": self.base, "none": self.scaled}[self.warmup_kind])
        if self.decay_kind == "step":
            return self.cap(self.scaled * self.factor ** sum(m <= t // max(self.ipe, 1) for m in self.milestones))
        if self.decay_kind == "cosine":
            progress = min((t - self.warmup_iterations) / max(self.total - self.warmup_iterations, 1), 1.0)
            return self.cap(self.scaled * 0.5 * (1 + math.cos(math.pi * progress)))
        return self.scaled

@torch.no_grad()
def evaluate(model, x, y, norm, rank, world):
    """Trainer::evaluate: the whole test split cut into k contiguous parts, batches of 1000, with rank 0's
    BatchNorm statistics (each rank's own put back after); wrong, seen and loss summed by one all-reduce."""
    model.eval()
    stats = [b for m in model.modules() if isinstance(m, BN) for b in (m.running_mean, m.running_var)]
    own = [b.clone() for b in stats]
    for b in stats:
        dist.broadcast(b, 0)
    tally = torch.zeros(3, dtype=torch.float64)
    lo, hi = rank * len(y) // world, (rank + 1) * len(y) // world
    for s in range(lo, hi, EVAL_BATCH):
        xb, yb = norm(x[s : min(s + EVAL_BATCH, hi)]), y[s : min(s + EVAL_BATCH, hi)]
        out = model(xb)
        tally += torch.tensor([(out.argmax(1) != yb).sum().item(), len(yb),
                               F.cross_entropy(out, yb, reduction="sum").item()], dtype=torch.float64)
    dist.all_reduce(tally)
    for b, saved in zip(stats, own):
        b.copy_(saved)
    model.train()
    seen = max(tally[1].item(), 1.0)
    return tally[0].item() / seen, tally[2].item() / seen

def recipe_rank(rank, world, spec, a, launched, port, queue):
    torch.set_num_threads(a.threads)
    join_group(rank, world, port)
    folder = a.data or (spec["dataset"][4:] if spec["dataset"].startswith("idx:") else FASHION_MNIST_DIR)
    (x, y), (xt, yt) = load_idx_dir(folder)
    norm = Normalizer(x)
    x, y = x[: spec["train_samples"]], y[: spec["train_samples"]]
    xt, yt = xt[: spec["test_samples"]], yt[: spec["test_samples"]]
    sched, n, seed = Schedule(spec, len(x)), spec["n"], spec["seed"]
    if sched.ipe == 0:
        raise SystemExit(f"{len(x)} training samples make no step of {sched.global_batch}")
    torch.manual_seed(seed)
    classes = int(max(y.max(), yt.max())) + 1
    model = build_model(spec["model"], tuple(x.shape[1:]), classes, spec["zero_last"], a.init, spec["hidden"])
    net = wrap(model, world)  # DDP gives every rank rank 0's weights (ringtrain: agree_on_start)
    opt = sgd(model, sched.lr_at(0), spec["optimizer"])
    os.makedirs(os.path.join(a.out, "checkpoints"), exist_ok=True)
    spent, records, first_step_at = {"train_steps_s": 0.0, "evaluation_s": 0.0, "checkpoint_s": 0.0}, [], time.time()
    for epoch in range(spec["epochs"]):
        epoch_started = time.perf_counter()
        # shuffle.rs: ONE permutation per epoch from the seed, the same on every rank, cut into k contiguous
        # shards (remainder dropped). Drawn with torch.randperm seeded seed + epoch (DistributedSampler's
        # seeding) rather than ringtrain's SplitMix64 Fisher-Yates: same semantics, another permutation.
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed + epoch))
        shard = perm[rank * (len(x) // world) : (rank + 1) * (len(x) // world)]
        sums = torch.zeros(2, dtype=torch.float64)  # this rank's loss sum and misclassified samples
        for t in range(sched.ipe):
            started, iteration = time.perf_counter(), epoch * sched.ipe + t
            idx = shard[t * n : (t + 1) * n]
            xb, yb = norm(x.index_select(0, idx)), y.index_select(0, idx)
            for group in opt.param_groups:
                group["lr"] = sched.lr_at(iteration)
            opt.zero_grad()
            out = net(xb)
            loss = F.cross_entropy(out, yb)
            loss.backward()
            opt.step()
            sums += torch.stack([loss.detach().double(), (out.argmax(1) != yb).sum().double()])
            spent["train_steps_s"] += time.perf_counter() - started
            if rank == 0 and ((iteration + 1) % spec["log_every"] == 0 or t + 1 == sched.ipe):
                print(f"epoch {epoch} iteration {iteration} lr {sched.lr_at(iteration):.6g} loss {loss.item():.4f}",
                      file=sys.stderr, flush=True)
        dist.all_reduce(sums)  # the epoch's training loss and error over all ranks, once per epoch
        if not math.isfinite(sums[0].item()):
            raise SystemExit(f"the training loss became {sums[0].item()} in epoch {epoch}")
        started = time.perf_counter()
        test_error, test_loss = evaluate(model, xt, yt, norm, rank, world)
        spent["evaluation_s"] += time.perf_counter() - started
        records.append({"epoch": epoch, "iteration": (epoch + 1) * sched.ipe - 1, "test_error": test_error,
                        "test_loss": test_loss, "train_loss": sums[0].item() / world / sched.ipe,
                        "train_error": sums[1].item() / (sched.ipe * sched.global_batch),
                        "seconds": time.perf_counter() - epoch_started})
        if rank == 0:
            print(f"epoch {epoch}: test error {test_error:.4f}, test loss {test_loss:.4f}", file=sys.stderr)
        done, every = epoch + 1, spec["checkpoint_every"]
        if done == spec["epochs"] or (every > 0 and done % every == 0):  # epochs.rs checkpoint_after_epoch
            started = time.perf_counter()
            if rank == 0:
                state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "next_iteration": done * sched.ipe}
                torch.save(state, os.path.join(a.out, "checkpoints", f"epoch-{done}.pt"))
            spent["checkpoint_s"] += time.perf_counter() - started
    if rank == 0:
        result = {"impl": "pytorch-ddp-gloo" if world > 1 else "pytorch-eager", "spec": a.spec, "world": world,
                  "threads": a.threads, "epochs": records,
                  "final_test_error": records[-1]["test_error"], "iterations": sched.total,
                  "iterations_per_epoch": sched.ipe, "global_batch": sched.global_batch, "scaled_lr": sched.scaled,
                  "warmup_iterations": sched.warmup_iterations, "start_up_s": first_step_at - launched, **spent,
                  "samples_per_s": sched.total * sched.global_batch / max(spent["train_steps_s"], 1e-9),
                  "torch": torch.__version__}
        with open(os.path.join(a.out, "result.json"), "w") as f:
            json.dump(result, f, indent=2)
        queue.put({**result, "result_written_at": time.time()})
    dist.destroy_process_group()

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    ar = sub.add_parser("allreduce")
    ar.add_argument("--world", type=int, default=2)
    ar.add_argument("--bytes", type=int, default=64 << 20)
    ar.add_argument("--iters", type=int, default=0, help="timed iterations (default: ringtrain's: >= 3, ~1 s, <= 50)")
    st = sub.add_parser("steps")
    st.add_argument("--model", default="lenet5")
    for flag, default in (("--world", 2), ("--batch", 32), ("--steps", 30), ("--threads", 1)):
        st.add_argument(flag, type=int, default=default)
    st.add_argument("--data", default=FASHION_MNIST_DIR, help="IDX folder")
    rc = sub.add_parser("recipe")
    rc.add_argument("--spec", required=True)
    rc.add_argument("--world", type=int, help="rank processes (the spec's workers)")
    rc.add_argument("--out", required=True)
    rc.add_argument("--data", help=f"IDX folder (default {FASHION_MNIST_DIR}, or the spec's idx:PATH)")
    rc.add_argument("--threads", type=int, default=1)
    rc.add_argument("--init", default="pytorch", choices=["pytorch", "goyal", "tch"],
                    help="how LeNet-5 and the MLP start (default: PyTorch's own layer defaults; the spec's "
                    "model.init is ringtrain's and is not read here)")
    a = p.parse_args()
    if a.command == "allreduce":
        out = launch(allreduce_rank, a.world, a.bytes, a.iters)
    elif a.command == "steps":
        out = launch(steps_rank, a.world, a)
    else:
        spec = load_spec(a.spec)
        world = a.world or spec["workers"]
        if world != spec["workers"]:
            raise SystemExit(f"--world {world}: the spec asks for workers = {spec['workers']} (no virtual ranks)")
        os.makedirs(a.out, exist_ok=True)
        started = process_start()
        out = launch(recipe_rank, world, spec, a, started)
        out["test_errors"] = [r["test_error"] for r in out.pop("epochs")]
        out["epochs"] = spec["epochs"]
        out["wall_s"] = out.pop("result_written_at") - started  # launcher start -> result.json written
        out["wall_exit_s"] = time.time() - started  # ... -> every rank process exited
    print(json.dumps(out), flush=True)

if __name__ == "__main__":
    main()
