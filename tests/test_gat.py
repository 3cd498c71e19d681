"""ga.GATConv / ga.GATv2Conv against PyG's GATConv / GATv2Conv with the same weights (float64, 1e-10):
outputs, attention weights and every gradient, on graphs with duplicate edges, empty rows, edge features,
bipartite inputs and lazy sizes; PyG's own test cases (test_gat_conv.py, test_gatv2_conv.py) restated."""

import pytest
import torch
from torch_geometric.nn import GATConv as PyGGATConv
from torch_geometric.nn import GATv2Conv as PyGGATv2Conv

import graphattn as ga

PAIRS = [
    pytest.param(PyGGATConv, ga.GATConv, "from_gat_conv", id="GATConv"),
    pytest.param(PyGGATv2Conv, ga.GATv2Conv, "from_gatv2_conv", id="GATv2Conv"),
]
CONFIGS = [
    pytest.param(dict(), id="defaults"),
    pytest.param(dict(heads=4, concat=False), id="heads4_mean"),
    pytest.param(dict(heads=3, add_self_loops=False, negative_slope=0.1), id="no_self_loops"),
    pytest.param(dict(heads=2, edge_dim=3, fill_value=0.5), id="edge_dim_fill"),
    pytest.param(dict(heads=2, edge_dim=3, fill_value="add", residual=True), id="edge_dim_residual"),
    pytest.param(dict(heads=2, bias=False), id="no_bias"),
    pytest.param(dict(heads=2, aggr="mean"), id="aggr_mean"),  # the fused path sums: PyG's propagate runs
    pytest.param(dict(heads=2, aggr="max"), id="aggr_max"),
    pytest.param(dict(heads=2, flow="target_to_source"), id="target_to_source"),
]


def _graph(N=13, E=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, N - 2, (2, E), generator=g)  # nodes N-2, N-1 get no edges
    edge_index = torch.cat([edge_index, edge_index[:, :5], torch.tensor([[3, 4], [3, 4]])], dim=1)  # duplicates, loops
    return edge_index, torch.randn(edge_index.size(1), 3, generator=g, dtype=torch.float64)


def _run(conv, x, edge_index, edge_attr):
    x = x.detach().requires_grad_()
    out, (ei, alpha) = conv(x, edge_index, edge_attr, return_attention_weights=True)
    # random weights on alpha (the same for both layers): alpha.sum() is constant, its gradient 0
    alpha_weight = torch.randn(alpha.shape, generator=torch.Generator().manual_seed(1), dtype=alpha.dtype)
    (out.square().sum() + (alpha * alpha_weight).sum()).backward()
    return out, ei, alpha, x.grad, {n: p.grad for n, p in conv.named_parameters()}


@pytest.mark.parametrize("pyg_cls,ga_cls,convert", PAIRS)
@pytest.mark.parametrize("config", CONFIGS)
def test_equals_pyg_forward_weights_and_gradients(pyg_cls, ga_cls, convert, config):
    torch.manual_seed(0)
    ref = pyg_cls(8, 5, **config).double()
    ours = getattr(ga_cls, convert)(ref)
    x = torch.randn(13, 8, dtype=torch.float64)
    edge_index, edge_attr = _graph()
    edge_attr = edge_attr if config.get("edge_dim") else None
    got, want = _run(ours, x, edge_index, edge_attr), _run(ref, x, edge_index, edge_attr)
    assert torch.equal(got[1], want[1])  # the same edges attended (PyG's self-loop handling)
    for a, b in (got[0], want[0]), (got[2], want[2]), (got[3], want[3]):
        assert (a - b).abs().max() < 1e-10
    for name in want[4]:
        assert (got[4][name] - want[4][name]).abs().max() < 1e-10, name


@pytest.mark.parametrize("pyg_cls,ga_cls,convert", PAIRS)
def test_bipartite_and_lazy_sizes(pyg_cls, ga_cls, convert):
    torch.manual_seed(1)
    ref = pyg_cls((6, 4), 3, heads=2, add_self_loops=False).double()
    ours = getattr(ga_cls, convert)(ref)
    x = (torch.randn(9, 6, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64))
    edge_index = torch.stack([torch.randint(0, 9, (30,)), torch.randint(0, 4, (30,))])  # target 4 gets nothing
    assert (ours(x, edge_index) - ref(x, edge_index)).abs().max() < 1e-10
    lazy = ga_cls(-1, 3, heads=2)
    assert lazy(torch.randn(7, 6), torch.randint(0, 7, (2, 20))).shape == (7, 6)


