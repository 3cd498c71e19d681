"""Context-parallel attention (graphattn.distributed) equals single-process ``ga.attention``.

The reference is ``ga.attention`` on the whole sequence in one process; the
distributed run is 2 and 4 gloo processes, each holding one block. Outputs and
gradients (query, key, value, edge_bias) in float64 to 1e-10.
"""

import datetime
import itertools
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import graphattn as ga
from graphattn import distributed as gd
from graphattn import patterns as P

H, D, D_V = 2, 3, 4
SIZES = {2: [7, 12], 4: [5, 0, 9, 6]}  # uneven blocks; rank 1 of 4 owns nothing


def _edge_list(L: int) -> torch.Tensor:
    """Random edges with duplicates; queries 0, 3 and 11 read nothing (the zero-row rule)."""
    g = torch.Generator().manual_seed(3)
    ei = torch.randint(0, L, (2, 4 * L), generator=g)  # (2, 4L)
    keep = ~torch.isin(ei[1], torch.tensor([0, 3, 11]))
    return torch.cat([ei[:, keep], ei[:, keep][:, :5]], 1)  # 5 duplicated edges


def _block_diagonal(sizes) -> torch.Tensor:
    """Every block attends only to itself: no process receives anything (no collective runs)."""
    bounds = gd.block_bounds(sizes).tolist()
    parts = [P.full().edge_index(b - a) + a for a, b in itertools.pairwise(bounds) if b > a]
    return torch.cat(parts, 1)  # (2, E)


def _cases(world: int):
    """(name, graph, with_bias): the same list in the worker processes and in the test."""
    L = sum(SIZES[world])
    return [
        ("window_2_1", P.window(2, 1), True),
        ("window_2_0", P.window(2, 0), False),  # rank 0 receives nothing
        ("strided_3", P.strided(3), True),
        ("bigbird", P.bigbird(block=2, window_blocks=3, global_blocks=2, random_blocks=1, seed=4), True),
        ("random_3", P.random(3, seed=1), False),
        ("full", P.full(), True),
        ("causal", P.causal(), False),
        ("window|global", P.window(1, 1) | P.global_tokens([6]), False),
        ("edge_list", _edge_list(L), True),
        ("block_diagonal", _block_diagonal(SIZES[world]), True),
    ]


