"""Train a GraphGPS model (``torch_geometric.nn.GPSConv``) with graphattn's global attention.

    python examples/gps.py --graphs 400 --epochs 5

``GPSConv`` combines a local message-passing layer (here ``GINConv``) with
global attention over all nodes of each graph. :func:`graphattn.gps.use_graphattn`
replaces every ``GPSConv`` by :class:`graphattn.gps.GPSConv` (the same
submodules and weights, the same outputs), whose global attention runs on the
node layout (projections on the real nodes only, attention within each graph
on graphattn's ragged operator) instead of over the padded ``to_dense_batch`` layout. The data is
PyG's ``FakeDataset`` (random graphs, generated offline); the label of a graph
is whether its nodes' first feature sums to more than zero, a global signal
the attention can pick up. The script trains the stock and the graphattn model
from the same initial weights and prints both (their losses agree up to
dropout bits and float noise) and the time per epoch.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.datasets import FakeDataset
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GINConv, GPSConv, global_add_pool

from graphattn.gps import use_graphattn


class GPS(nn.Module):
    """``F_in -> channels``, ``layers`` GPSConv blocks (GIN local + global attention), sum pool, classifier."""

    def __init__(self, in_channels: int, channels: int, layers: int, heads: int, classes: int):
        super().__init__()
        self.embed = nn.Linear(in_channels, channels)
        self.blocks = nn.ModuleList(
            GPSConv(
                channels,
                GINConv(nn.Sequential(nn.Linear(channels, channels), nn.ReLU(), nn.Linear(channels, channels))),
                heads=heads,
                dropout=0.1,
            )
            for _ in range(layers)
        )
        self.head = nn.Linear(channels, classes)

    def forward(self, x, edge_index, batch):
        h = self.embed(x)  # (N, channels)
        for block in self.blocks:
            h = block(h, edge_index, batch)  # (N, channels)
        return self.head(global_add_pool(h, batch))  # (B, classes)


def make_data(graphs: int, seed: int):
    torch.manual_seed(seed)
    data = FakeDataset(num_graphs=graphs, avg_num_nodes=30, avg_degree=4, num_channels=8, num_classes=2, task="graph")
    items = []
    for g in data:
        g.y = (g.x[:, 0].sum() > 0).long().view(1)
        items.append(g)
    split = int(0.8 * len(items))
    return items[:split], items[split:]


def run_epoch(model, loader, optimizer=None) -> tuple[float, float]:
    """Mean loss and accuracy over ``loader``; trains when an optimizer is given."""
    model.train(optimizer is not None)
    total, correct, count = 0.0, 0, 0
    for batch in loader:
        with torch.set_grad_enabled(optimizer is not None):
            logits = model(batch.x, batch.edge_index, batch.batch)
            loss = F.cross_entropy(logits, batch.y)
        if optimizer is not None:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        total += float(loss.detach()) * batch.num_graphs
        correct += int((logits.argmax(-1) == batch.y).sum())
        count += batch.num_graphs
    return total / count, correct / count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=int, default=400)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train, test = make_data(args.graphs, args.seed)
    torch.manual_seed(args.seed)
    stock = GPS(8, args.channels, args.layers, args.heads, 2)
    models = {"stock nn.MultiheadAttention": stock, "graphattn GPSConv": use_graphattn(copy.deepcopy(stock))}
    print(f"{len(train)} training and {len(test)} test graphs, {sum(g.num_nodes for g in train)} training nodes")
    for name, model in models.items():
        torch.manual_seed(args.seed)
        loader = DataLoader(train, batch_size=32, shuffle=True)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        start = time.perf_counter()
        for _ in range(args.epochs):
            loss, acc = run_epoch(model, loader, optimizer)
        seconds = (time.perf_counter() - start) / max(args.epochs, 1)
        _, test_acc = run_epoch(model, DataLoader(test, batch_size=64))
        print(f"{name}: final train loss {loss:.4f}, test accuracy {test_acc:.3f}, {seconds:.2f} s per epoch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
