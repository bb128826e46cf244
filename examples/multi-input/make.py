"""Makes the files of ringtrain's bring-your-own-model example (committed; seeded: running this again
rewrites data.safetensors bit for bit and model.pt with the same weights): a TorchScript model with three
sub-networks and a multi-input data set whose label depends on all three inputs.

    pip install torch==2.11.0 safetensors numpy
    python examples/multi-input/make.py          # writes model.pt and data.safetensors next to this file
    python examples/multi-input/make.py --check trained.pt   # evaluates a trained model on the test split

The objects: each has a fixed-length numeric vector (8 floats), a sequence of 4 to 16 tokens (ids < 20,
padded to 16, with a mask), and an unordered set of 2 to 10 points in R^4 (padded to 10, with a mask). The
label (3 classes) is the sign band of a sum of three standardised terms: a linear function of the vector, the
share of token 3 minus the share of token 5 in the sequence, and the masked sum of relu(first coordinate)
over the set. No two of the inputs are enough.
"""

import argparse
import os

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN, TEST = 4000, 1000
D, T, VOCAB, S, E, CLASSES = 8, 16, 20, 10, 4, 3


class MultiInput(nn.Module):
    """An MLP on the vector, an embedding + GRU on the sequence (masked mean of its states), Deep Sets
    (phi, masked sum, rho) on the set, joined by an MLP head. No BatchNorm: per-rank statistics are not
    needed here (ringtrain supports BatchNorm in uploaded models too, per rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.numeric = nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.embed = nn.Embedding(VOCAB, 16)
        self.gru = nn.GRU(16, 32, batch_first=True)
        self.phi = nn.Sequential(nn.Linear(E, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.rho = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def forward(self, numeric: Tensor, tokens: Tensor, tokens_mask: Tensor, set: Tensor, set_mask: Tensor) -> Tensor:
        a = self.numeric(numeric)
        states, _ = self.gru(self.embed(tokens))
        m = tokens_mask.unsqueeze(-1)
        b = (states * m).sum(1) / m.sum(1).clamp_min(1.0)
        c = self.rho((self.phi(set) * set_mask.unsqueeze(-1)).sum(1))
        return self.head(torch.cat([a, b, c], dim=1))


def make_data(n: int, g: torch.Generator, w: Tensor) -> dict:
    numeric = torch.randn(n, D, generator=g)
    lengths = torch.randint(4, T + 1, (n,), generator=g)
    tokens_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    tokens = torch.randint(0, VOCAB, (n, T), generator=g) * tokens_mask.long()
    sizes = torch.randint(2, S + 1, (n,), generator=g)
    set_mask = (torch.arange(S).unsqueeze(0) < sizes.unsqueeze(1)).float()
    points = torch.randn(n, S, E, generator=g) * set_mask.unsqueeze(-1)
    share = lambda tok: ((tokens == tok).float() * tokens_mask).sum(1) / lengths.float()
    terms = [numeric @ w, share(3) - share(5), (points[:, :, 0].relu() * set_mask).sum(1)]
    return {"numeric": numeric, "tokens": tokens, "tokens_mask": tokens_mask, "set": points,
            "set_mask": set_mask, "terms": terms}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", help="a trained model.pt to evaluate on the test split")
    args = parser.parse_args()
    inputs = ["numeric", "tokens", "tokens_mask", "set", "set_mask"]
    if args.check:
        data = load_file(os.path.join(HERE, "data.safetensors"))
        model = torch.jit.load(args.check).eval()
        with torch.no_grad():
            logits = model(*[data[f"x_test.{name}"] for name in inputs])
        error = (logits.argmax(1) != data["y_test"]).float().mean().item()
        print(f"test error of {args.check}: {error:.4f}")
        return

    g = torch.Generator().manual_seed(2017)
    w = torch.randn(D, generator=g) / D**0.5
    train, test = make_data(TRAIN, g, w), make_data(TEST, g, w)
    # standardise each term with the training split's mean and std, so that each weighs the same
    stats = [(t.mean(), t.std()) for t in train["terms"]]

    def labels(split: dict) -> Tensor:
        score = sum((t - m) / s for t, (m, s) in zip(split["terms"], stats))
        return (score > -0.75).long() + (score > 0.75).long()

    tensors = {}
    for prefix, split in (("x", train), ("x_test", test)):
        for name in inputs:
            tensors[f"{prefix}.{name}"] = split[name].contiguous()
    tensors["y"], tensors["y_test"] = labels(train), labels(test)
    save_file(tensors, os.path.join(HERE, "data.safetensors"))

    torch.manual_seed(0)
    scripted = torch.jit.script(MultiInput())
    scripted.save(os.path.join(HERE, "model.pt"))
    counts = torch.bincount(tensors["y"], minlength=CLASSES).tolist()
    params = sum(p.numel() for p in scripted.parameters())
    print(f"model.pt: {params} parameters; data.safetensors: {TRAIN} train / {TEST} test, classes {counts}")


if __name__ == "__main__":
    main()
