"""``graphattn.TransformerConv`` against ``torch_geometric.nn.TransformerConv``: outputs, weights, gradients."""

import pytest
import torch
from torch_geometric.nn import TransformerConv as PyGTransformerConv
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csc_tensor, to_torch_csr_tensor

import graphattn as ga
from tests.conftest import DTYPES, assert_close

CONFIGS = [
    pytest.param(dict(), id="default"),
    pytest.param(dict(edge_dim=3), id="edge_dim"),
    pytest.param(dict(edge_dim=11, beta=True), id="edge_dim_wide-beta"),
    pytest.param(dict(beta=True, concat=False), id="beta-mean"),
    pytest.param(dict(root_weight=False, bias=False, edge_dim=2), id="no_root-no_bias"),
    pytest.param(dict(concat=False, edge_dim=4), id="mean-edge_dim"),
]


def random_graph(S, L, E, seed=0):
    """Random edges (with duplicates) whose targets skip node L - 1: a query with no edge."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, S, (E,), generator=g)
    dst = torch.randint(0, max(L - 1, 1), (E,), generator=g)
    return torch.stack([src, dst])


def run(conv, x, edge_index, edge_attr):
    out, (_, alpha) = conv(x, edge_index, edge_attr, return_attention_weights=True)
    return out, alpha


def compare(ours, ref, x, edge_index, edge_attr, dtype):
    """Outputs, attention weights and the gradients of inputs and parameters agree."""
    xs = [t.detach().clone().requires_grad_() for t in (x if isinstance(x, tuple) else (x,))]
    xr = [t.detach().clone().requires_grad_() for t in xs]
    ea = None if edge_attr is None else (edge_attr.clone().requires_grad_(), edge_attr.clone().requires_grad_())
    out, alpha = run(ours, tuple(xs) if len(xs) == 2 else xs[0], edge_index, None if ea is None else ea[0])
    out_r, alpha_r = run(ref, tuple(xr) if len(xr) == 2 else xr[0], edge_index, None if ea is None else ea[1])
    assert_close(out, out_r, dtype)
    assert_close(alpha, alpha_r, dtype)
    weight, alpha_weight = torch.randn_like(out), torch.randn_like(alpha)
    # random weights on alpha too: alpha.sum() is constant (each target's weights sum to 1), its gradient is 0
    ((out * weight).sum() + (alpha * alpha_weight).sum()).backward()
    ((out_r * weight).sum() + (alpha_r * alpha_weight).sum()).backward()
    for a, b in zip(xs, xr):
        assert_close(a.grad, b.grad, dtype)
    if ea is not None:
        assert_close(ea[0].grad, ea[1].grad, dtype)
    grads = {n: p.grad for n, p in ref.named_parameters()}
    for name, p in ours.named_parameters():
        assert_close(p.grad, grads[name], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", CONFIGS)
def test_from_transformer_conv_is_exact(config, dtype):
    ref = PyGTransformerConv(7, 5, heads=3, **config).to(dtype)
    ours = ga.TransformerConv.from_transformer_conv(ref)
    N, E = 13, 40
    edge_index = random_graph(N, N, E)
    edge_attr = torch.randn(E, config["edge_dim"], dtype=dtype) if "edge_dim" in config else None
    compare(ours, ref, torch.randn(N, 7, dtype=dtype), edge_index, edge_attr, dtype)


@pytest.mark.parametrize("config", CONFIGS[:3])
def test_to_transformer_conv_is_exact_bipartite(config):
    dtype = torch.float64
    ours = ga.TransformerConv((6, 4), 5, heads=2, **config).to(dtype)
    ref = ours.to_transformer_conv()
    assert isinstance(ref, PyGTransformerConv)
    S, L, E = 11, 7, 30
    edge_index = random_graph(S, L, E, seed=1)
    edge_attr = torch.randn(E, config["edge_dim"], dtype=dtype) if "edge_dim" in config else None
    x = (torch.randn(S, 6, dtype=dtype), torch.randn(L, 4, dtype=dtype))
    compare(ours, ref, x, edge_index, edge_attr, dtype)


@pytest.mark.parametrize("impl", ["auto", "message_passing"])
def test_empty_graph_and_isolated_targets(impl):
    ref = PyGTransformerConv(4, 3, heads=2, edge_dim=2).double()
    ours = ga.TransformerConv.from_transformer_conv(ref, impl=impl)
    x = torch.randn(5, 4, dtype=torch.float64)
    for E in (0, 3):
        edge_index = random_graph(5, 5, E, seed=2)
        edge_attr = torch.randn(E, 2, dtype=torch.float64)
        out, alpha = run(ours, x, edge_index, edge_attr)
        out_r, alpha_r = run(ref, x, edge_index, edge_attr)
        assert_close(out, out_r)
        assert alpha.shape == (E, 2)


def test_message_passing_path_equals_fast_path():
    conv = ga.TransformerConv(6, 4, heads=2, edge_dim=3, beta=True).double()
    slow = ga.TransformerConv(6, 4, heads=2, edge_dim=3, beta=True, impl="message_passing").double()
    slow.load_state_dict(conv.state_dict())
    edge_index = random_graph(9, 9, 25, seed=3)
    edge_attr = torch.randn(25, 3, dtype=torch.float64)
    compare(conv, slow, torch.randn(9, 6, dtype=torch.float64), edge_index, edge_attr, torch.float64)


def test_state_dict_names_match_pyg():
    ref = PyGTransformerConv(8, 4, heads=2, edge_dim=3, beta=True)
    ours = ga.TransformerConv(8, 4, heads=2, edge_dim=3, beta=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict())


def test_fused_projections_leave_hooks_on_the_linears_working():
    """The projections of one x run as one matmul, except when a Linear has a hook: then each is called."""
    ref = PyGTransformerConv(6, 4, heads=2).double()
    ours = ga.TransformerConv.from_transformer_conv(ref)
    seen = []
    ours.lin_key.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    x = torch.randn(9, 6, dtype=torch.float64)
    compare(ours, ref, x, random_graph(9, 9, 25), None, torch.float64)
    assert seen == [(9, 8)]


def test_repr_is_pygs():
    assert repr(ga.TransformerConv(8, 32, heads=2)) == "TransformerConv(8, 32, heads=2)"
    conv = PyGTransformerConv((8, 16), 4, heads=1, beta=True, edge_dim=3, concat=False, dropout=0.1)
    assert repr(ga.TransformerConv.from_transformer_conv(conv)) == repr(conv) == "TransformerConv((8, 16), 4, heads=1)"


def transposed(layout, edge_index, S, L):
    """PyG's ``adj_t (L, S)`` in ``layout``, built as its tests build it (``to_torch_*_tensor(...).t()``)."""
    build = {"coo": to_torch_coo_tensor, "csr": to_torch_csc_tensor, "csc": to_torch_csr_tensor}[layout]
    adj_t = build(edge_index, size=(S, L)).t()
    return adj_t.coalesce() if layout == "coo" else adj_t  # a transposed COO is uncoalesced; PyG refuses those


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_adjacency_matches_pyg(layout):
    """PyG's convention: the transposed adjacency adj_t (L, S), adj_t[i, j] != 0 for the edge j -> i."""
    ref = PyGTransformerConv((5, 3), 4, heads=2).double()
    ours = ga.TransformerConv.from_transformer_conv(ref)
    S, L = 6, 4
    edge_index = random_graph(S, L, 12, seed=4).unique(dim=1)  # sparse formats merge duplicates
    adj_t = transposed(layout, edge_index, S, L)
    x = (torch.randn(S, 5, dtype=torch.float64), torch.randn(L, 3, dtype=torch.float64))
    out, (adj_back, alpha) = ours(x, adj_t, return_attention_weights=True)
    out_r, (_, alpha_r) = ref(x, adj_t, return_attention_weights=True)
    assert adj_back is adj_t
    assert_close(out, out_r)
    assert_close(alpha, alpha_r)
    assert_close(out, ours(x, edge_index))


