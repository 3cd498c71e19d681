"""``torch.func`` transforms (grad, vmap, jacrev) through graphattn, against PyG and PyTorch's autograd.

The fast operators' registered autograd does not compose with ``torch.func`` in torch 2.13
(pytorch/pytorch#168393), so inside a transform graphattn runs its plain-PyTorch paths (the layers'
``propagate``, the functional entry's per-edge formulation). Each test compares a transform's result with
an independent one: PyG's own conv under the same transform, or ``torch.autograd`` on the eager fast path.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, jacrev, vmap
from torch.testing import assert_close

import graphattn as ga
from graphattn import patterns

TOL = dict(atol=1e-10, rtol=0)


def _graph(N: int = 17, degree: int = 3, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, N, (N * degree,), generator=g), torch.arange(N).repeat_interleave(degree)])


def _pairs():
    """``(name, graphattn layer, PyG layer with the same weights)`` at PyG's defaults, float64."""
    from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv

    torch.manual_seed(0)
    tc, gat, gat2 = TransformerConv(8, 4, heads=2), GATConv(8, 4, heads=2), GATv2Conv(8, 4, heads=2)
    return [
        ("TransformerConv", ga.TransformerConv.from_transformer_conv(tc).double(), tc.double()),
        ("GATConv", ga.GATConv.from_gat_conv(gat).double(), gat.double()),
        ("GATv2Conv", ga.GATv2Conv.from_gatv2_conv(gat2).double(), gat2.double()),
    ]


def _param_grad(module, x, edge_index):
    """``torch.func.grad`` of a loss over the module's parameters, as a dict."""
    params = {k: v.detach() for k, v in module.named_parameters()}
    return grad(lambda p: functional_call(module, p, (x, edge_index)).square().sum())(params)


@pytest.mark.parametrize("pair", range(3), ids=["TransformerConv", "GATConv", "GATv2Conv"])
def test_func_grad_of_each_layer_equals_pygs(pair):
    name, ours, theirs = _pairs()[pair]
    x, edge_index = torch.randn(17, 8, dtype=torch.float64), _graph()
    got, want = _param_grad(ours, x, edge_index), _param_grad(theirs, x, edge_index)
    assert set(got) == set(want)
    for k in got:
        assert_close(got[k], want[k], **TOL, msg=f"{name}.{k}")
    # and against PyTorch's autograd on graphattn's fast path (the operators)
    ours.zero_grad()
    ours(x, edge_index).square().sum().backward()
    for k, p in ours.named_parameters():
        assert_close(got[k], p.grad, **TOL, msg=f"{name}.{k} (autograd)")


def test_per_sample_gradients_with_vmap_equal_a_loop():
    """DP-SGD's per-sample gradients: vmap(grad) over a batch of node-feature sets, one graph."""
    torch.manual_seed(1)
    conv = ga.TransformerConv(8, 4, heads=2).double()
    edge_index = _graph()
    xs = torch.randn(5, 17, 8, dtype=torch.float64)  # (B, N, F)
    params = {k: v.detach() for k, v in conv.named_parameters()}

    def loss(p, x):
        return functional_call(conv, p, (x, edge_index)).square().sum()

    got = vmap(grad(loss), in_dims=(None, 0))(params, xs)  # {name: (B, *shape)}
    for b in range(xs.size(0)):
        conv.zero_grad()
        conv(xs[b], edge_index).square().sum().backward()
        for k, p in conv.named_parameters():
            assert_close(got[k][b], p.grad, **TOL, msg=f"sample {b}, {k}")


