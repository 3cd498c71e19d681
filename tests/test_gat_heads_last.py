"""ga.GATConv and ga.GATv2Conv at one thread: rows projected heads innermost (graphattn.ops.heads_last, and
graphattn::gatv2_score's kernel for that layout), against PyG's layers and against the (n, H, C) kernels."""

from __future__ import annotations

import pytest
import torch
from conftest import DTYPES, assert_close
from torch_geometric.nn import GATConv, GATv2Conv

import graphattn as ga
from graphattn.ops import additive

pytest.importorskip("numba")

CONFIGS = [
    pytest.param(dict(heads=4), id="defaults"),
    pytest.param(dict(heads=4, concat=False, residual=True), id="mean_residual"),
    pytest.param(dict(heads=2, edge_dim=3, fill_value=0.5), id="edge_dim"),
    pytest.param(dict(heads=3, add_self_loops=False, dropout=0.0), id="no_self_loops"),
]


def _graph(N, E, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.stack([torch.randint(0, N, (E,), generator=g), torch.randint(0, N - 3, (E,), generator=g)])
    return torch.cat([ei, ei[:, :10], torch.tensor([[1, 2], [1, 2]])], 1)  # duplicates, own loops, empty rows


PAIRS = [pytest.param(ga.GATConv, GATConv, id="GATConv"), pytest.param(ga.GATv2Conv, GATv2Conv, id="GATv2Conv")]


@pytest.fixture
def scores_counted(monkeypatch):
    """How many times graphattn::gatv2_score's heads-last kernels were asked for: [n]."""
    calls = [0]
    build = additive._kernels_heads_last
    monkeypatch.setattr(additive, "_kernels_heads_last", lambda h: calls.__setitem__(0, calls[0] + 1) or build(h))
    return calls


def _pair(config, F, C, dtype, ours_cls=ga.GATConv, ref_cls=GATConv):
    ours = ours_cls(F, C, **config).to(dtype)
    ref = ref_cls(F, C, **config).to(dtype)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "ours_cls, ref_cls, config",
    [
        *(
            pytest.param(*pair.values, config.values[0], id=f"{pair.id}-{config.id}")
            for pair in PAIRS
            for config in CONFIGS
        ),
        pytest.param(
            ga.GATv2Conv, GATv2Conv, dict(heads=4, share_weights=True, edge_dim=2), id="GATv2Conv-share_weights"
        ),
    ],
)
def test_gat_layers_project_heads_last_and_equal_pyg(
    ours_cls, ref_cls, dtype, config, one_thread, counted, scores_counted
):
    """At one thread ga.GATConv and ga.GATv2Conv project their rows heads innermost and run those kernels (forward
    and backward; GATv2's scores too); output, attention weights and every gradient equal PyG's layer."""
    torch.manual_seed(7)
    N, F, C = 40, 10, 8
    ours, ref = _pair(config, F, C, dtype, ours_cls, ref_cls)
    ei = _graph(N, 300)
    edge_attr = torch.randn(ei.size(1), config["edge_dim"], dtype=dtype) if "edge_dim" in config else None
    x = torch.randn(N, F, dtype=dtype, requires_grad=True)
    out, (_, alpha) = ours(x, ei, edge_attr, return_attention_weights=True)
    assert counted == {"heads_last": 1, "rows": 0}
    x_ref = x.detach().requires_grad_()
    expected, (_, alpha_ref) = ref(x_ref, ei, edge_attr, return_attention_weights=True)
    assert_close(out, expected)
    assert_close(alpha, alpha_ref)
    w = torch.randn_like(out)
    got = torch.autograd.grad((out * w).sum() + alpha.square().sum(), [x, *ours.parameters()])
    want = torch.autograd.grad((expected * w).sum() + alpha_ref.square().sum(), [x_ref, *ref.parameters()])
    assert counted == {"heads_last": 2, "rows": 0}
    assert scores_counted == [2 if ours_cls is ga.GATv2Conv else 0]
    for a, b in zip(got, want):
        assert_close(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("edge_term", [False, True])
def test_gatv2_score_heads_last_equals_the_rows_kernel(dtype, edge_term, one_thread, scores_counted):
    """graphattn::gatv2_score on heads-innermost rows (its own kernel) equals it on PyTorch's (n, H, C) rows, forward
    and every gradient (of the rows, att and the edge term), the gradients in the layout of their inputs."""
    torch.manual_seed(10)
    S, L, E, H, C = 30, 20, 200, 4, 6
    g = torch.Generator().manual_seed(2)
    src, dst = torch.randint(0, S, (E,), generator=g), torch.randint(0, L, (E,), generator=g)
    rows = [torch.randn(n, H, C, dtype=dtype) for n in (S, L, E)]
    att = torch.randn(H, C, dtype=dtype)
    weight = torch.randn(E, H, dtype=dtype)

    def run(x_src, x_dst, edge):
        leaves = [t.detach().requires_grad_() for t in (x_src, x_dst, att, edge)]
        score = additive.gatv2_score(*leaves[:2], src, dst, leaves[2], leaves[3] if edge_term else None, 0.2)
        (score * weight).sum().backward()
        return score.detach(), [t.grad for t in leaves[: 4 if edge_term else 3]], leaves

    want, want_grads, _ = run(*rows)
    assert scores_counted == [0]
    got, got_grads, leaves = run(*(t.transpose(1, 2).contiguous().transpose(1, 2) for t in rows))
    assert scores_counted == [2]
    assert_close(got, want)
    for a, b, leaf in zip(got_grads, want_grads, leaves):
        assert_close(a, b)
        assert a.stride() == leaf.stride()  # dx in its input's layout


def test_bipartite_gat_conv_projects_its_sources_heads_last(one_thread, counted):
    """Bipartite input (x_src, x_dst): the sources (the values) heads innermost, the targets as PyG's; equal."""
    torch.manual_seed(8)
    ours = ga.GATConv((6, 5), 4, heads=4).double()
    ref = GATConv((6, 5), 4, heads=4).double()
    ref.load_state_dict(ours.state_dict())
    x_src, x_dst = torch.randn(30, 6, dtype=torch.float64), torch.randn(20, 5, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    ei = torch.stack([torch.randint(0, 30, (120,), generator=g), torch.randint(0, 20, (120,), generator=g)])
    out = ours((x_src, x_dst), ei)
    assert counted == {"heads_last": 1, "rows": 0}
    assert_close(out, ref((x_src, x_dst), ei))


def test_compiled_gat_conv_runs_heads_last_and_equals_eager(one_thread, counted):
    """Compiled with fullgraph=True the layer projects heads innermost too; output and gradients equal eager."""
    torch.manual_seed(9)
    layer = ga.GATConv(12, 4, heads=4)
    ei, x = _graph(50, 300), torch.randn(50, 12)
    torch.compiler.reset()
    compiled = torch.compile(layer, fullgraph=True)
    xc = x.clone().requires_grad_()
    out = compiled(xc, ei)
    out.square().sum().backward()
    assert counted == {"heads_last": 2, "rows": 0}
    xe = x.clone().requires_grad_()
    eager = layer(xe, ei)
    eager.square().sum().backward()
    assert_close(out, eager)
    assert_close(xc.grad, xe.grad)
    torch.compiler.reset()


def test_a_hook_on_the_projection_sees_its_call(one_thread, counted):
    """A forward hook on ``lin`` sees the call (PyG's order and shapes): the layer then projects with the module."""
    layer = ga.GATConv(8, 4, heads=2)
    seen = []
    layer.lin.register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)))
    layer(torch.randn(10, 8), _graph(10, 40))
    assert seen == [(10, 8)] and counted == {"heads_last": 0, "rows": 1}


