"""Data-parallel training of a graph transformer with ``DistributedDataParallel`` on CPU processes.

    python examples/ddp.py --procs 2 --epochs 3

Each process (``gloo`` backend, one per CPU worker) holds a copy of a model of
:class:`graphattn.TransformerConv` layers, reads its own shard of the graphs
(``DistributedSampler``), and DDP averages the gradients after every backward,
so all copies stay equal (checked at the end). The same script runs on GPUs
with ``--backend nccl`` and one process per device. The data is PyG's
``FakeDataset`` (generated offline); the label of a graph is whether its nodes'
first feature sums to more than zero.
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler
from torch_geometric.datasets import FakeDataset
from torch_geometric.loader import DataLoader
from torch_geometric.nn import global_mean_pool

import graphattn as ga


class GraphTransformer(nn.Module):
    def __init__(self, in_channels: int, hidden: int, heads: int, classes: int):
        super().__init__()
        self.conv1 = ga.TransformerConv(in_channels, hidden, heads=heads)
        self.conv2 = ga.TransformerConv(hidden * heads, hidden, heads=heads, concat=False)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x, edge_index, batch):
        h = self.conv2(self.conv1(x, edge_index).relu(), edge_index).relu()  # (N, hidden)
        return self.head(global_mean_pool(h, batch))  # (B, classes)


def dataset(graphs: int):
    torch.manual_seed(0)  # the same graphs in every process
    items = []
    for g in FakeDataset(num_graphs=graphs, avg_num_nodes=20, num_channels=8, num_classes=2, task="graph"):
        g.y = (g.x[:, 0].sum() > 0).long().view(1)
        items.append(g)
    return items


def worker(rank: int, world: int, port: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    torch.manual_seed(0)  # DDP also broadcasts rank 0's weights at construction
    model = DistributedDataParallel(GraphTransformer(8, args.hidden, args.heads, 2))
    data = dataset(args.graphs)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for batch in loader:
            loss = F.cross_entropy(model(batch.x, batch.edge_index, batch.batch), batch.y)
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces (averages) the gradients here
            optimizer.step()
            total += torch.tensor([float(loss.detach()) * batch.num_graphs, batch.num_graphs])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: mean train loss {float(total[0] / total[1]):.4f} over {int(total[1])} graphs")
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(copies, flat)
    if rank == 0:
        same = all(torch.equal(copies[0], c) for c in copies)
        print(f"{world} processes, parameters identical on every rank: {same}")
    dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--graphs", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    args = parser.parse_args(argv)
    if args.procs < 1:
        parser.error(f"Expected '--procs' to be a positive int (got {args.procs})")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.procs, port, args), nprocs=args.procs, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