def _inputs(name: str, L: int, E: int):
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    q, k = (torch.randn(L, H, D, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(L, H, D_V, generator=g, dtype=torch.float64)
    bias = torch.randn(E, H, generator=g, dtype=torch.float64)
    grad = torch.randn(L, H, D_V, generator=g, dtype=torch.float64)  # dLoss/dOutput
    return q, k, v, bias, grad


def _num_edges(graph, L):
    return graph.edge_index(L).size(1) if P.is_pattern(graph) else graph.size(1)


SECOND_ORDER = ("window_2_1", "edge_list")  # second derivatives, checked on 2 processes


def _second_order(q, k, v, bias, graph, grad):
    """Gradients of |dLoss/dk|^2 (create_graph=True through the attention and the exchange's return)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]
    out, _ = (gd.attention if isinstance(graph, gd.ExchangePlan) else ga.attention)(
        *leaves[:3], graph, edge_bias=leaves[3]
    )
    (grad_k,) = torch.autograd.grad((out * grad).sum(), leaves[1], create_graph=True)
    grad_k.square().sum().backward()
    return dict(zip(("q2", "k2", "v2", "bias2"), (t.grad for t in leaves)))


CONV_PATTERN = P.window(3, 1) | P.global_tokens([2])


def _conv_block(a, b, L, parallel=True):
    """AttentionConv on positions [a, b) (context-parallel over the world group), or on all of them in one process."""
    torch.manual_seed(0)
    conv = ga.AttentionConv(6, 4, heads=2).double()
    g = torch.Generator().manual_seed(7)
    x, grad = torch.randn(L, 6, generator=g, dtype=torch.float64), torch.randn(L, 4, generator=g, dtype=torch.float64)
    if parallel:
        out = conv(x[a:b], CONV_PATTERN, context_parallel=dist.group.WORLD)
    else:
        out = conv(x, CONV_PATTERN)
    (out * grad[a:b]).sum().backward()
    return {"out": out.detach(), **{name: p.grad for name, p in conv.named_parameters()}}


def _worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    sizes = SIZES[world]
    a, b = sum(sizes[:rank]), sum(sizes[: rank + 1])
    results = {}
    for name, graph, with_bias in _cases(world):
        L = sum(sizes)
        q, k, v, bias, grad = _inputs(name, L, _num_edges(graph, L))
        q, k, v = (t[a:b].clone().requires_grad_() for t in (q, k, v))
        plan = gd.plan_for_group(graph, b - a)
        local_bias = bias[plan.edge_ids].clone().requires_grad_() if with_bias else None
        out, alpha = gd.attention(q, k, v, graph, edge_bias=local_bias, need_weights=True)
        again, _ = gd.attention(q, k, v, plan, edge_bias=local_bias)  # the plan reused in place of the graph
        (out * grad[a:b]).sum().backward()
        results[name] = {
            "out": out.detach(),
            "again": again.detach(),
            "alpha": alpha.detach(),
            "edge_ids": plan.edge_ids,
            "q": q.grad,
            "k": k.grad,
            "v": v.grad,
            "bias": None if local_bias is None else local_bias.grad,
            "rows": plan.rows,
        }
        if world == 2 and name in SECOND_ORDER:
            results[name].update(_second_order(q, k, v, local_bias, plan, grad[a:b]))
    results["conv"] = _conv_block(a, b, L=sum(sizes))
    alone = dist.new_group([0])  # collective: every rank creates it; only rank 0 belongs to it
    if rank != 0:
        try:
            gd.plan_for_group(P.window(1, 1), b - a, group=alone)
        except ValueError as error:
            results["not_a_member"] = str(error)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # about 15-20 s per world size: a fresh interpreter, then all cases in one spawn
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
@pytest.mark.parametrize("world", [2, 4])
def test_distributed_equals_one_process(world, tmp_path):
    """Outputs, weights and gradients of every case on ``world`` gloo processes against one process.

    The ranks run in a fresh interpreter (``python tests/test_distributed.py OUT WORLD``), forked before
    any torch thread pool exists (as in tests/test_ddp.py), with a time limit.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(tmp_path), str(world)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    L = sum(SIZES[world])
    for name, graph, with_bias in _cases(world):
        E = _num_edges(graph, L)
        q, k, v, bias, grad = _inputs(name, L, E)
        q, k, v, bias = (t.clone().requires_grad_() for t in (q, k, v, bias))
        out, alpha = ga.attention(q, k, v, graph, edge_bias=bias if with_bias else None, need_weights=True)
        (out * grad).sum().backward()
        got = {key: torch.cat([r[name][key] for r in ranks]) for key in ("out", "again", "q", "k", "v")}
        close = {"atol": 1e-10, "rtol": 0, "msg": lambda m, name=name: f"{name}: {m}"}
        for key, want in (("out", out), ("again", out), ("q", q.grad), ("k", k.grad), ("v", v.grad)):
            torch.testing.assert_close(got[key], want, **close)
        ids = torch.cat([r[name]["edge_ids"] for r in ranks])
        assert torch.equal(ids.sort().values, torch.arange(E))  # every edge on exactly one process
        torch.testing.assert_close(torch.cat([r[name]["alpha"] for r in ranks]), alpha[ids], **close)
        if with_bias:
            torch.testing.assert_close(torch.cat([r[name]["bias"] for r in ranks]), bias.grad[ids], **close)
        if world == 2 and name in SECOND_ORDER:
            want = _second_order(q, k, v, bias, graph, grad)
            for key in ("q2", "k2", "v2"):
                torch.testing.assert_close(torch.cat([r[name][key] for r in ranks]), want[key], **close)
            torch.testing.assert_close(torch.cat([r[name]["bias2"] for r in ranks]), want["bias2"][ids], **close)
    want = _conv_block(0, L, L, parallel=False)  # the layer on one process; its weight gradients summed over blocks
    torch.testing.assert_close(torch.cat([r["conv"]["out"] for r in ranks]), want["out"], atol=1e-10, rtol=0)
    for name in want.keys() - {"out"}:
        torch.testing.assert_close(sum(r["conv"][name] for r in ranks), want[name], atol=1e-10, rtol=0)
    assert int(ranks[0]["window_2_0"]["rows"][0].sum()) == 0  # rank 0 of a causal window receives nothing
    assert int(ranks[0]["block_diagonal"]["rows"].sum()) == 0
    assert all("'group'" in r["not_a_member"] for r in ranks[1:])  # a process outside the group: a clear error


@pytest.mark.parametrize(
    "pattern",
    [
        P.window(3, 3),
        P.window(None, 2),
        P.window(2, 2, dilation=2),
        P.strided(4),
        P.strided(7),
        P.causal(),
        P.full(),
        P.global_tokens([0, 17]),
        P.random(3, seed=2),
        P.bigbird(block=3, random_blocks=2, seed=1),
        P.window(2, 0) | P.global_tokens([5]) | P.random(1),
        P.fixed(4, 1),
    ],
    ids=lambda p: p.name,
)
def test_pattern_rows_equal_the_plan_from_edges(pattern):
    """The traffic derived from the pattern's parameters equals the one counted on its edge list."""
    for sizes in ([30], [10, 10, 10], [4, 0, 13, 2, 11], [1] * 7):
        want = gd.build_plan(pattern.edge_index(sum(sizes)), sizes, rank=0).rows  # (P, P): the same on every rank
        torch.testing.assert_close(gd.pattern_rows(pattern, sizes), want, rtol=0, atol=0)


def test_window_traffic_is_the_halo():
    """Known answer: window(w, w) over blocks of n >= w rows sends w rows to each neighbour, not the sequence."""
    rows = gd.pattern_rows(P.window(3, 3), [10] * 5)
    want = torch.zeros(5, 5, dtype=torch.long)
    for r in range(4):
        want[r, r + 1] = want[r + 1, r] = 3
    assert torch.equal(rows, want)
    assert gd.ring_rows([10] * 5).tolist() == [40] * 5
    plan = gd.build_plan(P.window(3, 3), [10] * 5, rank=2)
    traffic = plan.traffic(heads=2, channels=4, element_size=8)
    assert traffic["recv_rows"][2] == 6 and traffic["row_bytes"] == 2 * (4 + 4) * 8
    assert plan.send_index.tolist() == [0, 1, 2, 7, 8, 9] and plan.recv_source.tolist() == [17, 18, 19, 30, 31, 32]


def test_plan_local_graph_matches_the_global_one():
    """The local edges, mapped back through the buffer order, are the global edges into the block."""
    ei, sizes = _edge_list(19), [7, 12]
    for rank in range(2):
        plan = gd.build_plan(ei, sizes, rank)
        a, n = plan.start, sizes[rank]
        buffer_pos = torch.cat([torch.arange(a, a + n), plan.recv_source])  # (n + n_recv,) global position
        assert torch.equal(buffer_pos[plan.edge_index[0]], ei[0, plan.edge_ids])
        assert torch.equal(plan.edge_index[1] + a, ei[1, plan.edge_ids])


@pytest.mark.slow  # torchrun starts two fresh interpreters (about 30-45 s on a loaded machine)
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed gloo")
def test_example_under_torchrun():
    """examples/context_parallel.py under torchrun: the layer's loss and gradients equal one process's."""
    example = Path(__file__).resolve().parents[1] / "examples" / "context_parallel.py"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_free_port()),
            str(example),
            "--length",
            "1000",
            "--window",
            "64",
            "--steps",
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "rows received per process: [0, 64] (ring attention: [500, 500])" in run.stdout
    loss_diff, grad_diff = (
        float(x) for x in re.search(r"loss difference (\S+), largest gradient difference (\S+)", run.stdout).groups()
    )
    assert loss_diff < 1e-10 and grad_diff < 1e-10
    assert "parameters identical on every process: True" in run.stdout


def test_conv_refuses_a_bad_group():
    conv = ga.AttentionConv(4, 4, heads=2)
    with pytest.raises(TypeError, match="'context_parallel'"):
        conv(torch.randn(3, 4), P.window(1, 1), context_parallel="world")


def test_bad_arguments():
    with pytest.raises(ValueError, match="'rank'"):
        gd.build_plan(P.window(1, 1), [3, 3], rank=2)
    with pytest.raises(ValueError, match="'sizes'"):
        gd.build_plan(P.window(1, 1), [3, -1], rank=0)
    with pytest.raises(IndexError):
        gd.build_plan(torch.tensor([[0], [9]]), [3, 3], rank=0)
    with pytest.raises(TypeError, match="'num_local'"):  # not silently int(5.5) == 5 rows
        gd.plan_for_group(P.window(1, 1), 5.5)
    q = torch.randn(4, 1, 2)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            gd.attention(q, q, q, P.window(1, 1))
    with pytest.raises(ValueError, match="'key'"):
        gd.attention(q, q[:3], q[:3], P.window(1, 1))
    with pytest.raises(TypeError, match="'pattern'"):
        gd.pattern_rows(torch.zeros(2, 1, dtype=torch.long), [3])


if __name__ == "__main__":  # the ranks, forked from this fresh interpreter (see the test's docstring)
    world = int(sys.argv[2])
    mp.start_processes(_worker, args=(world, _free_port(), sys.argv[1]), nprocs=world, join=True, start_method="fork")
