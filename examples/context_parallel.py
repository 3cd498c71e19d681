"""A sequence split across processes: a byte-level causal LM whose attention layer runs context-parallel.

    torchrun --nproc-per-node 2 examples/context_parallel.py --steps 5
    torchrun --nproc-per-node 4 examples/context_parallel.py --length 16384 --window 256

Each process (gloo on CPU; ``--backend nccl`` with one GPU per process) holds
one contiguous block of a long byte sequence (the Python reference
documentation that ships with CPython, ``pydoc_data.topics``). The model is
an embedding, one :class:`graphattn.AttentionConv` over a causal window
(``patterns.window(w, 0)``) with ``context_parallel=`` the world group, and a
next-byte classifier. The layer's exchange plan is built once and reused at
every step: each process receives only the ``w`` rows before its block (a
halo), where ring attention would pass it every other block. The weights are
replicated; each step sums the gradients of all processes (``all_reduce``),
so the copies stay identical. Before training, rank 0 runs the same model on
the whole sequence in one process and prints the largest difference of the
loss and the gradients (float64: about 1e-15).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import graphattn as ga
from graphattn import distributed as gd


class ByteLM(nn.Module):
    def __init__(self, channels: int, heads: int):
        super().__init__()
        self.embed = nn.Embedding(256, channels)
        self.attn = ga.AttentionConv(channels, channels, heads=heads)
        self.head = nn.Linear(channels, 256)

    def forward(self, tokens, graph, group=None):
        h = self.embed(tokens)  # (n, C)
        h = h + self.attn(h, graph, context_parallel=group)  # (n, C)
        return self.head(h)  # (n, 256)


def text_bytes(length: int) -> torch.Tensor:
    from pydoc_data.topics import topics

    data = "\n".join(topics[k] for k in sorted(topics)).encode("utf-8")[: length + 1]
    return torch.tensor(list(data), dtype=torch.long)  # (length + 1,)


def block_loss(model, tokens, targets, graph, group, total: int):
    """This block's share of the mean next-byte loss over the whole sequence."""
    return F.cross_entropy(model(tokens, graph, group), targets, reduction="sum") / total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=8192, help="tokens in the whole sequence")
    parser.add_argument("--window", type=int, default=128, help="keys before each query (causal window)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    args = parser.parse_args(argv)
    dist.init_process_group(args.backend)  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world, group = dist.get_rank(), dist.get_world_size(), dist.group.WORLD
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if args.backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's collectives use the current device
    data = text_bytes(args.length)  # (L + 1,) every process reads the same text, keeps its block
    L = data.numel() - 1
    sizes = [L // world + (r < L % world) for r in range(world)]  # uneven when world does not divide L
    a, b = sum(sizes[:rank]), sum(sizes[: rank + 1])
    tokens, targets = data[a:b].to(device), data[a + 1 : b + 1].to(device)  # (n,), (n,)
    pattern = ga.patterns.window(args.window, 0)  # causal window: query i reads i - w .. i
    plan = gd.plan_for_group(pattern, b - a, group)  # once; reused by every step
    if rank == 0:
        traffic = plan.traffic(args.heads, args.channels // args.heads, element_size=8)
        ring = gd.ring_rows(sizes)
        print(f"{world} processes, L = {L}, blocks {sizes}, pattern {pattern.name}")
        print(f"rows received per process: {traffic['recv_rows']} (ring attention: {ring.tolist()})")

    torch.manual_seed(0)  # the same weights everywhere
    model = ByteLM(args.channels, args.heads).double().to(device)
    check = block_loss(model, tokens, targets, plan, group, L)
    check.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    total = check.detach().clone()
    dist.all_reduce(total)
    if rank == 0:  # the same model on the whole sequence, one process
        ref = ByteLM(args.channels, args.heads).double().to(device)
        ref.load_state_dict(model.state_dict())
        loss = F.cross_entropy(ref(data[:-1].to(device), pattern), data[1:].to(device))
        loss.backward()
        grad_diff = max(float((p.grad - q.grad).abs().max()) for p, q in zip(model.parameters(), ref.parameters()))
        print(
            f"context-parallel vs one process: loss difference {abs(float(total - loss.detach())):.2e}, "
            f"largest gradient difference {grad_diff:.2e}"
        )
    model.zero_grad()

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        loss = block_loss(model, tokens, targets, plan, group, L)
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)  # the sum over blocks: the gradient of the whole sequence's mean loss
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step}: loss {float(total):.4f}")
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(copies, flat)
    if rank == 0:
        print(f"parameters identical on every process: {all(torch.equal(copies[0], c) for c in copies)}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
