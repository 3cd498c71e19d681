"""Property tests of prune.metrics, viz.attention_graph, graphattn.attention and AttentionConv's entry checks.

For random valid inputs the result equals a reference written here without the
code under test (numpy, a Python loop, ``scipy.stats.spearmanr``, a float64
per-edge loop), and finite input never gives NaN. For random invalid inputs
(wrong types, NaN or inf, negative weights, out-of-range indices) the call
raises the documented exception type with validate's template naming the
argument, ``Expected '<name>' ...``: never an error from inside torch, numpy,
networkx or matplotlib.

Hypothesis runs derandomised (the same examples on every run, no database).
"""

import math

import numpy as np
import pytest
import torch
from conftest import assert_close
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure

import graphattn as ga
from graphattn import viz
from graphattn.prune import metrics

SETTINGS = settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

not_a_tensor = st.one_of(
    st.none(), st.floats(), st.lists(st.floats(-1, 1), min_size=1, max_size=3), st.text(max_size=2)
)
not_finite = st.sampled_from([float("nan"), float("inf"), float("-inf")])
not_an_int = st.one_of(st.floats(allow_nan=True), st.booleans(), st.text(max_size=2), st.just([1]))


def raises_naming(error, name, call):
    """``call()`` raises ``error`` (a type or tuple) with validate's template naming ``name``."""
    with pytest.raises(error) as info:
        call()
    assert str(info.value).startswith(f"Expected '{name}"), str(info.value)


@st.composite
def dense_case(draw, max_side=6):
    """``(scores (B, L, S) float64, keep (B, L, S) bool, valid (B, L, S) bool with keep inside valid)``."""
    B, L, S = draw(st.integers(1, 2)), draw(st.integers(1, max_side)), draw(st.integers(1, max_side))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, L, S, generator=g, dtype=torch.float64) * draw(st.sampled_from([0.1, 1.0, 30.0]))
    valid = torch.rand(B, L, S, generator=g) < draw(st.floats(0.3, 1.0))
    keep = valid & (torch.rand(B, L, S, generator=g) < draw(st.floats(0.0, 1.0)))
    return scores, keep, valid


def _softmax_row(row: list[float]) -> list[float]:
    top = max(row)
    e = [math.exp(s - top) for s in row]
    return [x / sum(e) for x in e]


# ----------------------------------------------------------------------------------------- metrics
@SETTINGS
@given(dense_case())
def test_attention_mass_is_the_python_sum_of_kept_weights(case):
    scores, keep, _ = case
    weights = torch.softmax(scores, dim=-1)  # (B, L, S)
    expected = [
        [sum(w for w, k in zip(weights[b, i].tolist(), keep[b, i].tolist()) if k) for i in range(scores.size(1))]
        for b in range(scores.size(0))
    ]
    assert_close(metrics.attention_mass(weights, keep), torch.tensor(expected, dtype=torch.float64))


@SETTINGS
@given(dense_case(), st.booleans())
def test_kl_sparse_dense_is_the_python_loop_over_kept_keys(case, with_valid):
    """KL(q || p) with p the softmax over the valid keys, q over the kept ones; +inf with no kept key."""
    scores, keep, valid = case
    valid = valid if with_valid else torch.ones_like(valid)
    keep = keep & valid
    kl = metrics.kl_sparse_dense(scores, keep, valid if with_valid else None)
    for b in range(scores.size(0)):
        for i in range(scores.size(1)):
            row, kept, ok = scores[b, i].tolist(), keep[b, i].tolist(), valid[b, i].tolist()
            if not any(kept):
                assert kl[b, i] == float("inf")
                continue
            p = dict(zip([j for j in range(len(row)) if ok[j]], _softmax_row([s for s, v in zip(row, ok) if v])))
            q = dict(zip([j for j in range(len(row)) if kept[j]], _softmax_row([s for s, k in zip(row, kept) if k])))
            expected = sum(qj * (math.log(qj) - math.log(p[j])) for j, qj in q.items() if qj > 0)
            assert math.isfinite(float(kl[b, i]))
            assert abs(float(kl[b, i]) - max(expected, 0.0)) <= 1e-9 * max(1.0, expected)