def test_two_threads_keep_pytorchs_rows(counted):
    """At two threads the values stay PyTorch's (n, H, D) rows and their kernel runs; equal to PyG."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ours, ref = _pair(dict(heads=4), 8, 4, torch.float64)
        x, ei = torch.randn(30, 8, dtype=torch.float64), _graph(30, 150)
        out = ours(x, ei)
        assert counted == {"heads_last": 0, "rows": 1}
        assert_close(out, ref(x, ei))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("heads_last", ["x_src", "x_dst", "edge", "x_src,x_dst", "x_src,x_dst,edge"])
def test_gatv2_score_inputs_in_mixed_layouts_get_every_gradient(heads_last, one_thread):
    """Some inputs heads innermost, others not (only all of them runs the heads-last kernel): the (n, H, C)
    kernel reads contiguous copies and its gradients come back, in each input's layout (they were written into a
    copy and lost: zeros, or uninitialised memory for the edge term; found by a helper)."""
    torch.manual_seed(12)
    S, L, E, H, C = 20, 15, 90, 4, 6
    g = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, S, (E,), generator=g), torch.randint(0, L, (E,), generator=g)
    rows = {"x_src": torch.randn(S, H, C), "x_dst": torch.randn(L, H, C), "edge": torch.randn(E, H, C)}
    att, weight = torch.randn(H, C), torch.randn(E, H)

    def run(layout):
        leaves = {
            k: (v.transpose(1, 2).contiguous().transpose(1, 2) if k in layout else v.clone()) for k, v in rows.items()
        }
        for v in leaves.values():
            v.requires_grad_()
        score = additive.gatv2_score(leaves["x_src"], leaves["x_dst"], src, dst, att, leaves["edge"], 0.2)
        (score * weight).sum().backward()
        return score.detach(), leaves

    want, plain = run(())
    got, mixed = run(heads_last.split(","))
    assert_close(got, want)
    for k in rows:
        assert_close(mixed[k].grad, plain[k].grad)
        assert mixed[k].grad.stride() == mixed[k].stride()


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("ours_cls, ref_cls", PAIRS)
@pytest.mark.parametrize("threads", [(1, 2), (2, 1)])
def test_backward_at_another_thread_count_is_exact(threads, ours_cls, ref_cls, compiled, one_thread):
    """Forward at one thread count, backward at the other (eager and compiled, edge features included): every
    gradient equals PyG's. GATv2's backward at two threads lost its gradients of heads-innermost rows (3.3 off,
    1e280 with edge features; found by a helper)."""
    torch.manual_seed(13)
    ours, ref = _pair(dict(heads=4, edge_dim=2), 8, 4, torch.float64, ours_cls, ref_cls)
    x, ei = torch.randn(30, 8, dtype=torch.float64), _graph(30, 120)
    edge_attr = torch.randn(ei.size(1), 2, dtype=torch.float64)
    torch.compiler.reset()
    model = torch.compile(ours, fullgraph=True) if compiled else ours
    torch.set_num_threads(threads[0])  # (one_thread restores it)
    xo = x.clone().requires_grad_()
    out = model(xo, ei, edge_attr)
    torch.set_num_threads(threads[1])
    out.square().sum().backward()
    xr = x.clone().requires_grad_()
    ref(xr, ei, edge_attr).square().sum().backward()
    for a, b in zip([xo, *ours.parameters()], [xr, *ref.parameters()]):
        assert_close(a.grad, b.grad)
    torch.compiler.reset()


@pytest.mark.parametrize("threads", [1, 2])
def test_gat_conv_calls_a_hooked_or_subclassed_edge_projection(threads, one_thread):
    """GATConv folds lin_edge's weight into the scores (no (E, H, C) tensor); a forward hook, a pre-hook or a
    Linear subclass on lin_edge must still see (and change) the call, as in PyG's layer (they were bypassed:
    4.8 and 2.6 off; found by a helper)."""
    from torch import nn

    class Halved(nn.Linear):
        def forward(self, x):
            return 0.5 * super().forward(x)

    torch.set_num_threads(threads)  # (one_thread restores it)
    x, ei = torch.randn(30, 8, dtype=torch.float64), _graph(30, 120)
    edge_attr = torch.randn(ei.size(1), 3, dtype=torch.float64)
    for change in ("hook", "pre_hook", "subclass"):
        ours, ref = _pair(dict(heads=4, edge_dim=3), 8, 4, torch.float64)
        for layer in (ours, ref):
            if change == "hook":
                layer.lin_edge.register_forward_hook(lambda module, args, out: 3.0 * out)
            elif change == "pre_hook":
                layer.lin_edge.register_forward_pre_hook(lambda module, args: (args[0].square(),))
            else:
                halved = Halved(3, 16, bias=False).double()
                halved.load_state_dict(layer.lin_edge.state_dict())
                layer.lin_edge = halved
        xo, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, expected = ours(xo, ei, edge_attr), ref(xr, ei, edge_attr)
        assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        for a, b in zip([xo, *ours.parameters()], [xr, *ref.parameters()]):
            assert_close(a.grad, b.grad)
