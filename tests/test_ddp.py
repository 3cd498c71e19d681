"""DistributedDataParallel over graphattn layers: 2 CPU processes (gloo) give single-process gradients."""

import datetime
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import graphattn as ga


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = ga.TransformerConv(4, 3, heads=2, edge_dim=2)
        self.conv2 = ga.AttentionConv(6, 4, heads=2)

    def forward(self, x, edge_index, edge_attr):
        return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index)


def _shards():
    """Two graphs of equal size (one per rank), as (x, edge_index, edge_attr)."""
    g = torch.Generator().manual_seed(1)
    shards = []
    for _ in range(2):
        edge_index = torch.randint(0, 10, (2, 30), generator=g)
        shards.append(
            (
                torch.randn(10, 4, generator=g, dtype=torch.float64),
                edge_index,
                torch.randn(30, 2, generator=g, dtype=torch.float64),
            )
        )
    return shards


def _loss(model, shard):
    return model(*shard).square().mean()


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Net().double())
    _loss(model, _shards()[rank]).backward()
    grads = {name: p.grad for name, p in model.module.named_parameters()}
    torch.save(grads, os.path.join(out_dir, f"grads{rank}.pt"))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_ddp_gradients_equal_single_process(tmp_path):
    """Reference: the same model trained in one process on both shards (DDP averages the ranks' gradients).

    The two ranks run in a fresh interpreter (``python tests/test_ddp.py OUT``), which forks them before
    any torch thread pool exists: forking the pytest process after earlier tests have used OpenMP can
    deadlock the children. The subprocess has a time limit, so a hang fails the test instead of CI.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    torch.manual_seed(0)
    model = Net().double()
    loss = sum(_loss(model, shard) for shard in _shards()) / 2  # DDP averages the ranks' gradients
    loss.backward()
    for rank in range(2):
        grads = torch.load(tmp_path / f"grads{rank}.pt")
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, atol=1e-10, rtol=0)


if __name__ == "__main__":  # the two ranks, forked from this fresh interpreter (see the test's docstring)
    mp.start_processes(_worker, args=(_free_port(), sys.argv[1]), nprocs=2, join=True, start_method="fork")