@SETTINGS
@given(st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**16), st.sampled_from([1e-3, 1.0, 1e3]))
def test_relative_error_is_the_numpy_norm_ratio(n, f, seed, scale):
    g = torch.Generator().manual_seed(seed)
    reference = torch.randn(n, f, generator=g, dtype=torch.float64) * scale
    actual = reference + torch.randn(n, f, generator=g, dtype=torch.float64) * scale * 0.1
    expected = np.linalg.norm((actual - reference).numpy()) / np.linalg.norm(reference.numpy())
    assert math.isclose(metrics.relative_error(actual, reference), float(expected), rel_tol=1e-12)


@SETTINGS
@given(
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(0, 2**16),
    st.integers(-6, 6),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_cosine_similarity_is_the_numpy_row_cosine(n, f, seed, exponent, dtype):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(n, f, generator=g, dtype=torch.float64) * 10.0**exponent).to(dtype)
    b = (torch.randn(n, f, generator=g, dtype=torch.float64) * 10.0**exponent).to(dtype)
    an, bn = a.double().numpy(), b.double().numpy()
    expected = (an * bn).sum(1) / (np.linalg.norm(an, axis=1) * np.linalg.norm(bn, axis=1))
    got = metrics.cosine_similarity(a, b)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert_close(got, torch.tensor(expected, dtype=dtype))


def test_cosine_similarity_of_tiny_parallel_rows_is_one():
    """Known answer: parallel rows have cosine 1 at any scale (torch alone clamps norms at 1e-8)."""
    a = torch.full((1, 2), 1e-30)
    assert_close(metrics.cosine_similarity(a, 2 * a), torch.ones(1))


@SETTINGS
@given(st.integers(3, 8), st.integers(2, 5), st.integers(0, 2**16), st.floats(0.0, 2.0))
def test_retrieval_fidelity_is_scipys_spearman_and_a_python_top1(n, f, seed, noise):
    """Gaussian embeddings (no tied similarities): Spearman of the upper triangles, nearest-neighbour agreement."""
    from scipy.stats import spearmanr

    g = torch.Generator().manual_seed(seed)
    reference = torch.randn(n, f, generator=g, dtype=torch.float64)
    embeddings = reference + noise * torch.randn(n, f, generator=g, dtype=torch.float64)

    def cos(x):
        x = x.numpy() / np.linalg.norm(x.numpy(), axis=1, keepdims=True)
        return x @ x.T

    s_ref, s = cos(reference), cos(embeddings)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    rho = spearmanr([s_ref[i, j] for i, j in pairs], [s[i, j] for i, j in pairs]).statistic
    nearest = lambda sims, i: max((j for j in range(n) if j != i), key=lambda j: sims[i, j])  # noqa: E731
    top1 = sum(nearest(s_ref, i) == nearest(s, i) for i in range(n)) / n
    got_rho, got_top1 = metrics.retrieval_fidelity(reference, embeddings)
    assert math.isclose(got_rho, rho, abs_tol=1e-12) and math.isclose(got_top1, top1)


@SETTINGS
@given(st.integers(0, 10**12), st.integers(0, 4096))
def test_attention_flops_is_four_e_d(edges, dim):
    assert metrics.attention_flops(edges, dim) == 4 * edges * dim


@SETTINGS
@given(st.one_of(not_an_int, st.integers(max_value=-1)), st.sampled_from(["head_edges", "head_dim"]))
def test_attention_flops_refuses_non_counts_naming_them(bad, name):
    args = dict(head_edges=10, head_dim=4) | {name: bad}
    raises_naming((TypeError, ValueError), name, lambda: metrics.attention_flops(**args))