@pytest.mark.parametrize("pyg_cls,ga_cls,convert", PAIRS)
def test_pygs_conventions(pyg_cls, ga_cls, convert):
    """repr, state_dict both ways, return_attention_weights=None (PyG's default) and False as PyG's."""
    ref = pyg_cls(8, 4, heads=2)
    ours = getattr(ga_cls, convert)(ref)
    assert repr(ours) == repr(ref)
    back = ours.to_gat_conv() if ga_cls is ga.GATConv else ours.to_gatv2_conv()
    assert type(back) is pyg_cls and all(
        torch.equal(a, b) for a, b in zip(back.state_dict().values(), ref.state_dict().values())
    )
    x, edge_index = torch.randn(6, 8), torch.randint(0, 6, (2, 15))
    for flag in (None, False):
        assert type(ours(x, edge_index, return_attention_weights=flag)) is type(
            ref(x, edge_index, return_attention_weights=flag)
        )
    out, (_, alpha) = ours(x, edge_index, return_attention_weights=True)
    assert alpha.shape == (15 + 6 - int((edge_index[0] == edge_index[1]).sum()), 2)


@pytest.mark.parametrize("pyg_cls,ga_cls,convert", PAIRS)
def test_explain_mode_runs_pygs_forward(pyg_cls, ga_cls, convert):
    """With an explainer's edge mask set the layer takes PyG's propagate, and so equals PyG with the same mask."""
    from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

    torch.manual_seed(2)
    ref = pyg_cls(8, 4, heads=2, add_self_loops=False).double()
    ours = getattr(ga_cls, convert)(ref)
    x, edge_index = torch.randn(6, 8, dtype=torch.float64), torch.randint(0, 6, (2, 15))
    mask = torch.rand(15, dtype=torch.float64)
    outs = []
    for conv in (ours, ref):
        set_masks(conv, mask, edge_index, apply_sigmoid=True)
        outs.append(conv(x, edge_index))
        clear_masks(conv)
    assert (outs[0] - outs[1]).abs().max() < 1e-10
    assert (ours(x, edge_index) - outs[0]).abs().max() > 1e-6  # the mask mattered


def test_pyg_test_gat_conv_cases():
    """PyG's test_gat_conv: shapes, the weights' shape with self-loops, bipartite (x, None) with size."""
    x1, x2 = torch.randn(4, 8), torch.randn(2, 16)
    edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    conv = ga.GATConv(8, 32, heads=2)
    assert str(conv) == "GATConv(8, 32, heads=2)"
    out = conv(x1, edge_index)
    assert out.size() == (4, 64)
    result = conv(x1, edge_index, return_attention_weights=True)
    assert result[0].size() == (4, 64) and result[1][0].size() == (2, 7) and result[1][1].size() == (7, 2)
    assert result[1][1].min() >= 0 and result[1][1].max() <= 1
    conv = ga.GATConv((8, 16), 32, heads=2)
    out = conv((x1, x2), edge_index)
    assert out.size() == (2, 64)
    assert conv((x1, None), edge_index, size=(4, 2)).size() == (2, 64)
    ref = PyGGATConv((8, 16), 32, heads=2)
    ref.load_state_dict(conv.state_dict())
    assert torch.allclose(conv((x1, x2), edge_index), ref((x1, x2), edge_index), atol=1e-6)
    assert torch.allclose(
        conv((x1, None), edge_index, size=(4, 2)), ref((x1, None), edge_index, size=(4, 2)), atol=1e-6
    )


def test_pyg_test_gatv2_conv_cases():
    x1, x2 = torch.randn(4, 8), torch.randn(2, 8)
    edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    for share in (False, True):
        conv = ga.GATv2Conv(8, 32, heads=2, share_weights=share)
        ref = PyGGATv2Conv(8, 32, heads=2, share_weights=share)
        ref.load_state_dict(conv.state_dict())
        assert str(conv) == "GATv2Conv(8, 32, heads=2)"
        assert torch.allclose(conv(x1, edge_index), ref(x1, edge_index), atol=1e-6)
        assert torch.allclose(conv((x1, x2), edge_index), ref((x1, x2), edge_index), atol=1e-6)