def test_sparse_csc_adjacency_which_pyg_refuses():
    conv = ga.TransformerConv(5, 4, heads=2).double()
    edge_index = random_graph(6, 6, 12, seed=4).unique(dim=1)
    x = torch.randn(6, 5, dtype=torch.float64)
    assert_close(conv(x, transposed("csc", edge_index, 6, 6)), conv(x, edge_index))


def test_edge_index_object_and_size():
    from torch_geometric import EdgeIndex

    conv = ga.TransformerConv(4, 2, heads=2).double()
    x = torch.randn(6, 4, dtype=torch.float64)
    edge_index = random_graph(6, 6, 15, seed=5)
    ei = EdgeIndex(edge_index, sparse_size=(6, 6))
    assert_close(conv(x, ei), conv(x, edge_index))
    assert_close(conv(x, edge_index, size=(6, 6)), conv(x, edge_index))
    with pytest.raises(ValueError, match="'size'"):
        conv(x, edge_index, size=(6, 5))


def test_sparse_tensor_matches_pyg():
    torch_sparse = pytest.importorskip("torch_sparse")
    ref = PyGTransformerConv(5, 4, heads=2).double()
    ours = ga.TransformerConv.from_transformer_conv(ref)
    edge_index = random_graph(6, 6, 12, seed=6).unique(dim=1)
    adj_t = torch_sparse.SparseTensor.from_edge_index(edge_index, sparse_sizes=(6, 6)).t()
    x = torch.randn(6, 5, dtype=torch.float64)
    assert_close(ours(x, adj_t), ref(x, adj_t))