def _metric_calls(bad_float, bad_mask, bad_any):
    """(argument name, call) pairs, each with one bad argument and the others valid."""
    w, k = torch.full((2, 3), 1 / 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.bool)
    e = torch.randn(4, 3, dtype=torch.float64)
    return [
        ("weights", lambda: metrics.attention_mass(bad_float, k)),
        ("keep", lambda: metrics.attention_mass(w, bad_mask)),
        ("scores", lambda: metrics.kl_sparse_dense(bad_float, k)),
        ("keep", lambda: metrics.kl_sparse_dense(w, bad_mask)),
        ("valid", lambda: metrics.kl_sparse_dense(w, k, bad_mask)),
        ("actual", lambda: metrics.relative_error(bad_any, w)),
        ("reference", lambda: metrics.relative_error(w, bad_any)),
        ("a", lambda: metrics.cosine_similarity(bad_float, w)),
        ("b", lambda: metrics.cosine_similarity(w, bad_float)),
        ("reference", lambda: metrics.retrieval_fidelity(bad_float, e)),
        ("embeddings", lambda: metrics.retrieval_fidelity(e, bad_float)),
    ]


@st.composite
def bad_metric_inputs(draw):
    """A non-tensor, a tensor of the wrong dtype, or a float tensor holding NaN/inf (shape (2, 3) or (4, 3))."""
    kind = draw(st.sampled_from(["type", "dtype", "value"]))
    if kind == "type":
        bad = draw(not_a_tensor)
        return bad, bad, bad
    if kind == "dtype":
        return (
            torch.ones(2, 3, dtype=draw(st.sampled_from([torch.int64, torch.bool]))),
            torch.ones(2, 3, dtype=draw(st.sampled_from([torch.float32, torch.int64, torch.uint8]))),
            torch.ones(2, 3, dtype=draw(st.sampled_from([torch.bool, torch.complex64]))),
        )
    t = torch.full((2, 3), 1 / 3, dtype=torch.float64)
    t[draw(st.integers(0, 1)), draw(st.integers(0, 2))] = draw(not_finite)
    return t, None, t


@SETTINGS
@given(bad_metric_inputs(), st.data())
def test_metrics_refuse_bad_tensors_naming_the_argument(bad, data):
    bad_float, bad_mask, bad_any = bad
    calls = [
        (n, c)
        for n, c in _metric_calls(bad_float, bad_mask, bad_any)
        if bad_mask is not None or n not in ("keep", "valid")
    ]
    name, call = data.draw(st.sampled_from(calls))
    raises_naming((TypeError, ValueError), name, call)
    if isinstance(bad_float, torch.Tensor) and bad_float.is_floating_point():  # NaN/inf is a bad value
        with pytest.raises(ValueError, match="finite"):
            metrics.relative_error(bad_float, torch.ones(2, 3, dtype=torch.float64))


@SETTINGS
@given(st.floats(-1e3, -1e-6))
def test_attention_mass_refuses_negative_weights(low):
    w = torch.full((2, 3), 0.5, dtype=torch.float64)
    w[1, 2] = low
    raises_naming(ValueError, "weights", lambda: metrics.attention_mass(w, w > 0))


