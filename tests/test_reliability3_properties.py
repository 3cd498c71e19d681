"""Reliability round 3 (issue 20), property-based: ``ga.TransformerConv`` over its argument space against PyG's
``TransformerConv`` with the same weights, and ``batch=`` global attention against per-graph SDPA.

Examples are few and small (``max_examples=25``) so the suite stays fast; float64 at the 1e-10 tolerance."""

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch_geometric.nn import TransformerConv as PyGTransformerConv

import graphattn as ga
from tests.conftest import assert_close

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def transformer_conv_cases(draw):
    """Constructor arguments and inputs: heads, concat, beta, edge_dim, root_weight, bias, bipartite inputs,
    targets without edges, duplicate edges, no edges at all."""
    config = dict(
        heads=draw(st.integers(1, 3)),
        concat=draw(st.booleans()),
        beta=draw(st.booleans()),
        edge_dim=draw(st.one_of(st.none(), st.integers(1, 3))),
        root_weight=draw(st.booleans()),
        bias=draw(st.booleans()),
    )
    out_channels = draw(st.integers(1, 4))
    bipartite = draw(st.booleans())
    f_src = draw(st.integers(1, 5))
    f_dst = draw(st.integers(1, 5)) if bipartite else f_src
    S = draw(st.integers(1, 6))
    L = draw(st.integers(1, 6)) if bipartite else S
    E = draw(st.integers(0, 14))
    src = draw(st.lists(st.integers(0, S - 1), min_size=E, max_size=E))
    dst = draw(st.lists(st.integers(0, max(L - 2, 0)), min_size=E, max_size=E))  # target L - 1: no edge if L > 1
    if E and draw(st.booleans()):  # an edge stored twice
        src, dst = src + src[:1], dst + dst[:1]
    seed = draw(st.integers(0, 2**16))
    return config, out_channels, (f_src, f_dst, bipartite), (S, L), torch.tensor([src, dst], dtype=torch.long), seed


@SETTINGS
@given(case=transformer_conv_cases())
def test_transformer_conv_equals_pyg_over_its_argument_space(case):
    config, out_channels, (f_src, f_dst, bipartite), (S, L), edge_index, seed = case
    torch.manual_seed(seed)
    in_channels = (f_src, f_dst) if bipartite else f_src
    ref = PyGTransformerConv(in_channels, out_channels, **config).double()
    ours = ga.TransformerConv.from_transformer_conv(ref)
    x = (
        (torch.randn(S, f_src, dtype=torch.float64), torch.randn(L, f_dst, dtype=torch.float64))
        if bipartite
        else torch.randn(S, f_src, dtype=torch.float64)
    )
    E = edge_index.size(1)
    edge_attr = None if config["edge_dim"] is None else torch.randn(E, config["edge_dim"], dtype=torch.float64)
    out, (_, alpha) = ours(x, edge_index, edge_attr, return_attention_weights=True)
    out_r, (_, alpha_r) = ref(x, edge_index, edge_attr, return_attention_weights=True)
    assert_close(out, out_r)
    assert_close(alpha, alpha_r)
    assert_close(ours(x, edge_index, edge_attr), out_r)  # without the weights: the same result


PATTERNS = [
    ga.patterns.full(),
    ga.patterns.causal(),
    ga.patterns.window(1, 0),
    ga.patterns.window(1, 1) | ga.patterns.global_tokens([0]),
]


@st.composite
def batches(draw):
    """Graph sizes (empty graphs included), graph ids with gaps, a pattern, heads, whether weights are asked."""
    sizes = draw(st.lists(st.integers(0, 5), min_size=1, max_size=6))
    gaps = draw(st.lists(st.sampled_from([1, 1, 2, 37, 10**6]), min_size=len(sizes), max_size=len(sizes)))
    ids = torch.tensor(gaps).cumsum(0) - gaps[0]  # (G,) increasing graph ids, the first 0
    batch = torch.repeat_interleave(ids, torch.tensor(sizes))  # (N,)
    return (
        batch,
        sizes,
        draw(st.sampled_from(PATTERNS)),
        draw(st.integers(1, 3)),
        draw(st.booleans()),
        draw(st.integers(0, 2**16)),
    )


@SETTINGS
@given(case=batches())
def test_global_attention_with_batch_equals_per_graph_sdpa(case):
    batch, sizes, pattern, heads, weights, seed = case
    torch.manual_seed(seed)
    conv = ga.AttentionConv(4, 2 * heads, heads=heads).double()
    x = torch.randn(batch.numel(), 4, dtype=torch.float64)
    result = conv(x, pattern, batch=batch, return_attention_weights=weights)
    out = result[0] if weights else result
    D = 2
    q, k, v = (lin(x).view(-1, heads, D).transpose(0, 1) for lin in (conv.lin_query, conv.lin_key, conv.lin_value))
    expected, dense = [], []
    start = 0
    for n in sizes:  # per graph: SDPA with the pattern's mask, then the output projection
        if n == 0:
            continue
        mask = pattern.mask(n)  # (n, n), True = may attend
        part = slice(start, start + n)
        y = F.scaled_dot_product_attention(q[:, part], k[:, part], v[:, part], attn_mask=mask)  # (H, n, D)
        expected.append(conv.lin_out(y.transpose(0, 1).reshape(n, heads * D)))  # (n, F_out)
        w = torch.softmax((q[:, part] @ k[:, part].mT / D**0.5).masked_fill(~mask, float("-inf")), -1)  # (H, n, n)
        dense.append((start, w))
        start += n
    assert_close(out, torch.cat(expected) if expected else out.new_zeros(0, 2 * heads))
    if weights:
        edge_index, alpha = result[1]
        for s, w in dense:  # each edge's weight is the dense weight of its (query i, key j)
            inside = (edge_index[1] >= s) & (edge_index[1] < s + w.size(-1))  # (E,) edges into this graph
            j, i = edge_index[0, inside] - s, edge_index[1, inside] - s
            assert_close(alpha[inside], w[:, i, j].t())
        assert alpha.size(0) == sum(int(pattern.mask(n).sum()) for n in sizes if n)
