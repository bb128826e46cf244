#!/usr/bin/env python3
"""PyTorch's input pipeline on ringtrain's shards, the reference of `ringtrain-bench data` (issue 55): the
training split of a sharded data set (index.json and its tar shards, as `ringtrain datasets pack` writes
them) read by a torch.utils.data.DataLoader: each sample's bytes read by offset, decoded, augmented by
torchvision.transforms.v2 (RandomResizedCrop(size, antialias=True), RandomHorizontalFlip), made a uint8
tensor, collated into batches, shuffled, num_workers processes each with one torch thread (0: in the main
process). Two decoders, two kinds of PyTorch user:
  --decoder torchvision: torchvision.io.decode_image (libjpeg-turbo) into a tensor, transformed as one:
                         torchvision's fastest CPU path;
  --decoder pil:         PIL.Image.open(...).convert("RGB"), transformed as a PIL image, then
                         PILToTensor: what torchvision's ImageFolder (its default_loader) does.

  pytorch_data.py --shards DIR [--decoder torchvision|pil] [--size 224] [--batch 64] [--workers 2]
                  [--batches 40]

Prints one JSON object: images/s over the timed batches (after two warm-up batches) and per core, counting
max(workers, 1) cores: `ringtrain-bench data` runs it under `taskset` on that many cores, so the main
process's collating shares them.
"""

import argparse
import io
import json
import os
import tarfile
import time

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2


class Shards(Dataset):
    def __init__(self, folder, size, decoder):
        with open(os.path.join(folder, "index.json")) as f:
            index = json.load(f)
        self.items = []  # (shard path, offset, size, class)
        for shard in index["train"]["shards"]:
            path = os.path.join(folder, shard["name"])
            samples = {}
            with tarfile.open(path) as tar:
                for member in tar.getmembers():
                    key, _, ext = member.name.partition(".")
                    entry = samples.setdefault(key, {})
                    if ext == "cls":
                        entry["class"] = int(tar.extractfile(member).read())
                    elif ext in ("jpg", "jpeg", "png"):
                        entry["image"] = (member.offset_data, member.size)
            for key in sorted(samples):
                offset, length = samples[key]["image"]
                self.items.append((path, offset, length, samples[key]["class"]))
        self.transform = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])
        self.decoder = decoder
        self.to_tensor = v2.PILToTensor()
        self.files = {}

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, offset, length, label = self.items[i]
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = open(path, "rb")
        data = os.pread(f.fileno(), length, offset)
        if self.decoder == "pil":
            from PIL import Image

            return self.to_tensor(self.transform(Image.open(io.BytesIO(data)).convert("RGB"))), label
        image = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        return self.transform(image), label


def one_thread(_worker_id):
    torch.set_num_threads(1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", required=True)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--decoder", choices=["torchvision", "pil"], default="torchvision")
    a = p.parse_args()
    torch.set_num_threads(1)
    data = Shards(a.shards, a.size, a.decoder)
    loader = DataLoader(data, batch_size=a.batch, shuffle=True, num_workers=a.workers, worker_init_fn=one_thread,
                        drop_last=True, persistent_workers=a.workers > 0, prefetch_factor=2 if a.workers else None)
    warmup, timed, started = 2, 0, None
    for i, (images, labels) in enumerate(loader):
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, a.size, a.size), images.shape
        if i + 1 == warmup:
            started = time.perf_counter()
        elif i + 1 > warmup:
            timed += 1
            if timed == a.batches:
                break
    seconds = time.perf_counter() - started
    rate = timed * a.batch / seconds
    cores = max(a.workers, 1)
    print(json.dumps({"impl": f"pytorch-dataloader-{a.decoder}", "workers": a.workers, "batch": a.batch, "size": a.size,
                      "batches": timed, "seconds": seconds, "images_per_s": rate, "per_core": rate / cores,
                      "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