# --------------------------------------------------------------------------------- viz.attention_graph
@st.composite
def drawn_graphs(draw):
    """``(edge_index (2, E), alpha (E,) or (E, H), S, L)`` with non-negative weights."""
    S, L = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    E = draw(st.integers(0, 12))
    src = draw(st.lists(st.integers(0, S - 1), min_size=E, max_size=E))
    dst = draw(st.lists(st.integers(0, L - 1), min_size=E, max_size=E))
    H = draw(st.sampled_from([None, 1, 3]))
    shape = (E,) if H is None else (E, H)
    alpha = np.asarray(
        draw(st.lists(st.floats(0.0, 1.0), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    ).reshape(shape)
    return torch.tensor([src, dst], dtype=torch.long).reshape(2, E), torch.tensor(alpha), S, L


@SETTINGS
@given(drawn_graphs(), st.floats(0.5, 10.0), st.data())
def test_attention_graph_draws_each_edge_key_to_query_with_width_proportional_to_alpha(graph, max_width, data):
    edge_index, alpha, S, L = graph
    head = None if alpha.dim() == 1 else data.draw(st.one_of(st.none(), st.integers(0, alpha.size(1) - 1)))
    a = alpha.numpy() if alpha.dim() == 1 else (alpha.numpy().mean(1) if head is None else alpha.numpy()[:, head])
    ax = Figure().add_subplot()
    lines = viz.attention_graph(edge_index, alpha, ax=ax, head=head, num_nodes=(S, L), max_width=max_width)
    top = a.max() if a.size and a.max() > 0 else 1.0
    expected = [((0.0, -float(j)), (1.0, -float(i))) for j, i in edge_index.T.tolist()]  # key j -> query i
    if not expected:
        return
    segments = [tuple(map(tuple, seg)) for seg in lines.get_segments()]
    assert segments == expected
    np.testing.assert_allclose(
        np.broadcast_to(lines.get_linewidths(), (len(a),)), max_width * a / top, rtol=1e-12, atol=1e-12
    )


@st.composite
def bad_graph_calls(draw):
    """(expected error, argument name, kwargs) for attention_graph with one bad argument."""
    S = L = draw(st.integers(1, 5))
    edge_index = torch.tensor([[0, S - 1], [L - 1, 0]])
    alpha = torch.full((2, 3), 0.5)
    kind = draw(
        st.sampled_from(
            [
                "source",
                "target",
                "negative",
                "float_edges",
                "str_edges",
                "alpha",
                "head",
                "head_type",
                "num_nodes",
                "num_nodes_type",
                "max_width",
                "min_weight",
            ]
        )
    )
    base = dict(edge_index=edge_index, alpha=alpha, num_nodes=(S, L))
    excess = draw(st.integers(0, 10**6))
    if kind == "source":
        edge_index = torch.tensor([[0, S + excess], [0, 0]])
        return IndexError, "edge_index[0]", base | dict(edge_index=edge_index)
    if kind == "target":
        return (
            IndexError,
            "edge_index[1]",
            base | dict(edge_index=torch.tensor([[0, 0], [0, L + excess]]), num_nodes=None, tokens=["t"] * L),
        )
    if kind == "negative":
        return IndexError, "edge_index", base | dict(edge_index=torch.tensor([[0, -1 - excess], [0, 0]]))
    if kind == "float_edges":
        return TypeError, "edge_index", base | dict(edge_index=edge_index.double())
    if kind == "str_edges":
        return TypeError, "edge_index", base | dict(edge_index=draw(st.sampled_from(["ab", [["a"], ["b"]]])))
    if kind == "alpha":
        bad = alpha.clone()
        bad[draw(st.integers(0, 1)), draw(st.integers(0, 2))] = draw(st.sampled_from([math.nan, math.inf, -0.5]))
        return ValueError, "alpha", base | dict(alpha=bad)
    if kind == "head":
        return IndexError, "head", base | dict(head=draw(st.one_of(st.integers(3, 100), st.integers(-100, -1))))
    if kind == "head_type":
        return TypeError, "head", base | dict(head=draw(st.sampled_from(["0", 1.0, [0]])))
    if kind == "num_nodes":
        return ValueError, "num_nodes", base | dict(num_nodes=draw(st.sampled_from([-1, 10**12, (3, -2)])))
    if kind == "num_nodes_type":
        return TypeError, "num_nodes", base | dict(num_nodes=draw(st.sampled_from(["3", (1, 2, 3), 2.0])))
    if kind == "max_width":
        return (
            (TypeError, ValueError),
            "max_width",
            base | dict(max_width=draw(st.sampled_from(["3", 0.0, -1.0, math.nan, math.inf]))),
        )
    return (TypeError, ValueError), "min_weight", base | dict(min_weight=draw(st.sampled_from(["0", math.nan])))


@SETTINGS
@given(bad_graph_calls())
def test_attention_graph_refuses_bad_arguments_naming_them(case):
    """Out-of-range edges used to end in networkx's ``KeyError: ('key', 5)``, a huge num_nodes in a hang."""
    error, name, kwargs = case
    raises_naming(error, name, lambda: viz.attention_graph(ax=Figure().add_subplot(), **kwargs))


# ------------------------------------------------------------------ graphattn.attention, AttentionConv
@st.composite
def attention_inputs(draw):
    L, S, H, D = draw(st.integers(1, 5)), draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    E = draw(st.integers(0, 15))
    src = draw(st.lists(st.integers(0, S - 1), min_size=E, max_size=E))
    dst = draw(st.lists(st.integers(0, L - 1), min_size=E, max_size=E))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    scale = draw(st.sampled_from([1.0, 10.0]))
    q, k, v = (torch.randn(n, H, D, generator=g, dtype=torch.float64) * s for n, s in ((L, scale), (S, scale), (S, 1)))
    bias = draw(st.sampled_from([None, "per_edge", "per_head"]))
    bias = (
        None if bias is None else torch.randn((E,) if bias == "per_edge" else (E, H), generator=g, dtype=torch.float64)
    )
    return q, k, v, torch.tensor([src, dst], dtype=torch.long).reshape(2, E), bias


@SETTINGS
@given(attention_inputs())
def test_attention_is_the_float64_per_edge_loop(inputs):
    """y_i = sum over the edges (j, i) of softmax_j(q_i . k_j / sqrt(D) + b_ij) v_j; 0 for a query without edges."""
    q, k, v, edge_index, bias = inputs
    (L, H, D), E = q.shape, edge_index.size(1)
    out, alpha = ga.attention(q, k, v, edge_index, edge_bias=bias, need_weights=True)
    expected = torch.zeros(L, H, D, dtype=torch.float64)
    expected_alpha = torch.zeros(E, H, dtype=torch.float64)
    for h in range(H):
        for i in range(L):
            edges = [e for e in range(E) if edge_index[1, e] == i]
            if not edges:
                continue
            scores = [
                float(q[i, h] @ k[edge_index[0, e], h]) / math.sqrt(D)
                + (0.0 if bias is None else float(bias[e] if bias.dim() == 1 else bias[e, h]))
                for e in edges
            ]
            for e, w in zip(edges, _softmax_row(scores)):
                expected_alpha[e, h] = w
                expected[i, h] += w * v[edge_index[0, e], h]
    assert torch.isfinite(out).all()
    assert_close(out, expected)
    assert_close(alpha, expected_alpha)


@st.composite
def bad_attention_calls(draw):
    """(error, argument name, kwargs) for graphattn.attention with one bad argument."""
    L = 4
    q = k = v = torch.randn(L, 2, 3)
    edge_index = ga.patterns.full().edge_index(L)
    base = dict(query=q, key=k, value=v, edge_index=edge_index)
    kind = draw(
        st.sampled_from(
            [
                "query",
                "key_dtype",
                "edge_range",
                "edge_negative",
                "edge_dtype",
                "scale",
                "dropout",
                "edge_bias",
                "need_weights",
                "impl",
            ]
        )
    )
    if kind == "query":
        return (TypeError, ValueError), "query", base | dict(query=draw(st.sampled_from([q.long(), q[0], [1.0], None])))
    if kind == "key_dtype":
        return TypeError, "key", base | dict(key=k.double())
    if kind == "edge_range":
        row = draw(st.integers(0, 1))
        bad = edge_index.clone()
        bad[row, draw(st.integers(0, bad.size(1) - 1))] = L + draw(st.integers(0, 10**9))
        return IndexError, f"edge_index[{row}]", base | dict(edge_index=bad)
    if kind == "edge_negative":
        bad = edge_index.clone()
        bad[draw(st.integers(0, 1)), 0] = -draw(st.integers(1, 10**9))
        return IndexError, "edge_index", base | dict(edge_index=bad)
    if kind == "edge_dtype":
        return (
            TypeError,
            "edge_index",
            base | dict(edge_index=draw(st.sampled_from([edge_index.float(), edge_index.tolist()]))),
        )
    if kind == "scale":
        return (TypeError, ValueError), "scale", base | dict(scale=draw(st.sampled_from(["1", math.nan, math.inf])))
    if kind == "dropout":
        return (
            (TypeError, ValueError),
            "dropout",
            base | dict(dropout=draw(st.sampled_from(["0.1", -0.1, 1.0, math.nan]))),
        )
    if kind == "edge_bias":
        E = edge_index.size(1)
        return (
            (TypeError, ValueError),
            "edge_bias",
            base
            | dict(
                edge_bias=draw(
                    st.sampled_from(
                        [torch.zeros(E, dtype=torch.float64), torch.zeros(E + 1), torch.full((E,), math.nan), [0.0] * E]
                    )
                )
            ),
        )
    if kind == "need_weights":
        return TypeError, "need_weights", base | dict(need_weights=draw(st.sampled_from([1, None, "yes"])))
    return ValueError, "impl", base | dict(impl=draw(st.sampled_from(["fast", None, 3])))


@SETTINGS
@given(bad_attention_calls())
def test_attention_refuses_bad_arguments_naming_them(case):
    error, name, kwargs = case
    args = [kwargs.pop(n) for n in ("query", "key", "value", "edge_index")]
    raises_naming(error, name, lambda: ga.attention(*args, **kwargs))


@st.composite
def bad_conv_arguments(draw):
    """(error, argument name, kwargs) for AttentionConv with one bad constructor argument."""
    name = draw(
        st.sampled_from(["in_channels", "out_channels", "heads", "dropout", "bias", "output_projection", "impl"])
    )
    if name in ("in_channels", "out_channels", "heads"):
        bad = draw(
            st.one_of(
                not_an_int.map(lambda v: (TypeError, v)),
                st.integers(-10, 0).map(lambda v: (ValueError, v)),
                st.just((ValueError, 2**50)),
            )
        )
        if name == "heads" and bad[1] == 2**50:
            bad = (ValueError, 3)  # does not divide out_channels = 8
    elif name == "dropout":
        bad = draw(
            st.one_of(
                st.text(max_size=3).map(lambda v: (TypeError, v)),
                st.sampled_from([-0.1, 1.0, 2.0, math.nan, math.inf]).map(lambda v: (ValueError, v)),
            )
        )
    elif name == "impl":
        bad = (ValueError, draw(st.sampled_from(["fast", None, 1, ["auto"]])))
    else:
        bad = (TypeError, draw(st.sampled_from([None, 0, 1, "yes", 1.0])))
    return bad[0], name, {name: bad[1]}


@SETTINGS
@given(bad_conv_arguments())
def test_attention_conv_refuses_bad_constructor_arguments_naming_them(case):
    error, name, kwargs = case
    args = dict(in_channels=4, out_channels=8, heads=2) | kwargs
    if isinstance(args["in_channels"], list):
        error = (TypeError, ValueError)  # [1] is a one-element list: neither an int nor a pair nor a triple
    raises_naming(error, name, lambda: ga.AttentionConv(**args))


@SETTINGS
@given(attention_inputs(), st.sampled_from(["auto", "message_passing"]))
def test_attention_conv_without_projections_is_the_functional_core(inputs, impl):
    """With identity projections and no output projection the layer is graphattn.attention on its features."""
    q, k, v, edge_index, bias = inputs
    (L, H, D), S = q.shape, k.size(0)
    if bias is None:
        bias = torch.zeros(edge_index.size(1), dtype=torch.float64)
    conv = ga.AttentionConv(H * D, H * D, heads=H, bias=False, output_projection=False, impl=impl).double()
    with torch.no_grad():
        for lin in (conv.lin_query, conv.lin_key, conv.lin_value):
            lin.weight.copy_(torch.eye(H * D, dtype=torch.float64))
    x_k, x_v, x_q = k.reshape(S, H * D), v.reshape(S, H * D), q.reshape(L, H * D)
    out = conv((x_k, x_v, x_q), edge_index, edge_bias=bias)
    expected, _ = ga.attention(q, k, v, edge_index, edge_bias=bias)
    assert_close(out, expected.reshape(L, H * D))


# ------------------------------------------------------- viz entry checks
def test_attention_heatmap_refuses_an_unknown_cmap_naming_it():
    raises_naming(
        ValueError, "cmap", lambda: viz.attention_heatmap(torch.ones(2, 2), cmap="nope", ax=Figure().add_subplot())
    )


def test_head_grid_refuses_a_non_int_query_naming_it():
    raises_naming(TypeError, "query", lambda: viz.head_grid(torch.ones(1, 2, 3, 3), query="1", fig=Figure()))


def test_head_grid_refuses_zero_layers_naming_weights():
    raises_naming(ValueError, "weights", lambda: viz.head_grid(torch.ones(0, 2, 3, 3), fig=Figure()))