def test_lazy_in_channels():
    conv = ga.TransformerConv(-1, 4, heads=2, edge_dim=2)
    ref = PyGTransformerConv(-1, 4, heads=2, edge_dim=2)
    x = torch.randn(5, 7)
    edge_index = random_graph(5, 5, 9, seed=7)
    edge_attr = torch.randn(9, 2)
    ref(x, edge_index, edge_attr)  # materialises the lazy weights
    conv(x, edge_index, edge_attr)
    conv.load_state_dict(ref.state_dict())
    assert_close(conv(x, edge_index, edge_attr), ref(x, edge_index, edge_attr))
    bipartite = ga.TransformerConv((-1, -1), 4)
    assert bipartite((torch.randn(5, 3), torch.randn(2, 6)), edge_index[:, edge_index[1] < 2]).shape == (2, 4)


def test_to_hetero_with_differently_sized_node_types():
    from torch_geometric.nn import to_hetero

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = ga.TransformerConv((-1, -1), 8, heads=2)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    metadata = (["a", "b"], [("a", "to", "b"), ("b", "to", "a"), ("b", "self", "b")])
    model = to_hetero(Net(), metadata, aggr="sum")
    x = {"a": torch.randn(4, 3), "b": torch.randn(5, 7)}
    edges = {
        ("a", "to", "b"): torch.tensor([[0, 1, 3], [4, 0, 2]]),
        ("b", "to", "a"): torch.tensor([[0, 4], [1, 3]]),
        ("b", "self", "b"): torch.tensor([[0, 1], [1, 2]]),
    }
    out = model(x, edges)
    assert out["a"].shape == (4, 16) and out["b"].shape == (5, 16)