@pytest.mark.parametrize("pyg_cls,ga_cls,convert", PAIRS)
def test_gradient_penalty_equals_pygs(pyg_cls, ga_cls, convert):
    """Second derivatives through the fused path (self-loops on, the graph's own masked) equal PyG's (float64, 1e-8)."""
    torch.manual_seed(3)
    ref = pyg_cls(8, 4, heads=2, edge_dim=3).double()
    ours = getattr(ga_cls, convert)(ref)
    edge_index, edge_attr = _graph()
    results = []
    for conv in (ours, ref):
        conv.zero_grad()
        x = torch.randn(13, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_()
        (dx,) = torch.autograd.grad(conv(x, edge_index, edge_attr).square().sum(), x, create_graph=True)
        dx.square().sum().backward()
        results.append([dx] + [p.grad for p in conv.parameters()])
    for a, b in zip(*results):
        assert (a - b).abs().max() < 1e-8


def test_scored_attention_refuses_bad_scores():
    value, edge_index = torch.randn(4, 2, 3), torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match=r"'score' to be shape \(E, H\) = \(2, 2\)"):
        ga.ops.scored_attention(torch.zeros(3, 2), value, edge_index, 4)
    with pytest.raises(ValueError, match="'score' to be free of NaN"):
        ga.ops.scored_attention(torch.full((2, 2), float("nan")), value, edge_index, 4)
    with pytest.raises(TypeError, match="'score' to be of the dtype of 'value'"):
        ga.ops.scored_attention(torch.zeros(2, 2, dtype=torch.float64), value, edge_index, 4)
    with pytest.raises(ValueError, match="'num_targets'"):
        ga.ops.scored_attention(torch.zeros(2, 2), value, edge_index, -1)
    out, _ = ga.ops.scored_attention(torch.zeros(2, 2), value, edge_index, 4)
    assert torch.equal(out[0], torch.zeros(2, 3)) and torch.equal(out[3], torch.zeros(2, 3))  # no in-edges: 0
    with pytest.raises(ValueError, match=r"'loops' to be at most min\(S, num_targets\) = 4 \(got 5\)"):
        ga.ops.scored_attention(torch.zeros(7, 2), value, edge_index, 4, loops=5)
    with pytest.raises(ValueError, match=r"'score' to be shape \(E \+ loops, H\) = \(5, 2\)"):
        ga.ops.scored_attention(torch.zeros(2, 2), value, edge_index, 4, loops=3)


def test_scored_attention_loops_equal_the_concatenated_edges():
    """loops=N on a graph without own loops is the edge list with (i, i), i < N, appended: same output and weights
    as passing those edges."""
    g = torch.Generator().manual_seed(6)
    value, edge_index = torch.randn(5, 2, 3, generator=g, dtype=torch.float64), torch.tensor([[0, 1, 4], [1, 2, 2]])
    score = torch.randn(3 + 4, 2, generator=g, dtype=torch.float64)
    whole = torch.cat([edge_index, torch.arange(4).expand(2, -1)], dim=1)  # (2, 7)
    got = ga.ops.scored_attention(score, value, edge_index, 5, loops=4, need_weights=True)
    want = ga.ops.scored_attention(score, value, whole, 5, need_weights=True)
    assert (got[0] - want[0]).abs().max() < 1e-12 and (got[1] - want[1]).abs().max() < 1e-12


