#!/usr/bin/env python3
"""The PyTorch eager reference that `ringtrain bench train --model resnet50` is compared with (check.sh).

torchvision's ResNet-50 (num_classes=1000; an equivalent one built here when torchvision is missing), SGD with
lr 0.1, momentum 0.9, weight decay 1e-4 and PyTorch's default implementation (foreach on CUDA), cross-entropy.
Each step uploads a uint8 batch (and its int64 labels) from host memory and normalises it on the device, as
ringtrain does; `--precision bf16` runs forward and loss under torch.autocast(bfloat16), the backward pass
following it, with float32 weights and optimizer (PyTorch's AMP; bf16 needs no loss scaling).
cudnn.benchmark stays off and the TF32 settings stay at PyTorch's defaults (cuDNN on, matmul off), as in
libtorch. `--warmup` untimed steps, then `--steps` timed between two torch.cuda.synchronize() calls.

Prints one JSON line:
{"impl": "pytorch-eager", "precision": .., "batch": .., "samples_per_s": .., "step_ms": .., ...}
"""

import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (ResNet v1.5: the stride sits on the 3×3 convolution)."""

    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """The same layers, parameters and arithmetic as torchvision.models.resnet50()."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(64, 3, 1)
        self.layer2 = self._stage(128, 4, 2)
        self.layer3 = self._stage(256, 6, 2)
        self.layer4 = self._stage(512, 3, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _stage(self, planes, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * Bottleneck.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_model(classes):
    try:
        import torchvision

        return torchvision.models.resnet50(num_classes=classes), f"torchvision {torchvision.__version__}"
    except ImportError:
        return ResNet50(num_classes=classes), "built-in (torchvision missing)"


def setting(read):
    """A backend flag for the record (None where this torch no longer reads it that way)."""
    try:
        return read()
    except Exception:  # noqa: BLE001 - only reported, never needed
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke test only)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--pool", type=int, default=0, help="host images cycled through (default 2 batches)")
    parser.add_argument("--item-each-step", action="store_true", help="read loss.item() every step (a host sync)")
    args = parser.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("resnet50_eager.py: torch sees no CUDA device")
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False

    model, model_source = build_model(args.classes)
    model = model.to(device).train()
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)

    # Host data as ringtrain holds it: uint8 images and int64 labels, one contiguous slice per step.
    pool = max(args.pool, 2 * args.batch)
    size = args.image_size
    images = torch.randint(0, 256, (pool, 3, size, size), dtype=torch.uint8)
    labels = torch.randint(0, args.classes, (pool,), dtype=torch.int64)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)
    bf16 = args.precision == "bf16"

    def step(i):
        start = (i * args.batch) % (pool - args.batch + 1)
        x = images[start : start + args.batch].to(device)
        y = labels[start : start + args.batch].to(device)
        x = (x.float().mul_(1.0 / 255.0) - mean) / std
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item() if args.item_each_step else loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for i in range(args.warmup):
        step(i)
    sync()
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    sync()
    seconds = time.perf_counter() - t0
    loss = float(loss)

    print(
        json.dumps(
            {
                "impl": "pytorch-eager",
                "precision": args.precision,
                "batch": args.batch,
                "samples_per_s": args.batch * args.steps / seconds,
                "step_ms": 1e3 * seconds / args.steps,
                "steps": args.steps,
                "warmup": args.warmup,
                "loss": loss,
                "model": model_source,
                "params": params,
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                "cudnn_tf32": setting(lambda: torch.backends.cudnn.allow_tf32),
                "matmul_tf32": setting(lambda: torch.backends.cuda.matmul.allow_tf32),
                "item_each_step": args.item_each_step,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