def test_to_hetero_with_more_edge_types_than_the_cache_builds_each_structure_once(monkeypatch):
    """12 edge types > the default cache size (8): with ``ops.set_cache_size(16)`` repeated calls reuse
    every structure (one build per edge type); at the default size they rebuild. Same outputs either way."""
    from torch_geometric.nn import to_hetero

    builds = []

    class CountingGraph(ga.ops.structure._Graph):
        def __init__(self, *args):
            builds.append(1)
            super().__init__(*args)

    monkeypatch.setattr(ga.ops.structure, "_Graph", CountingGraph)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = ga.TransformerConv(-1, 4, heads=2)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    types = [f"t{k}" for k in range(4)]
    relations = [(a, "to", b) for a in types for b in types if a != b]  # 12 edge types
    model = to_hetero(Net(), (types, relations), aggr="sum")
    x = {t: torch.randn(6, 3) for t in types}
    edges = {rel: random_graph(6, 6, 15, seed=k) for k, rel in enumerate(relations)}
    first = model(x, edges)
    assert ga.ops.cache_size() == 8 < len(relations)
    model(x, edges)
    assert len(builds) > 2 * len(relations) - 1  # the default cache evicts: rebuilt on the second call
    try:
        ga.ops.set_cache_size(0)  # empty it
        ga.ops.set_cache_size(16)
        builds.clear()
        outs = [model(x, edges) for _ in range(3)]
        assert len(builds) == len(relations)  # built once per edge type, then reused
    finally:
        ga.ops.set_cache_size(ga.ops.CACHE_SIZE)
    for out in outs:  # (the first call ran the lazy projections one by one, the others fused: rounding)
        for t in types:
            assert_close(out[t], first[t])


def test_refusals():
    conv = ga.TransformerConv(4, 2, edge_dim=3)
    x = torch.randn(3, 4)
    edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="'edge_attr'"):
        conv(x, edge_index)
    with pytest.raises(ValueError, match=r"'edge_attr'.*\(2, 3\)"):
        conv(x, edge_index, torch.randn(3, 3))
    with pytest.raises(ValueError, match="'edge_attr'"):
        ga.TransformerConv(4, 2)(x, edge_index, torch.randn(2, 3))
    with pytest.raises(TypeError, match="'return_attention_weights'"):
        conv(x, edge_index, torch.randn(2, 3), return_attention_weights="yes")
    with pytest.raises(ValueError, match="x_src, None"):
        ga.TransformerConv(4, 2)((x, None), edge_index)
    with pytest.raises(ValueError, match="'flow'"):
        ga.TransformerConv(4, 2, flow="target_to_source")
    with pytest.raises(ValueError, match="'heads'"):
        ga.TransformerConv(4, 2, heads=0)
    with pytest.raises(ValueError, match=r"^Expected 'edge_attr' to be None .*\(got list\)"):
        ga.TransformerConv(4, 2)(x, edge_index, [1.0, 2.0])


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(dropout="0.1"), TypeError, "dropout"),
        (dict(heads="2"), TypeError, "heads"),
        (dict(bias="no"), TypeError, "bias"),
        (dict(concat=1), TypeError, "concat"),
        (dict(edge_dim="3"), TypeError, "edge_dim"),
        (dict(impl=None), ValueError, "impl"),
        (dict(in_channels=(4, 4, 4)), TypeError, "in_channels"),
        (dict(out_channels=2**40), ValueError, "out_channels"),
        (dict(heads=2**40), ValueError, "heads"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_constructor_arguments_of_the_wrong_type_or_size_name_the_argument(kwargs, exc, name):
    args = dict(in_channels=4, out_channels=2, heads=2) | kwargs
    with pytest.raises(exc, match=rf"^Expected '{name}'"):
        ga.TransformerConv(**args)


@pytest.mark.parametrize("impl", ["auto", "message_passing"])
def test_features_of_another_dtype_and_torchscript_are_refused_clearly(impl):
    conv = ga.TransformerConv(4, 2, heads=2, impl=impl)
    x, edge_index = torch.randn(3, 4), torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match=r"^Expected 'x' to be of the layer's dtype torch.float32"):
        conv(x.double(), edge_index)
    with pytest.raises(NotImplementedError, match=r"torch.jit.trace.*torch.compile"):
        torch.jit.trace(conv, (x, edge_index))
    with pytest.raises(NotImplementedError, match=r"torch.jit.script.*torch.compile"):
        torch.jit.script(conv)