def test_scored_attention_loops_leave_the_own_loops_out_as_pygs_remove_self_loops():
    """loops=N on a graph with own loops (one twice, one at i >= N): PyG's remove_self_loops + add_self_loops on the
    edge list gives the same output, the same weights on the edges it keeps, and the same score gradients
    (float64, 1e-12); the own loops get weight 0 and gradient 0. Under create_graph=True too (the differentiable
    backward), and in training with dropout (the same draw as the looped list: the structure is the same)."""
    from torch_geometric.utils import add_self_loops, remove_self_loops

    g = torch.Generator().manual_seed(9)
    edge_index = torch.tensor([[0, 1, 4, 2, 3, 1, 2, 5], [1, 2, 2, 2, 3, 0, 2, 5]])  # own loops: 2->2 twice, 3, 5
    own = edge_index[0] == edge_index[1]  # (E,)
    kept = torch.cat([~own, torch.ones(4, dtype=torch.bool)])  # (E + 4,)
    looped = add_self_loops(remove_self_loops(edge_index)[0], num_nodes=4)[0]  # (2, E' + 4): PyG's edges, in order
    assert torch.equal(torch.cat([edge_index, torch.arange(4).expand(2, -1)], dim=1)[:, kept], looped)
    value = torch.randn(6, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    score = torch.randn(edge_index.size(1) + 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    w_out = torch.randn(6, 2, 3, generator=g, dtype=torch.float64)
    w_alpha = torch.randn(score.shape, generator=g, dtype=torch.float64)
    for create_graph in (False, True):
        got = ga.ops.scored_attention(score, value, edge_index, 6, loops=4, need_weights=True)
        want = ga.ops.scored_attention(score[kept], value, looped, 6, need_weights=True)
        assert (got[0] - want[0]).abs().max() < 1e-12
        assert (got[1][kept] - want[1]).abs().max() < 1e-12 and torch.equal(got[1][~kept], torch.zeros(4, 2))
        grads = [
            torch.autograd.grad((out * w_out).sum() + (alpha * w).sum(), (score, value), create_graph=create_graph)
            for (out, alpha), w in ((got, w_alpha), (want, w_alpha[kept]))
        ]
        assert (grads[0][0][kept] - grads[1][0][kept]).abs().max() < 1e-12
        assert torch.equal(grads[0][0][~kept], torch.zeros(4, 2))
        assert (grads[0][1] - grads[1][1]).abs().max() < 1e-12
    for need_weights in (True, False):  # False: the weights the backward reads stay in the structure's order
        torch.manual_seed(10)
        got = ga.ops.scored_attention(score, value, edge_index, 6, loops=4, dropout=0.5, need_weights=need_weights)
        torch.manual_seed(10)
        want = ga.ops.scored_attention(score[kept], value, looped, 6, dropout=0.5, need_weights=need_weights)
        assert (got[0] - want[0]).abs().max() < 1e-12
        assert not need_weights or (got[1][kept] - want[1]).abs().max() < 1e-12
        grads = [torch.autograd.grad((out * w_out).sum(), (score, value)) for out, _ in (got, want)]
        assert (grads[0][0][kept] - grads[1][0][kept]).abs().max() < 1e-12
        assert torch.equal(grads[0][0][~kept], torch.zeros(4, 2)) and (grads[0][1] - grads[1][1]).abs().max() < 1e-12


@pytest.mark.parametrize("pyg_cls,ga_cls,convert", PAIRS)
def test_a_nan_feature_on_an_own_loop_pyg_removes_is_never_read(pyg_cls, ga_cls, convert):
    """add_self_loops=True: an own loop's edge feature is not read (PyG removes the edge), so a NaN there neither
    raises nor reaches the output, which equals PyG's (the structure leaves the own loops out)."""
    torch.manual_seed(12)
    ref = pyg_cls(8, 4, heads=2, edge_dim=3).double()
    ours = getattr(ga_cls, convert)(ref)
    x, (edge_index, edge_attr) = torch.randn(13, 8, dtype=torch.float64), _graph()
    edge_attr[-1] = float("nan")  # the edge (4, 4): an own loop
    got, want = ours(x, edge_index, edge_attr), ref(x, edge_index, edge_attr)
    assert torch.isfinite(want).all() and (got - want).abs().max() < 1e-10
    edge_attr[0] = float("nan")  # an edge that is read: refused by name, as before
    with pytest.raises(ValueError, match="'x' to be finite"):
        ours(x, edge_index, edge_attr)


@pytest.mark.parametrize("pyg_cls,ga_cls,convert", PAIRS)
def test_self_loops_build_the_structure_once_and_return_pygs_edges(pyg_cls, ga_cls, convert):
    """add_self_loops=True: later calls on one graph hit the structure cache (the loops' structure is kept under
    edge_index, not rebuilt per call), and the returned edges are PyG's (an EdgeIndex stays one)."""
    from torch_geometric import EdgeIndex

    torch.manual_seed(5)
    ref = pyg_cls(8, 4, heads=2).double()
    ours = getattr(ga_cls, convert)(ref)
    x, (edge_index, _) = torch.randn(13, 8, dtype=torch.float64), _graph()
    ours(x, edge_index)
    misses = ga.ops.structure._CACHE.misses
    for _ in range(3):
        ours(x, edge_index).sum().backward()
    assert ga.ops.structure._CACHE.misses == misses
    index = EdgeIndex(edge_index, sparse_size=(13, 13))
    got, want = ours(x, index, return_attention_weights=True), ref(x, index, return_attention_weights=True)
    assert type(got[1][0]) is type(want[1][0]) is EdgeIndex
    assert torch.equal(got[1][0].as_tensor(), want[1][0].as_tensor())
    assert (got[1][1] - want[1][1]).abs().max() < 1e-10 and (got[0] - want[0]).abs().max() < 1e-10


@pytest.mark.parametrize("pyg_cls,ga_cls,convert", PAIRS)
def test_compiled_on_sampled_batches_of_changing_size_does_not_recompile_per_size(pyg_cls, ga_cls, convert):
    """A fresh sampled batch each step (NeighborLoader): after the first size change the graphs are dynamic."""
    compiled = []

    def backend(gm, example_inputs):  # counts the graphs dynamo hands over
        compiled.append(gm)
        return gm.forward

    torch._dynamo.reset()
    conv = torch.compile(ga_cls(8, 4, heads=2), backend=backend)
    sizes = []
    for n in (30, 27, 33, 41, 29):
        edge_index = torch.randint(0, n, (2, 3 * n))
        conv(torch.randn(n, 8), edge_index).sum().backward()
        sizes.append(len(compiled))
    assert sizes[-1] == sizes[1], sizes  # no new graph after the second size


@pytest.mark.parametrize(
    "convert",
    [
        (PyGGATConv, lambda c: ga.GATConv.from_gat_conv(c), lambda layer: layer.to_gat_conv()),
        (PyGGATv2Conv, lambda c: ga.GATv2Conv.from_gatv2_conv(c), lambda layer: layer.to_gatv2_conv()),
    ],
    ids=["GATConv", "GATv2Conv"],
)
def test_conversion_keeps_float64_weights_that_float32_cannot_hold(convert):
    """Weights trained in float64 survive ``from_*`` and ``to_*`` bit for bit (a copy through a float32
    layer would round them to about 1e-7)."""
    pyg_cls, to_ga, to_pyg = convert
    torch.manual_seed(0)
    conv = pyg_cls(8, 4, heads=2, edge_dim=3).double()
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn_like(p))
    layer = to_ga(conv)
    back = to_pyg(layer)
    for name, p in conv.state_dict().items():
        assert torch.equal(layer.state_dict()[name], p), name
        assert torch.equal(back.state_dict()[name], p), name


@pytest.mark.parametrize("cls", ["GATConv", "GATv2Conv"])
@pytest.mark.parametrize(
    "edge_index, error, fragment",
    [
        (torch.tensor([[0, 7], [1, 2]]), IndexError, "'edge_index[0]' to be sources < S = 6"),
        (torch.tensor([[0, -1], [1, 2]]), IndexError, "'edge_index' to be non-negative"),
        (torch.tensor([[0.0, 1.0], [1.0, 2.0]]), TypeError, "'edge_index' to have dtype int64 or int32"),
        (torch.tensor([0, 1, 2]), ValueError, "'edge_index' to have shape (2, E)"),
    ],
    ids=["out_of_range", "negative", "float", "1d"],
)
def test_a_bad_edge_index_is_named_before_the_fast_path_gathers(cls, edge_index, error, fragment):
    """The fused forward indexes the scores by the edges: a bad list used to fail inside torch's index_select."""
    conv = getattr(ga, cls)(5, 4)
    with pytest.raises(error) as err:
        conv(torch.randn(6, 5), edge_index)
    assert fragment in str(err.value)


@pytest.mark.parametrize("cls", ["GATConv", "GATv2Conv"])
def test_non_finite_features_are_named_as_the_callers_input(cls):
    """A NaN feature made the kernel refuse an internal 'score' tensor the caller never passed."""
    x = torch.randn(6, 5)
    x[5] = float("nan")  # an isolated node's features: its self-loop's score is NaN
    with pytest.raises(ValueError, match=r"^Expected 'x' to be finite.*\(got attention scores with a NaN"):
        getattr(ga, cls)(5, 4)(x, torch.tensor([[0, 1], [1, 2]]))


def test_gatv2_refuses_edge_features_it_has_no_weights_for():
    """PyG's GATv2Conv asserts ``lin_edge is not None``; the fused path called None."""
    with pytest.raises(ValueError, match="^Expected 'edge_attr' to be None for a layer built without edge_dim"):
        ga.GATv2Conv(5, 4)(torch.randn(3, 5), torch.tensor([[0, 1], [1, 2]]), torch.randn(2, 3))


def test_a_size_that_contradicts_the_features_is_refused_as_pyg_does():
    """PyG raises on ``size=(2, 2)`` with 6 nodes; the fused path returned a (6, C) output."""
    x, edge_index = torch.randn(6, 5), torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError):
        PyGGATConv(5, 4)(x, edge_index, size=(2, 2))
    with pytest.raises(ValueError, match=r"^Expected 'size' to be \(S, L\) = \(6, 6\)"):
        ga.GATConv(5, 4)(x, edge_index, size=(2, 2))
    conv = ga.GATConv(5, 4)
    assert torch.equal(conv(x, edge_index, size=(6, 6)), conv(x, edge_index))


