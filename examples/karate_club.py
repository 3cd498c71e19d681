"""Train graph attention for node classification on Zachary's karate club.

    python examples/karate_club.py --epochs 200 --features pe --seeds 3

``AttentionConv`` attends along the friendship graph (plus self-loops, which
the layer never adds by itself: the graph you pass is the attention you get).
The node features are the one-hot identities (``onehot``), or a constant plus
``--pe`` Laplacian eigenvectors (``pe``: positions for a graph), or both. Four
nodes are labelled (one per community); the accuracy is on the other 30. The
data ships with PyTorch Geometric (``KarateClub``): nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch import nn
from torch_geometric.datasets import KarateClub
from torch_geometric.utils import add_self_loops
from tqdm.auto import tqdm

import graphattn as ga


class GraphAttentionNet(nn.Module):
    """Two AttentionConv layers: F_in -> hidden (H heads) -> classes."""

    def __init__(self, in_channels: int, hidden: int, classes: int, heads: int = 2):
        super().__init__()
        self.conv1 = ga.AttentionConv(in_channels, hidden, heads=heads)
        self.conv2 = ga.AttentionConv(hidden, classes, heads=1)

    def forward(self, x, edge_index):
        return self.conv2(F.elu(self.conv1(x, edge_index)), edge_index)  # (N, classes)


def features(data, kind: str, pe: int) -> torch.Tensor:
    """Node features (N, F) of the chosen kind."""
    ones = torch.ones(data.num_nodes, 1)
    if kind == "onehot":
        return data.x
    lap = T.AddLaplacianEigenvectorPE(k=pe, attr_name="pe", is_undirected=True)(data.clone()).pe  # (N, pe)
    return torch.cat([ones, lap], dim=1) if kind == "pe" else torch.cat([data.x, lap], dim=1)


def train(data, x, edge_index, epochs: int, seed: int, hidden: int, progress: bool) -> float:
    """Train one model; return the test accuracy in [0, 1]."""
    torch.manual_seed(seed)
    model = GraphAttentionNet(x.size(1), hidden, int(data.y.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in tqdm(range(epochs), desc=f"seed {seed}", disable=not progress, leave=False):
        opt.zero_grad()
        loss = F.cross_entropy(model(x, edge_index)[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(x, edge_index).argmax(dim=1)  # (N,)
    test = ~data.train_mask
    return (pred[test] == data.y[test]).float().mean().item()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=200, help="training epochs (default 200)")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds, from 0 (default 3)")
    parser.add_argument(
        "--features", choices=["onehot", "pe", "onehot+pe"], default="onehot", help="node features (default onehot)"
    )
    parser.add_argument("--pe", type=int, default=4, help="Laplacian eigenvectors for 'pe' (default 4)")
    parser.add_argument("--hidden", type=int, default=16, help="hidden channels (default 16)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: on 34 nodes more threads only add overhead)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.seeds < 1 or not 1 <= args.pe < 33:
        print(
            f"Expected --epochs >= 1, --seeds >= 1 and 1 <= --pe <= 32 (got {args.epochs}, {args.seeds}, {args.pe})",
            file=sys.stderr,
        )
        return 2

    torch.set_num_threads(max(1, args.threads))
    data = KarateClub()[0]
    torch.manual_seed(0)  # the eigenvectors' random signs
    x = features(data, args.features, args.pe)
    edge_index, _ = add_self_loops(data.edge_index, num_nodes=data.num_nodes)  # (2, 156 + 34)
    print(
        f"karate club: {data.num_nodes} nodes, {data.edge_index.size(1)} directed edges + "
        f"{data.num_nodes} self-loops, features {args.features} ({x.size(1)} channels), "
        f"{int(data.train_mask.sum())} labelled nodes"
    )
    accuracies = [
        train(data, x, edge_index, args.epochs, seed, args.hidden, not args.quiet) for seed in range(args.seeds)
    ]
    for seed, acc in enumerate(accuracies):
        print(f"seed {seed}: test accuracy {acc:.3f}")
    mean = sum(accuracies) / len(accuracies)
    print(f"mean test accuracy over {len(accuracies)} seeds: {mean:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