@pytest.mark.parametrize("graph", ["edges", "bias", "full", "causal", "dropout"])
def test_func_grad_of_attention_equals_autograd(graph):
    g = torch.Generator().manual_seed(2)
    L, H, D = 9, 2, 4
    q, k, v = (torch.randn(L, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    edge_index = _graph(L, 3, seed=3)
    bias = torch.randn(edge_index.size(1), H, generator=g, dtype=torch.float64) if graph == "bias" else None
    where = {"full": patterns.full(), "causal": patterns.causal()}.get(graph, edge_index)
    p = 0.3 if graph == "dropout" else 0.0

    def loss(q, k, v):
        torch.manual_seed(7)  # dropout: the same mask in both calls (the edge path draws it alike)
        out, alpha = ga.attention(q, k, v, where, edge_bias=bias, dropout=p, need_weights=True)
        return out.square().sum() + alpha.sum()

    got = grad(loss, argnums=(0, 1, 2))(q, k, v)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if graph == "dropout":  # the eager operator draws its mask in another layout: compare with the reference
        from graphattn.ops.operators import reference_attention
        from graphattn.ops.shared import apply_keep, draw_keep

        torch.manual_seed(7)
        keep = draw_keep(q.new_empty(edge_index.size(1), H), p)
        out, alpha = reference_attention(*leaves, edge_index, None, keep, D**-0.5, p)
        want = torch.autograd.grad(out.square().sum() + apply_keep(alpha, keep, p).sum(), leaves)
    else:
        want = torch.autograd.grad(loss(*leaves), leaves)
    for a, b in zip(got, want):
        assert_close(a, b, **TOL)


def test_jacrev_of_attention_equals_autograd_rows():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(6, 1, 3, generator=g, dtype=torch.float64) for _ in range(3))
    edge_index = _graph(6, 2, seed=5)
    jac = jacrev(lambda v: ga.attention(q, k, v, edge_index)[0])(v)  # (6, 1, 3, 6, 1, 3)
    leaf = v.clone().requires_grad_()
    out = ga.attention(q, k, leaf, edge_index)[0]
    for i in range(out.numel()):
        (row,) = torch.autograd.grad(out.reshape(-1)[i], leaf, retain_graph=True)
        assert_close(jac.reshape(out.numel(), -1)[i], row.reshape(-1), **TOL)


@pytest.mark.parametrize("kind", ["full", "causal"])
def test_func_grad_of_batched_attention_equals_autograd(kind):
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(12, 2, 4, generator=g, dtype=torch.float64) for _ in range(3))
    batch = torch.tensor([0] * 5 + [1] * 7)
    pattern = getattr(patterns, kind)()

    def loss(q, k, v):
        return ga.ops.batched_attention(q, k, v, pattern, batch)[0].square().sum()

    got = grad(loss, argnums=(0, 1, 2))(q, k, v)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(loss(*leaves), leaves)  # eager: the ragged kernel
    for a, b in zip(got, want):
        assert_close(a, b, **TOL)


def test_func_grad_of_scored_attention_with_loops_equals_autograd():
    """``loops=N`` (GAT's self-loops): the own loops of ``edge_index`` left out, (i, i) appended, as eager."""
    g = torch.Generator().manual_seed(8)
    N, H = 7, 2
    edge_index = torch.cat([_graph(N, 2, seed=9), torch.tensor([[3, 5], [3, 5]])], dim=1)  # two own loops
    score = torch.randn(edge_index.size(1) + N, H, generator=g, dtype=torch.float64)
    value = torch.randn(N, H, 3, generator=g, dtype=torch.float64)

    def loss(score, value):
        out, alpha = ga.ops.scored_attention(score, value, edge_index, N, loops=N, need_weights=True)
        return out.square().sum() + (alpha * torch.arange(alpha.size(0), dtype=alpha.dtype).unsqueeze(1)).sum()

    got = grad(loss, argnums=(0, 1))(score, value)
    leaves = [score.clone().requires_grad_(), value.clone().requires_grad_()]
    want = torch.autograd.grad(loss(*leaves), leaves)
    for a, b in zip(got, want):
        assert_close(a, b, **TOL)


def test_a_bad_index_inside_a_transform_is_named():
    q = k = v = torch.randn(4, 1, 2)
    edge_index = torch.tensor([[0, 9], [1, 2]])
    with pytest.raises(IndexError, match="edge_index"):
        grad(lambda v: ga.attention(q, k, v, edge_index)[0].sum())(v)


