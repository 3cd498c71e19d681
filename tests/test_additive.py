"""graphattn::gatv2_score (graphattn/ops/additive.py): the fused kernel against the readable PyTorch formula (PyG's),
scores and every gradient, float64 at 1e-10 and float32 at the noise floor; its registration (opcheck), its index
check, and the layer running it (ga.GATv2Conv against PyG's layer is tests/test_gat.py)."""

import pytest
import torch
from torch_geometric.nn import GATv2Conv as PyGGATv2Conv

import graphattn as ga
from graphattn.ops import additive


def _inputs(dtype, edge: bool, shared: bool, S=11, L=7, H=3, C=5, E=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x_src = torch.randn(S, H, C, generator=g, dtype=dtype)
    x_dst = x_src[:L] if shared else torch.randn(L, H, C, generator=g, dtype=dtype)
    src = torch.cat([torch.randint(0, S, (E,), generator=g), torch.arange(L), torch.tensor([2, 2])])  # loops, dups
    dst = torch.cat([torch.randint(0, L, (E,), generator=g), torch.arange(L), torch.tensor([2, 2])])
    att = torch.randn(H, C, generator=g, dtype=dtype)
    term = torch.randn(src.numel(), H, C, generator=g, dtype=dtype) if edge else None
    return x_src, x_dst, src, dst, att, term


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["float64", "float32"])
@pytest.mark.parametrize("edge", [False, True], ids=["no_edge", "edge"])
@pytest.mark.parametrize("shared", [False, True], ids=["two_inputs", "one_input"])
def test_kernel_equals_the_readable_formula_scores_and_gradients(dtype, tol, edge, shared):
    x_src, x_dst, src, dst, att, term = _inputs(dtype, edge, shared)
    leaves = [t.detach().requires_grad_() for t in (x_src, att) + ((term,) if edge else ())]
    w = torch.randn(src.numel(), 3, generator=torch.Generator().manual_seed(1), dtype=dtype)
    results = []
    for fn in (additive.gatv2_score, additive.readable):
        xs = leaves[0]
        xd = xs[:7] if shared else x_dst.detach().requires_grad_()
        score = fn(xs, xd, src, dst, leaves[1], leaves[2] if edge else None, 0.2)
        wrt = leaves if shared else leaves + [xd]
        results.append([score, *torch.autograd.grad((score * w).sum(), wrt)])
    for a, b in zip(*results):
        assert (a - b).abs().max() < tol * max(1.0, b.abs().max().item())


def test_second_derivatives_equal_the_readable_formula():
    """create_graph=True runs the readable formula's backward: a gradient penalty through it equals readable's."""
    x_src, x_dst, src, dst, att, term = _inputs(torch.float64, True, False)
    results = []
    for fn in (additive.gatv2_score, additive.readable):
        leaves = [t.detach().requires_grad_() for t in (x_src, x_dst, att, term)]
        score = fn(leaves[0], leaves[1], src, dst, leaves[2], leaves[3], 0.2)
        (dx,) = torch.autograd.grad(score.square().sum(), leaves[0], create_graph=True)
        results.append(torch.autograd.grad(dx.square().sum(), leaves))
    for a, b in zip(*results):
        assert (a - b).abs().max() < 1e-10


def test_opcheck():
    x_src, x_dst, src, dst, att, term = _inputs(torch.float64, True, False)
    args = (x_src.requires_grad_(), x_dst.requires_grad_(), src, dst, att.requires_grad_(), term, 0.2)
    torch.library.opcheck(torch.ops.graphattn.gatv2_score.default, args)
    torch.library.opcheck(torch.ops.graphattn.gatv2_score.default, args[:5] + (None, 0.1))


def test_an_index_out_of_range_is_refused_before_it_is_read():
    x_src, x_dst, src, dst, att, _ = _inputs(torch.float64, False, False)
    with pytest.raises(IndexError, match=r"'edge_index' to be sources < S = 11 and targets < L = 7 \(got edge 3"):
        additive.gatv2_score(x_src, x_dst, src, dst.index_fill(0, torch.tensor([3]), 7), att, None, 0.2)
    with pytest.raises(IndexError, match="got edge 0"):
        additive.gatv2_score(x_src, x_dst, src.index_fill(0, torch.tensor([0]), -1), dst, att, None, 0.2)


def test_the_kernel_runs_on_one_thread_only(one_thread):
    x = torch.randn(3, 2, 4)
    assert additive.usable(x, x, x[0]) and not additive.usable(x, x.double(), x[0])
    torch.set_num_threads(2)
    assert not additive.usable(x, x, x[0])  # more threads: PyTorch's (inductor's) parallel code


def test_compiled_gatv2_runs_the_operator_and_the_readable_path_equals_it(monkeypatch, one_thread):
    """The layer (PyG's defaults) runs graphattn::gatv2_score compiled (fullgraph) and eager; with the kernel
    switched off it runs the readable formula: the same outputs and gradients as PyG's layer either way."""
    torch.manual_seed(11)
    ref = PyGGATv2Conv(16, 4, heads=3).double()
    conv = ga.GATv2Conv.from_gatv2_conv(ref)
    x = torch.randn(30, 16, dtype=torch.float64)
    edge_index = torch.cat([torch.randint(0, 30, (2, 90)), torch.tensor([[4, 4], [4, 4]])], dim=1)
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(conv, fullgraph=True, backend=backend)

    def grads(module):
        module.zero_grad()
        xg = x.detach().requires_grad_()
        out = module(xg, edge_index)
        out.square().sum().backward()
        return [out, xg.grad] + [p.grad for p in module.parameters()]

    want = grads(ref)
    runs = [grads(compiled), grads(conv)]
    monkeypatch.setattr(additive, "ENABLED", False)
    runs.append(grads(conv))
    assert "graphattn.gatv2_score.default" in {str(n.target) for gm in graphs for n in gm.graph.nodes}
    for got in runs:
        for a, b in zip(got, want):
            assert (a - b).abs().max() < 1e-10


def test_the_backward_operator_called_directly_refuses_an_index_out_of_range():
    x_src, x_dst = torch.randn(7, 3, 4, dtype=torch.float64), torch.randn(5, 3, 4, dtype=torch.float64)
    att, grad = torch.randn(3, 4, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64)
    for src in (torch.tensor([0, 7]), torch.tensor([0, 10**10]), torch.tensor([0, -1])):
        with pytest.raises(IndexError, match="edge_index"):
            torch.ops.graphattn.gatv2_score_backward(grad, x_src, x_dst, src, torch.tensor([0, 1]), att, None, 0.2)
