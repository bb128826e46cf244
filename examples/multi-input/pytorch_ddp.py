"""The reference for the worked example's figures: the same model, data and recipe trained by PyTorch
DistributedDataParallel over Gloo, 2 processes of one thread each (what torchrun --nproc_per_node 2 does),
on the same machine as `ringtrain train --local 2`. Prints samples/s over the training steps, wall time and
the final test error, as ringtrain's result.json reports them.

    pip install torch==2.11.0 safetensors
    python examples/multi-input/pytorch_ddp.py
"""

import math
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file
from torch.nn.parallel import DistributedDataParallel

HERE = os.path.dirname(os.path.abspath(__file__))
INPUTS = ["numeric", "tokens", "tokens_mask", "set", "set_mask"]
WORLD, BATCH, EPOCHS, LR, WARMUP_EPOCHS = 2, 32, 6, 0.05, 1


def run(rank: int, port: int, out: dict) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    data = load_file(os.path.join(HERE, "data.safetensors"))
    model = DistributedDataParallel(torch.jit.load(os.path.join(HERE, "model.pt")))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, nesterov=True, weight_decay=1e-4)
    n = data["y"].shape[0]
    steps = n // (WORLD * BATCH)
    total, warmup = steps * EPOCHS, steps * WARMUP_EPOCHS
    train_time, it = 0.0, 0
    started = time.perf_counter()
    for epoch in range(EPOCHS):
        g = torch.Generator().manual_seed(epoch)
        shard = torch.randperm(n, generator=g)[rank * (n // WORLD):(rank + 1) * (n // WORLD)]
        model.train()
        t0 = time.perf_counter()
        for s in range(steps):
            idx = shard[s * BATCH:(s + 1) * BATCH]
            # gradual warmup, then half-cosine to 0 (ringtrain's schedule for this spec)
            lr = LR if it < warmup else LR * 0.5 * (1 + math.cos(math.pi * (it - warmup) / (total - warmup)))
            for group in opt.param_groups:
                group["lr"] = lr
            loss = torch.nn.functional.cross_entropy(model(*[data[f"x.{k}"][idx] for k in INPUTS]), data["y"][idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            it += 1
        train_time += time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            logits = model.module(*[data[f"x_test.{k}"] for k in INPUTS])
            error = (logits.argmax(1) != data["y_test"]).float().mean().item()
    if rank == 0:
        out["samples_per_s"] = total * WORLD * BATCH / train_time
        out["wall_seconds"] = time.perf_counter() - started
        out["final_test_error"] = error
    dist.destroy_process_group()


if __name__ == "__main__":
    with mp.Manager() as manager:
        out = manager.dict()
        port = 29500 + os.getpid() % 1000
        mp.spawn(run, args=(port, out), nprocs=WORLD)
        print(f"PyTorch DDP (gloo, {WORLD} processes): {out['samples_per_s']:.0f} samples/s, "
              f"{out['wall_seconds']:.1f} s wall, final test error {out['final_test_error']:.4f}")