def test_func_grad_of_gps_conv_equals_pygs():
    """GPSConv's global attention (graphattn's ragged kernel eager) under torch.func, against PyG's GPSConv."""
    from torch_geometric.nn import GINConv
    from torch_geometric.nn import GPSConv as PyGGPSConv

    torch.manual_seed(10)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    theirs = PyGGPSConv(8, GINConv(mlp), heads=2, dropout=0.0).double().eval()
    from graphattn.gps import GPSConv

    ours = GPSConv.from_gps_conv(theirs).double().eval()
    x, edge_index = torch.randn(12, 8, dtype=torch.float64), _graph(12, 2, seed=11)
    batch = torch.tensor([0] * 5 + [1] * 7)

    def grads(module):
        params = {k: v.detach() for k, v in module.named_parameters()}
        return grad(lambda p: functional_call(module, p, (x, edge_index, batch)).square().sum())(params)

    got, want = grads(ours), grads(theirs)
    assert set(got) == set(want)
    for k in got:
        assert_close(got[k], want[k], **TOL, msg=k)


@pytest.mark.parametrize("impl", ["auto", "message_passing"])
@pytest.mark.parametrize("layer", ["TransformerConv", "AttentionConv", "GATConv", "GATv2Conv"])
def test_int32_edge_index_gives_the_int64_gradients(layer, impl):
    """PyG's propagate with an int32 index hit torch's CPU gather bug (wrong rows in the scatter's backward):
    now cast to int64 before propagate, inside a transform and with impl="message_passing" alike."""
    torch.manual_seed(12)
    kwargs = {} if layer.startswith("GAT") else dict(impl=impl)
    conv = getattr(ga, layer)(8, 8 if layer == "AttentionConv" else 4, heads=2, **kwargs).double()
    x, edge_index = torch.randn(17, 8, dtype=torch.float64), _graph()
    leaf = x.clone().requires_grad_()
    (want,) = torch.autograd.grad(conv(leaf, edge_index).square().sum(), leaf)  # int64, fast path or propagate
    got = grad(lambda a: conv(a, edge_index.int()).square().sum())(x)
    assert_close(got, want, **TOL)
    leaf = x.clone().requires_grad_()
    (eager,) = torch.autograd.grad(conv(leaf, edge_index.int()).square().sum(), leaf)
    assert_close(eager, want, **TOL)


def test_vmap_over_scores_and_edge_bias_equals_a_loop():
    """Values cannot be read under vmap: the NaN checks on scores and edge_bias stand aside there."""
    g = torch.Generator().manual_seed(13)
    edge_index = _graph(9, 2, seed=14)
    E = edge_index.size(1)
    score = torch.randn(3, E, 2, generator=g, dtype=torch.float64)
    value = torch.randn(9, 2, 3, generator=g, dtype=torch.float64)
    got = vmap(lambda s: ga.ops.scored_attention(s, value, edge_index, 9)[0])(score)
    assert_close(got, torch.stack([ga.ops.scored_attention(s, value, edge_index, 9)[0] for s in score]), **TOL)
    conv = ga.AttentionConv(8, 8, heads=2).double()
    x = torch.randn(9, 8, generator=g, dtype=torch.float64)
    got = vmap(lambda b: conv(x, edge_index, edge_bias=b))(score)
    assert_close(got, torch.stack([conv(x, edge_index, edge_bias=b) for b in score]), **TOL)


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_sparse_adjacency_under_grad_equals_the_edge_list(where):
    torch.manual_seed(15)
    conv = ga.TransformerConv(8, 4, heads=2).double()
    x, edge_index = torch.randn(17, 8, dtype=torch.float64), _graph()
    adj = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(edge_index.size(1)), (17, 17)).coalesce()

    def loss(a):
        built = adj if where == "outside" else torch.sparse_coo_tensor(adj.indices(), adj.values(), (17, 17))
        return conv(a, built).square().sum()

    leaf = x.clone().requires_grad_()
    (want,) = torch.autograd.grad(conv(leaf, adj).square().sum(), leaf)
    assert_close(grad(loss)(x), want, **TOL)
