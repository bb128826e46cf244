"""Makes the composite form of the multi-input example (committed; seeded): model.pt's three encoders and its
head as four TorchScript modules in one archive, composite.tar, with the manifest composite.json that joins
them. A job may place the modules on a worker's devices (placement.stages), one pipeline stage per device.
The modules start from model.pt's weights, so the composite model computes what model.pt does.

Also writes tests/fixtures/byo/composite_bn.tar: the same with a BatchNorm1d in the numeric encoder (its
running statistics are per micro-batch, in whichever stage holds it).

    pip install torch==2.11.0
    python examples/multi-input/make_composite.py
"""

import io
import json
import os
import tarfile

import torch
from torch import Tensor, nn

from make import MultiInput

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "tests", "fixtures", "byo")

MANIFEST = {"modules": [
    {"name": "encode_numeric", "inputs": ["numeric"]},
    {"name": "encode_sequence", "inputs": ["tokens", "tokens_mask"]},
    {"name": "encode_set", "inputs": ["set", "set_mask"]},
    {"name": "head", "inputs": ["encode_numeric", "encode_sequence", "encode_set"]},
]}


class EncodeNumeric(nn.Module):
    def __init__(self, numeric: nn.Module) -> None:
        super().__init__()
        self.numeric = numeric

    def forward(self, numeric: Tensor) -> Tensor:
        return self.numeric(numeric)


class EncodeSequence(nn.Module):
    """Embedding + GRU, the masked mean of its states."""

    def __init__(self, embed: nn.Module, gru: nn.Module) -> None:
        super().__init__()
        self.embed, self.gru = embed, gru

    def forward(self, tokens: Tensor, tokens_mask: Tensor) -> Tensor:
        states, _ = self.gru(self.embed(tokens))
        m = tokens_mask.unsqueeze(-1)
        return (states * m).sum(1) / m.sum(1).clamp_min(1.0)


class EncodeSet(nn.Module):
    """Deep Sets: phi on each point, the masked sum, rho."""

    def __init__(self, phi: nn.Module, rho: nn.Module) -> None:
        super().__init__()
        self.phi, self.rho = phi, rho

    def forward(self, set: Tensor, set_mask: Tensor) -> Tensor:
        return self.rho((self.phi(set) * set_mask.unsqueeze(-1)).sum(1))


class Head(nn.Module):
    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, numeric: Tensor, sequence: Tensor, set: Tensor) -> Tensor:
        return self.head(torch.cat([numeric, sequence, set], dim=1))


def member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    archive.addfile(info, io.BytesIO(data))


def write(path: str, modules: dict) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        member(archive, "composite.json", json.dumps(MANIFEST, indent=1).encode())
        for name, module in modules.items():
            buffer = io.BytesIO()
            torch.jit.save(torch.jit.script(module), buffer)
            member(archive, f"{name}.pt", buffer.getvalue())
    print(f"{os.path.relpath(path)}: {', '.join(modules)}")


def main() -> None:
    torch.manual_seed(0)
    whole = MultiInput()  # model.pt's weights (make.py seeds and builds it the same way)
    modules = {
        "encode_numeric": EncodeNumeric(whole.numeric),
        "encode_sequence": EncodeSequence(whole.embed, whole.gru),
        "encode_set": EncodeSet(whole.phi, whole.rho),
        "head": Head(whole.head),
    }
    write(os.path.join(HERE, "composite.tar"), modules)
    torch.manual_seed(1)
    numeric = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
    write(os.path.join(FIXTURES, "composite_bn.tar"), dict(modules, encode_numeric=EncodeNumeric(numeric)))


if __name__ == "__main__":
    main()