@pytest.mark.parametrize(
    "pyg_cls, convert",
    [(PyGGATConv, ga.GATConv.from_gat_conv), (PyGGATv2Conv, ga.GATv2Conv.from_gatv2_conv)],
    ids=["GATConv", "GATv2Conv"],
)
def test_dropout_one_in_eval_is_pyg_s_layer(pyg_cls, convert):
    """PyG builds and evaluates a layer with ``dropout=1.0``; the fused path refused it at forward."""
    ref = pyg_cls(5, 4, heads=2, dropout=1.0).double().eval()
    ours = convert(ref)
    x, edge_index = torch.randn(6, 5, dtype=torch.float64), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    torch.testing.assert_close(ours(x, edge_index), ref(x, edge_index), atol=1e-10, rtol=0)


@pytest.mark.parametrize("entries, refused", [((3e38, 3e38), False), ((float("inf"), -float("inf")), True)])
def test_score_and_bias_checks_hold_where_one_sum_cannot_tell(entries, refused):
    """The NaN/+inf checks first sum the scores (one pass); a sum of NaN or +inf sends them to the entry-wise check.
    Finite scores whose float32 sum overflows are accepted (as one by one: the weights equal the float64 path's),
    and a +inf hidden by a -inf (sum NaN) is refused, by scored_attention and by ga.attention's edge_bias alike."""
    value, edge_index = torch.randn(3, 2, 4), torch.tensor([[0, 1, 2, 0], [1, 1, 1, 2]])
    score = torch.tensor([[entries[0], 0.0], [entries[1], 1.0], [0.0, 2.0], [-1.0, 0.0]])  # (E, H) float32
    q = k = torch.zeros(3, 2, 1)  # scores 0: the bias alone
    if refused:
        with pytest.raises(ValueError, match="'score' to be free of NaN"):
            ga.ops.scored_attention(score, value, edge_index, 3)
        with pytest.raises(ValueError, match="'edge_bias' to be free of NaN"):
            ga.attention(q, k, value, edge_index, edge_bias=score)
        return
    out, alpha = ga.ops.scored_attention(score, value, edge_index, 3, need_weights=True)
    want, want_alpha = ga.ops.scored_attention(score.double(), value.double(), edge_index, 3, need_weights=True)
    torch.testing.assert_close(alpha, want_alpha.float())
    torch.testing.assert_close(out, want.float())
    torch.testing.assert_close(ga.attention(q, k, value, edge_index, edge_bias=score)[0], out)


@pytest.mark.parametrize("cls", [ga.GATConv, ga.GATv2Conv])
def test_an_input_of_another_dtype_than_the_layer_is_named(cls):
    """float32 features into a float64 layer (plain and bipartite): a TypeError naming 'x' and both dtypes, where
    PyG's layer fails inside its matmul; a lazy layer too (its weights materialise in the layer's dtype)."""
    layer = cls(6, 4, heads=2).double()
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    for x in (torch.randn(3, 6), (torch.randn(3, 6), torch.randn(3, 6, dtype=torch.float64))):
        with pytest.raises(
            TypeError, match=r"Expected 'x' to have the layer's dtype torch.float64 \(got torch.float32\)"
        ):
            layer(x, edge_index)
    with pytest.raises(TypeError, match=r"Expected 'x' to have the layer's dtype torch.float32 \(got torch.float64\)"):
        cls(-1, 4, heads=2)(torch.randn(3, 6, dtype=torch.float64), edge_index)
    assert cls(-1, 4, heads=2).double()(torch.randn(3, 6, dtype=torch.float64), edge_index).dtype == torch.float64
