"""Mini-batch training on sampled subgraphs, in the layout of PyG's ``NeighborLoader``.

    python examples/minibatch.py --nodes 3000 --epochs 3
    python examples/minibatch.py --dtype float64     # the exactness check to 1e-10

``NeighborLoader`` needs ``pyg-lib`` or ``torch-sparse`` (compiled extensions);
:func:`sample` below builds the same layout from plain torch: for seed nodes
(the batch), up to ``fanout[0]`` incoming edges of each seed, then up to
``fanout[1]`` incoming edges of each node reached for the first time, and so
on (``-1``: every edge). A batch carries ``n_id`` (the seeds first, then the
nodes in the order they were reached), ``batch_size`` (the number of seeds),
``e_id`` and an ``edge_index`` in local ids (row 0 = source j, row 1 = target i),
so training code written for ``NeighborLoader`` runs on it unchanged:
``out = model(batch.x, batch.edge_index)[:batch.batch_size]``.

The model is two :class:`graphattn.TransformerConv` layers on a stochastic block
model graph whose node features carry a weak class signal (neighbours help).
Every layer call sees a new subgraph, so each one builds its structure once
(the cache keys on the ``edge_index`` tensor; both layers of a batch share it).
At the end, inference on sampled batches with ``fanout = [-1, -1]`` (the whole
2-hop in-neighbourhood of the seeds) is compared with full-graph inference: the
seeds' outputs are equal (to rounding).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data
from torch_geometric.utils import sort_edge_index, stochastic_blockmodel_graph

import graphattn as ga


def sample(
    seeds: torch.Tensor,
    ptr: torch.Tensor,
    src: torch.Tensor,
    fanout: list[int],
    x,
    y,
    generator: torch.Generator | None = None,
) -> Data:
    """``NeighborLoader``'s batch for ``seeds``: ``x, y, edge_index`` in local ids, ``n_id``, ``e_id``, ``batch_size``.

    ``ptr (N + 1,)`` and ``src (E,)`` are the graph's edges sorted by target (CSC):
    the sources of the edges into node i are ``src[ptr[i]:ptr[i + 1]]``.
    """
    N = ptr.numel() - 1
    local = torch.full((N,), -1, dtype=torch.long)  # global id -> local id, -1 not reached
    local[seeds] = torch.arange(seeds.numel())
    n_id, frontier, rows, cols, e_ids = [seeds], seeds, [], [], []
    for k in fanout:
        deg = ptr[frontier + 1] - ptr[frontier]  # (F,) in-degree of each frontier node
        owner = torch.arange(frontier.numel()).repeat_interleave(deg)  # (C,) candidate edge -> frontier slot
        start = torch.cumsum(deg, 0) - deg  # (F,) first candidate of each slot
        edge = ptr[frontier][owner] + torch.arange(owner.numel()) - start[owner]  # (C,) edge ids
        if k >= 0:  # k edges per node, uniformly without replacement: a random order within each slot
            order = torch.rand(owner.numel(), generator=generator).argsort()  # (C,)
            order = order[owner[order].argsort(stable=True)]  # (C,) grouped by slot, random within
            edge, owner = edge[order], owner[order]
            keep = torch.arange(owner.numel()) - start[owner] < k  # (C,) the first k of each slot
            edge, owner = edge[keep], owner[keep]
        sources = src[edge]  # (C',) global source ids
        new = sources[local[sources] < 0]
        if new.numel():  # nodes reached for the first time, in the order of first appearance
            uniq, inverse = torch.unique(new, return_inverse=True)
            first = torch.full((uniq.numel(),), new.numel()).scatter_reduce_(
                0, inverse, torch.arange(new.numel()), "amin"
            )
            new = uniq[first.argsort()]
            local[new] = sum(t.numel() for t in n_id) + torch.arange(new.numel())
            n_id.append(new)
        rows.append(local[sources])
        cols.append(local[frontier[owner]])
        e_ids.append(edge)
        frontier = new
    n_id = torch.cat(n_id)
    edge_index = torch.stack([torch.cat(rows), torch.cat(cols)])  # (2, E_batch) local ids
    return Data(x=x[n_id], y=y[n_id], edge_index=edge_index, n_id=n_id, e_id=torch.cat(e_ids), batch_size=seeds.numel())


class Net(nn.Module):
    def __init__(self, in_channels: int, hidden: int, heads: int, classes: int):
        super().__init__()
        self.conv1 = ga.TransformerConv(in_channels, hidden, heads=heads)
        self.conv2 = ga.TransformerConv(hidden * heads, classes, heads=heads, concat=False)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)  # (N, classes)


def sbm_graph(nodes: int, blocks: int, features: int, seed: int):
    """A stochastic block model: ``x (N, F)`` noisy class centroids, ``y (N,)``, ``edge_index (2, E)``."""
    g = torch.Generator().manual_seed(seed)
    sizes = [nodes // blocks + (b < nodes % blocks) for b in range(blocks)]
    torch.manual_seed(seed)
    n = nodes / blocks  # about 8 in-block and 2 per other block edges into each node
    probs = [[8.0 / n if a == b else 2.0 / n for b in range(blocks)] for a in range(blocks)]
    edge_index = stochastic_blockmodel_graph(sizes, probs, directed=True)  # (2, E)
    y = torch.arange(blocks).repeat_interleave(torch.tensor(sizes))
    x = 0.4 * torch.randn(blocks, features, generator=g)[y] + torch.randn(nodes, features, generator=g)
    return x, y, edge_index


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--fanout", default="10,10", help="edges sampled per node and hop, -1 = all")
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.nodes < 2 * args.blocks or args.epochs < 0 or args.batch_size < 1:
        parser.error(
            f"Expected '--nodes' >= 2 * blocks, '--epochs' >= 0 and '--batch-size' >= 1 "
            f"(got {args.nodes}, {args.epochs}, {args.batch_size})"
        )
    dtype = getattr(torch, args.dtype)
    fanout = [int(k) for k in args.fanout.split(",")]
    x, y, edge_index = sbm_graph(args.nodes, args.blocks, 16, args.seed)
    x = x.to(dtype)
    edge_index = sort_edge_index(edge_index, sort_by_row=False)  # by target: CSC
    ptr = torch.nn.functional.pad(torch.bincount(edge_index[1], minlength=args.nodes).cumsum(0), (1, 0))  # (N + 1,)
    src = edge_index[0]
    g = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(args.nodes, generator=g)
    train, test = perm[: args.nodes // 2], perm[args.nodes // 2 :]
    print(
        f"{args.nodes} nodes, {edge_index.size(1)} edges, {args.blocks} classes; "
        f"fanout {fanout}, batch size {args.batch_size}"
    )

    torch.manual_seed(args.seed)
    model = Net(16, args.hidden, args.heads, args.blocks).to(dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        model.train()
        t0, total = time.perf_counter(), 0.0
        for seeds in train[torch.randperm(train.numel(), generator=g)].split(args.batch_size):
            batch = sample(seeds, ptr, src, fanout, x, y, g)
            out = model(batch.x, batch.edge_index)[: batch.batch_size]  # (B, classes): the seeds only
            loss = F.cross_entropy(out, batch.y[: batch.batch_size])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * batch.batch_size
        print(f"epoch {epoch}: loss {total / train.numel():.4f}, {time.perf_counter() - t0:.2f} s")

    model.eval()
    with torch.no_grad():
        full = model(x, edge_index)  # (N, classes): full-graph inference
        parts = [
            (seeds, model(b.x, b.edge_index)[: b.batch_size])
            for seeds in test.split(args.batch_size)
            for b in [sample(seeds, ptr, src, [-1, -1], x, y)]
        ]
    seeds = torch.cat([s for s, _ in parts])
    sampled = torch.cat([o for _, o in parts])  # (T, classes)
    diff = float((sampled - full[seeds]).abs().max())
    accuracy = float((full[test].argmax(-1) == y[test]).double().mean())
    print(f"test accuracy {accuracy:.3f}")
    print(f"sampled 2-hop batches vs full graph on {seeds.numel()} seeds: max |diff| {diff:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