@pytest.mark.parametrize(
    "pattern",
    [ga.patterns.full(), ga.patterns.causal(), ga.patterns.window(1, 1)],
    ids=["full", "causal", "window_1_1"],
)
@pytest.mark.parametrize("impl", ["auto", "message_passing"])
def test_pattern_with_batch_attends_within_each_graph(pattern, impl):
    """Against the explicit per-graph edges (graphs.batch_sequences) run through PyG's TransformerConv."""
    lengths = [3, 1, 6, 4, 6]
    edge_index, batch = ga.graphs.batch_sequences(lengths, pattern)
    ref = PyGTransformerConv(5, 3, heads=2, beta=True).double()
    conv = ga.TransformerConv.from_transformer_conv(ref, impl=impl)
    x = torch.randn(sum(lengths), 5, dtype=torch.float64, requires_grad=True)
    out = conv(x, pattern, batch=batch)
    out_r = ref(x, edge_index)
    assert_close(out, out_r)
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    (grad_r,) = torch.autograd.grad(out_r.square().sum(), x)
    assert_close(grad, grad_r)
    _, (edges, alpha) = conv(x, pattern, return_attention_weights=True, batch=batch)
    assert torch.equal(edges, edge_index)
    assert_close(alpha, ref(x, edge_index, return_attention_weights=True)[1][1])


def test_pattern_without_batch_is_one_graph():
    conv = ga.TransformerConv(4, 3, heads=2).double()
    x = torch.randn(7, 4, dtype=torch.float64)
    assert_close(conv(x, ga.patterns.causal()), conv(x, ga.patterns.causal().edge_index(7)))


def test_batch_refusals():
    conv = ga.TransformerConv(4, 3)
    x = torch.randn(5, 4)
    with pytest.raises(ValueError, match="'batch'"):
        conv(x, ga.patterns.full(), batch=torch.tensor([0, 1, 0, 1, 1]))
    with pytest.raises(ValueError, match="'batch'"):
        conv(x, ga.patterns.full(), batch=torch.zeros(4, dtype=torch.long))
    with pytest.raises(NotImplementedError, match="'pattern'"):
        conv(x, ga.patterns.topk(torch.randn(5, 5), 2), batch=torch.tensor([0, 0, 1, 1, 1]))
    with pytest.raises(ValueError, match="'edge_index'"):
        ga.TransformerConv(4, 3, edge_dim=2)(x, ga.patterns.full(), torch.randn(25, 2))


@pytest.mark.slow
def test_torch_compile_fullgraph_and_export():
    """Traces without graph breaks (the eager backend: tracing only, fast) and exports; same numbers."""
    from torch_geometric import EdgeIndex

    conv = ga.TransformerConv(6, 4, heads=2, edge_dim=3, beta=True).eval()
    x = torch.randn(9, 6)
    edge_index = random_graph(9, 9, 20, seed=8)
    edge_attr = torch.randn(20, 3)
    expected = conv(x, edge_index, edge_attr)
    compiled = torch.compile(conv, fullgraph=True, backend="eager")
    assert_close(compiled(x, edge_index, edge_attr), expected)
    assert_close(compiled(x, EdgeIndex(edge_index, sparse_size=(9, 9)), edge_attr), expected)
    exported = torch.export.export(conv, (x, edge_index, edge_attr))
    assert_close(exported.module()(x, edge_index, edge_attr), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_exact_on_cuda():
    ref = PyGTransformerConv(7, 5, heads=3, edge_dim=3, beta=True).double().cuda()
    ours = ga.TransformerConv.from_transformer_conv(ref)
    edge_index = random_graph(13, 13, 40).cuda()
    edge_attr = torch.randn(40, 3, dtype=torch.float64, device="cuda")
    compare(ours, ref, torch.randn(13, 7, dtype=torch.float64, device="cuda"), edge_index, edge_attr, torch.float64)
    lengths = [3, 1, 6]
    edges, batch = ga.graphs.batch_sequences(lengths)
    x = torch.randn(10, 7, dtype=torch.float64, device="cuda")
    plain = ga.TransformerConv.from_transformer_conv(PyGTransformerConv(7, 5, heads=3).double().cuda())
    assert_close(plain(x, ga.patterns.full(), batch=batch.cuda()), plain(x, edges.cuda()))
