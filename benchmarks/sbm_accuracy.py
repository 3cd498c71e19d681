"""Node classification on a stochastic block model: ``ga.TransformerConv`` against PyG's ``TransformerConv``.

    python benchmarks/sbm_accuracy.py --seeds 5

A heterophilous SBM (edges mostly between blocks: ``p_in < p_out``), node
features = a noisy one-hot of the block, 50% of the nodes labelled for
training, accuracy on the rest. For each seed both models start from the same
weights (``ga.TransformerConv.from_transformer_conv``) and train with the same
optimiser, so equal semantics should give equal accuracy (up to float32
rounding in the long run). Prints the per-seed and mean test accuracies and the
training time of each.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import TransformerConv
from torch_geometric.utils import stochastic_blockmodel_graph

import graphattn as ga


def sbm(seed: int, blocks: int = 4, size: int = 250, p_in: float = 0.01, p_out: float = 0.03, noise: float = 2.0):
    torch.manual_seed(seed)
    probs = torch.full((blocks, blocks), p_out).fill_diagonal_(p_in)
    edge_index = stochastic_blockmodel_graph([size] * blocks, probs)  # (2, E), undirected
    y = torch.arange(blocks).repeat_interleave(size)  # (N,)
    x = F.one_hot(y, blocks).float() + noise * torch.randn(y.numel(), blocks)  # (N, blocks)
    train = torch.rand(y.numel()) < 0.5  # (N,)
    return x, edge_index, y, train


class Net(nn.Module):
    def __init__(self, layer, in_channels: int, hidden: int, heads: int, classes: int, layers: int):
        super().__init__()
        sizes = [in_channels] + [hidden * heads] * (layers - 1)
        self.convs = nn.ModuleList(layer(f, hidden, heads=heads) for f in sizes)
        self.head = nn.Linear(hidden * heads, classes)

    def forward(self, x, edge_index):
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.head(x)


def train(model, data, epochs: int) -> tuple[float, float]:
    x, edge_index, y, mask = data
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3, weight_decay=5e-4)
    start = time.perf_counter()
    for _ in range(epochs):
        optimizer.zero_grad()
        F.cross_entropy(model(x, edge_index)[mask], y[mask]).backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        accuracy = float((model(x, edge_index).argmax(-1)[~mask] == y[~mask]).float().mean())
    return accuracy, seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args(argv)
    results = {"TransformerConv": [], "ga.TransformerConv": []}
    for seed in range(args.seeds):
        data = sbm(seed)
        torch.manual_seed(seed)
        pyg = Net(TransformerConv, data[0].size(1), args.hidden, args.heads, 4, args.layers)
        ours = Net(ga.TransformerConv, data[0].size(1), args.hidden, args.heads, 4, args.layers)
        ours.load_state_dict(pyg.state_dict())
        line = [f"seed {seed}:"]
        for name, model in (("TransformerConv", pyg), ("ga.TransformerConv", ours)):
            accuracy, seconds = train(model, data, args.epochs)
            results[name].append(accuracy)
            line.append(f"{name} {accuracy:.3f} ({seconds:.1f} s)")
        print("  ".join(line), flush=True)
    for name, accs in results.items():
        print(f"{name}: mean test accuracy {sum(accs) / len(accs):.3f} over {len(accs)} seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
