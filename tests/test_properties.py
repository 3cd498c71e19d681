"""Property tests of graphs, patterns, analysis and dense, each against an independent reference.

For random valid inputs the result equals a reference written here without the
code under test (a Python loop over pairs, the papers' rules, networkx, numpy,
``F.scaled_dot_product_attention``), and finite input never gives NaN. For
random invalid inputs (wrong types, negative or huge sizes, NaN) the call raises
the documented exception type with validate's template naming the argument,
``Expected '<name>' ...``: never an error from inside torch or networkx.

Hypothesis runs derandomised (the same examples on every run, no database).
"""

import math

import networkx as nx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphattn import analysis, dense, graphs
from graphattn import patterns as P

SETTINGS = settings(
    max_examples=50, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
HUGE = 2**62 + 1  # above validate.MAX_INDEX: every size and count refuses it

sizes = st.integers(0, 9)
positive = st.integers(1, 9)
not_an_int = st.one_of(st.floats(allow_nan=True), st.booleans(), st.text(max_size=2), st.just([1]))
bad_count = st.one_of(st.integers(max_value=-1), st.integers(min_value=HUGE, max_value=10**30))


def raises_naming(error, name, call):
    """``call()`` raises ``error`` (a type or tuple) with validate's template naming ``name``."""
    with pytest.raises(error) as info:
        call()
    assert f"Expected '{name}" in str(info.value), str(info.value)


def pairs(L, S, rule):
    """The reference: every (j, i) with rule(i, j), sorted by target i, then source j (a Python loop)."""
    return [(j, i) for i in range(L) for j in range(S) if rule(i, j)]


def as_pairs(edge_index):
    return list(zip(edge_index[0].tolist(), edge_index[1].tolist()))


# ---------------------------------------------------------------------------------------- graphs
@st.composite
def bool_masks(draw, max_side=7):
    L, S = draw(st.integers(0, max_side)), draw(st.integers(0, max_side))
    bits = draw(st.lists(st.booleans(), min_size=L * S, max_size=L * S))
    return torch.tensor(bits, dtype=torch.bool).reshape(L, S)


@st.composite
def edge_lists(draw, max_nodes=6, max_edges=20):
    """(edge_index (2, E) possibly with duplicates, S, L)."""
    S, L = draw(st.integers(1, max_nodes)), draw(st.integers(1, max_nodes))
    edges = draw(st.lists(st.tuples(st.integers(0, S - 1), st.integers(0, L - 1)), max_size=max_edges))
    return torch.tensor(edges, dtype=torch.long).reshape(-1, 2).T.contiguous(), S, L


@SETTINGS
@given(bool_masks())
def test_mask_to_edge_index_is_the_python_loop_over_pairs(mask):
    L, S = mask.shape
    edge_index = graphs.mask_to_edge_index(mask)
    assert as_pairs(edge_index) == pairs(L, S, lambda i, j: bool(mask[i, j]))
    assert torch.equal(graphs.edge_index_to_mask(edge_index, (S, L)), mask)


@SETTINGS
@given(edge_lists(), st.integers(1, 3))
def test_edge_weights_to_dense_sums_like_a_python_loop(edges, heads):
    edge_index, S, L = edges
    alpha = torch.rand(edge_index.size(1), heads, dtype=torch.float64)
    expected = torch.zeros(heads, L, S, dtype=torch.float64)
    for e, (j, i) in enumerate(as_pairs(edge_index)):
        expected[:, i, j] += alpha[e]  # duplicates summed
    got = graphs.edge_weights_to_dense(edge_index, alpha, (S, L))
    assert_close(got, expected)
    unique = graphs.mask_to_edge_index(expected.sum(0) > 0)  # (2, E') one edge per pair
    back = graphs.dense_to_edge_weights(got, unique)  # (E', H)
    reference = [expected[:, i, j].tolist() for j, i in as_pairs(unique)]
    assert_close(back, torch.tensor(reference, dtype=torch.float64).reshape(-1, heads))


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)), max_size=12),
    st.sampled_from([torch.int32, torch.int64]),
)
def test_sort_edge_index_is_pythons_stable_sort_even_where_i_times_s_wraps_int32(edges, dtype):
    """Key (target, source), stable; S = 2**31 makes i * S + j overflow int32 (and int64 for big i)."""
    edge_index = torch.tensor(edges, dtype=dtype).reshape(-1, 2).T
    got, perm = graphs.sort_edge_index(edge_index, 2**31)
    expected = sorted(range(len(edges)), key=lambda e: (edges[e][1], edges[e][0], e))
    assert perm.tolist() == expected and got.dtype == dtype
    assert as_pairs(got) == [edges[e] for e in expected]


@SETTINGS
@given(st.lists(sizes, max_size=5), st.sampled_from([P.full(), P.causal(), P.window(1, 0), P.strided(2)]))
def test_batch_sequences_is_the_block_diagonal_of_the_pattern(lengths, pattern):
    edge_index, batch = graphs.batch_sequences(lengths, pattern)
    n = sum(lengths)
    blocks = [pattern.mask(m) for m in lengths if m]
    expected = torch.block_diag(*blocks) if blocks else torch.zeros(0, 0, dtype=torch.bool)
    assert torch.equal(graphs.edge_index_to_mask(edge_index, n), expected.bool())
    assert batch.tolist() == [b for b, m in enumerate(lengths) for _ in range(m)]


@SETTINGS
@given(st.lists(st.integers(0, 4), max_size=10), st.integers(0, 3), st.randoms(use_true_random=False))
def test_nodes_to_padded_places_each_node_like_a_python_loop(batch_ids, extra, rng):
    """An unsorted batch, and ``batch_size`` beyond the last id (trailing empty sequences kept)."""
    rng.shuffle(batch_ids)
    num_b = (max(batch_ids) + 1 if batch_ids else 0) + extra
    x = torch.arange(1.0, len(batch_ids) + 1).unsqueeze(1)  # (N, 1) node n holds n + 1
    padded, valid = graphs.nodes_to_padded(x, torch.tensor(batch_ids, dtype=torch.long), batch_size=num_b)
    rows = [[float(n + 1) for n, b in enumerate(batch_ids) if b == r] for r in range(num_b)]
    width = max((len(r) for r in rows), default=0)
    assert padded.shape == (num_b, width, 1)
    assert padded[..., 0].tolist() == [r + [0.0] * (width - len(r)) for r in rows]
    assert valid.tolist() == [[t < len(r) for t in range(width)] for r in rows]


@SETTINGS
@given(st.one_of(bad_count, not_an_int, st.tuples(st.integers(-5, -1), positive)))
def test_graphs_refuse_bad_sizes_naming_size(size):
    raises_naming(
        (TypeError, ValueError), "size", lambda: graphs.edge_index_to_mask(torch.zeros(2, 0, dtype=torch.long), size)
    )


@SETTINGS
@given(
    st.one_of(
        st.just([[0, 1], [1, 0]]),
        st.just(torch.zeros(2, 2)),
        st.just(torch.zeros(3, 2, dtype=torch.long)),
        st.just(torch.tensor([[0, -1], [0, 0]])),
        st.just(torch.tensor([[0, 7], [0, 0]])),
    )
)
def test_graphs_refuse_bad_edge_lists_naming_edge_index(edge_index):
    raises_naming(
        (TypeError, ValueError, IndexError),
        "edge_index",
        lambda: graphs.edge_weights_to_dense(edge_index, torch.ones(2), 3),
    )


# ---------------------------------------------------------------------------------------- patterns
def strided_rule(ell):
    """Child et al. 2019, Sec. 4.2: A1 = {max(0, i - l), ..., i}, A2 = {j <= i : (i - j) mod l = 0}."""
    return lambda i, j: j <= i and (i - j <= ell or (i - j) % ell == 0)


def fixed_rule(ell, c):
    """Child et al. 2019, Sec. 4.2: j <= i, same block, or j mod l in {l - c, ..., l - 1}."""
    return lambda i, j: j <= i and (j // ell == i // ell or j % ell >= ell - c)


def window_rule(left, right, d):
    return lambda i, j: (
        (j - i) % d == 0 and (left is None or j - i >= -left * d) and (right is None or j - i <= right * d)
    )


@st.composite
def patterns_with_rules(draw, depth=1):
    """A pattern and its reference rule, written from the definitions (not from the code)."""
    kind = draw(
        st.sampled_from(
            ["full", "causal", "window", "strided", "fixed", "global", "compose"]
            if depth
            else ["window", "strided", "global"]
        )
    )
    if kind == "full":
        return P.full(), lambda i, j: True
    if kind == "causal":
        return P.causal(), lambda i, j: j <= i
    if kind == "window":
        left, right = (draw(st.one_of(st.none(), st.integers(0, 4), st.just(HUGE - 1))) for _ in range(2))
        d = draw(st.integers(1, 3))
        return P.window(left, right, d), window_rule(left, right, d)
    if kind == "strided":
        ell = draw(positive)
        return P.strided(ell), strided_rule(ell)
    if kind == "fixed":
        ell = draw(positive)
        c = draw(st.integers(0, ell))
        return P.fixed(ell, c), fixed_rule(ell, c)
    if kind == "global":
        g = set(draw(st.lists(st.integers(0, 12), max_size=3)))
        return P.global_tokens(sorted(g)), lambda i, j: i in g or j in g
    (a, ra), (b, rb) = draw(patterns_with_rules(0)), draw(patterns_with_rules(0))
    if draw(st.booleans()):
        return a | b, lambda i, j: ra(i, j) or rb(i, j)
    return a & b, lambda i, j: ra(i, j) and rb(i, j)


@SETTINGS
@given(patterns_with_rules(), sizes, sizes)
def test_pattern_views_equal_the_rule_from_the_definition(pattern_rule, L, S):
    pattern, rule = pattern_rule
    assert as_pairs(pattern.edge_index(L, S)) == pairs(L, S, rule)  # sorted, unique, exactly the rule
    expected = torch.tensor([[bool(rule(i, j)) for j in range(S)] for i in range(L)], dtype=torch.bool)
    assert torch.equal(pattern.mask(L, S), expected.reshape(L, S))


@SETTINGS
@given(st.integers(0, 12), sizes, sizes, st.integers(0, 2**64 - 1))
def test_random_draws_min_k_s_distinct_keys_reproducibly(k, L, S, seed):
    """Known answer: each query has exactly min(k, S) distinct keys in [0, S); same seed, same draw."""
    edge_index = P.random(k, seed=seed).edge_index(L, S)
    rows = {}
    for j, i in as_pairs(edge_index):
        rows.setdefault(i, []).append(j)
    for i in range(L):
        keys = rows.get(i, [])
        assert len(set(keys)) == len(keys) == min(k, S) and all(0 <= j < S for j in keys)
    assert torch.equal(edge_index, P.random(k, seed=seed).edge_index(L, S))
    assert torch.equal(P.random(k, seed=seed).mask(L, S), graphs.edge_index_to_mask(edge_index, (S, L)))


@st.composite
def scores_and_budget(draw):
    lead, L, S = draw(st.lists(st.integers(1, 2), max_size=2)), draw(sizes), draw(sizes)
    shape = (*lead, L, S)
    values = draw(st.lists(st.integers(-2, 2), min_size=math.prod(shape), max_size=math.prod(shape)))
    scores = torch.tensor(values, dtype=torch.float64).reshape(shape)  # many ties
    scores[scores == -2] = float("-inf")
    if draw(st.booleans()):
        return scores, draw(st.integers(0, 11))
    budget = draw(st.lists(st.integers(0, 11), min_size=L, max_size=L))
    return scores, torch.tensor(budget, dtype=torch.long).reshape(L)


@SETTINGS
@given(scores_and_budget())
def test_topk_mask_is_a_stable_descending_sort_per_row(scores_k):
    """Reference: Python's sorted by (-score, j) per row; the first k keys; ties to the lower j."""
    scores, k = scores_k
    got = P.topk_mask(scores, k)
    S = scores.shape[-1]
    flat = scores.reshape(math.prod(scores.shape[:-2]), scores.shape[-2], S)
    for b in range(flat.shape[0]):
        for i in range(flat.shape[1]):
            budget = k if isinstance(k, int) else int(k[i])
            ranked = sorted(range(S), key=lambda j: (-flat[b, i, j].item(), j))[:budget]
            assert got.reshape(flat.shape)[b, i].tolist() == [j in ranked for j in range(S)]


@SETTINGS
@given(sizes, sizes, st.floats(-1, 2))
def test_threshold_keeps_the_pairs_at_or_above_tau(L, S, tau):
    scores = torch.rand(L, S, dtype=torch.float64) * 2 - 0.5
    expected = pairs(L, S, lambda i, j: scores[i, j].item() >= tau)
    assert as_pairs(P.threshold(scores, tau).edge_index()) == expected


@settings(SETTINGS, max_examples=30)
@given(patterns_with_rules(), st.integers(0, 9), st.integers(1, 4))
def test_stats_equal_networkx_on_the_rules_graph(pattern_rule, L, p):
    pattern, rule = pattern_rule
    graph = nx.DiGraph(pairs(L, L, rule))
    graph.add_nodes_from(range(L))
    hops = dict(nx.all_pairs_shortest_path_length(graph))
    causal = all(j <= i for j, i in graph.edges)
    parent = [(j, i) for i in range(L) for j in range(L) if j <= i or not causal]
    got = P.stats(pattern, L, p=p)
    assert got["edges"] == graph.number_of_edges() and got["causal"] == causal
    assert got["edges_per_query_max"] == max((graph.in_degree(i) for i in range(L)), default=0)
    assert got["reachable_within_p"] == all(hops[j].get(i, p + 1) <= p for j, i in parent)
    reached = all(i in hops[j] for j, i in parent)
    assert got["diameter"] == (max((hops[j][i] for j, i in parent), default=0) if reached else None)


BUILDERS = [  # (call with one bad argument, the argument's name)
    (lambda v: P.window(v, 1), "left"),
    (lambda v: P.window(1, v), "right"),
    (lambda v: P.window(1, 1, v), "dilation"),
    (lambda v: P.strided(v), "stride"),
    (lambda v: P.fixed(v, 0), "block"),
    (lambda v: P.random(v), "k"),
    (lambda v: P.bigbird(v), "block"),
    (lambda v: P.bigbird(2, random_blocks=v), "random_blocks"),
    (lambda v: P.global_tokens([v]), "indices"),
    (lambda v: P.longformer_window(v), "w"),
    (lambda v: P.full().edge_index(v), "L"),
    (lambda v: P.causal().mask(3, v), "S"),
    (lambda v: P.stats(P.full(), v), "L"),
    (lambda v: P.stats(P.full(), 3, p=v), "p"),
    (lambda v: P.topk(torch.zeros(2, 2), v), "k"),
    (lambda v: P.topk_mask(torch.zeros(2, 2), v), "k"),
]


@SETTINGS
@given(st.sampled_from(BUILDERS), st.one_of(bad_count, not_an_int))
def test_pattern_arguments_refuse_bad_ints_naming_them(builder, value):
    call, name = builder
    raises_naming((TypeError, ValueError), name, lambda: call(value))


@SETTINGS
@given(
    st.one_of(
        st.just(float("nan")),
        st.just(float("inf")),
        st.integers(2**64, 10**30),
        st.integers(max_value=-(2**63) - 1),
        not_an_int.filter(lambda v: not isinstance(v, float)),
    )
)
def test_seeds_outside_torchs_range_are_refused_naming_seed(seed):
    raises_naming((TypeError, ValueError), "seed", lambda: P.random(2, seed=seed))


@SETTINGS
@given(st.sampled_from([P.full(), P.window(2, 2), P.random(3)]), st.integers(2**16, 2**24))
def test_sizes_too_large_to_build_are_refused_before_allocating(pattern, L):
    """The dense mask of L >= 2**16 queries has L * L > 2**31 entries: refused, naming L * S."""
    raises_naming(ValueError, "L * S", lambda: pattern.mask(L))
    if pattern.name == "full":
        raises_naming(ValueError, "L and S", lambda: pattern.edge_index(L))


# ---------------------------------------------------------------------------------------- analysis
@st.composite
def weighted_layers(draw, max_nodes=5):
    """(edge_index (2, E), list of (E, H) float64 weights in [0, 1], N)."""
    n = draw(st.integers(1, max_nodes))
    mask = draw(st.lists(st.booleans(), min_size=n * n, max_size=n * n))
    edge_index = graphs.mask_to_edge_index(torch.tensor(mask, dtype=torch.bool).reshape(n, n))
    layers, heads = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    size = edge_index.size(1) * heads
    alphas = [
        torch.tensor(draw(st.lists(st.floats(0, 1), min_size=size, max_size=size)), dtype=torch.float64).reshape(
            -1, heads
        )
        for _ in range(layers)
    ]
    return edge_index, alphas, n


def dense_of(edge_index, weight, n):
    """Reference (N, N) matrix, rows = queries i, by a Python loop (duplicates summed)."""
    a = torch.zeros(n, n, dtype=torch.float64)
    for (j, i), w in zip(as_pairs(edge_index), weight.tolist()):
        a[i, j] += w
    return a


@SETTINGS
@given(weighted_layers(), st.booleans())
def test_rollout_is_the_product_of_row_normalised_dense_matrices(layers, residual):
    """Abnar and Zuidema 2020, eq. (1): R = A_n ... A_1, A_l = rownorm((A_l + I) / 2) with the residual."""
    edge_index, alphas, n = layers
    expected = torch.eye(n, dtype=torch.float64)
    for alpha in alphas:
        a = dense_of(edge_index, alpha.mean(1), n)
        if residual:
            a = 0.5 * a + 0.5 * torch.eye(n, dtype=torch.float64)
            a = a / a.sum(1, keepdim=True)
        expected = a @ expected
    got = analysis.attention_rollout(edge_index, alphas, num_nodes=n, residual=residual).to_dense()
    assert torch.isfinite(got).all()
    assert_close(got, expected)


@SETTINGS
@given(weighted_layers())
def test_self_share_and_distance_are_the_python_sums(layers):
    edge_index, alphas, n = layers
    src, dst = edge_index.tolist()
    queries = max(len(set(dst)), 1)
    share, dist = analysis.self_share(edge_index, alphas), analysis.mean_attention_distance(edge_index, alphas)
    for layer, alpha in enumerate(alphas):
        for h in range(alpha.size(1)):
            w = alpha[:, h].tolist()
            total = sum(w)
            diag = sum(x for x, j, i in zip(w, src, dst) if i == j)
            assert share[layer, h].item() == pytest.approx(diag / total if total else 0.0, abs=1e-12)
            far = sum(x * abs(i - j) for x, j, i in zip(w, src, dst))
            assert dist[layer, h].item() == pytest.approx(far / queries, abs=1e-12)


@SETTINGS
@given(weighted_layers(), st.floats(0.05, 0.95))
def test_pagerank_solves_the_damped_random_walk(layers, damping):
    """Page et al. 1999 as a linear system: x = d P^T x + (1 - d) / N, P = rownorm(A), empty rows uniform."""
    edge_index, alphas, n = layers
    a = dense_of(edge_index, alphas[0].mean(1), n).numpy()
    rows = a.sum(1, keepdims=True)
    walk = np.where(rows > 0, a / np.where(rows > 0, rows, 1), 1.0 / n)
    expected = np.linalg.solve(np.eye(n) - damping * walk.T, np.full(n, (1 - damping) / n))
    got = analysis.attention_pagerank(analysis.to_networkx(edge_index, alphas[0], num_nodes=n), alpha=damping)
    np.testing.assert_allclose([got[k] for k in range(n)], expected, atol=1e-9)


@SETTINGS
@given(st.integers(2, 5), st.integers(1, 4), st.integers(-300, 300))
def test_cosine_similarity_is_the_mean_over_pairs_at_any_scale(n, f, exponent):
    """Reference: math.fsum over pairs i != j of cos(x_i, x_j); rows scaled by 10**exponent (float64 range)."""
    x = (torch.rand(n, f, dtype=torch.float64) + 0.1) * 10.0**exponent
    rows = [[v / 10.0**exponent for v in r] for r in x.tolist()]  # the same directions at unit scale
    cos = [
        sum(a * b for a, b in zip(rows[i], rows[j])) / math.hypot(*rows[i]) / math.hypot(*rows[j])
        for i in range(n)
        for j in range(n)
        if i != j
    ]
    assert analysis.mean_cosine_similarity(x) == pytest.approx(math.fsum(cos) / len(cos), abs=1e-12)


BAD_WEIGHTS = st.sampled_from([float("nan"), float("inf"), -float("inf"), -0.5])


@SETTINGS
@given(BAD_WEIGHTS, st.sampled_from(["rollout", "flow", "self_share", "distance", "networkx"]))
def test_analysis_refuses_nan_inf_and_negative_weights_naming_them(bad, function):
    edge_index = torch.tensor([[0, 0, 1], [0, 1, 1]])
    alpha = torch.tensor([[1.0], [bad], [0.5]])
    call, name = {
        "rollout": (lambda: analysis.attention_rollout(edge_index, [alpha]), "alphas[0]"),
        "flow": (lambda: analysis.attention_flow(edge_index, [alpha]), "alphas[0]"),
        "self_share": (lambda: analysis.self_share(edge_index, alpha), "alpha"),
        "distance": (lambda: analysis.mean_attention_distance(edge_index, alpha), "alpha"),
        "networkx": (lambda: analysis.to_networkx(edge_index, alpha), "alpha"),
    }[function]
    raises_naming(ValueError, name, call)


@SETTINGS
@given(st.sampled_from(["rollout", "self_share", "networkx"]), st.sampled_from([[[0, 0], [0, 1]], ((0, 1), (1, 1))]))
def test_analysis_refuses_list_edge_lists_naming_edge_index(function, edges):
    alpha = torch.ones(2, 1)
    call = {
        "rollout": lambda: analysis.attention_rollout(edges, [alpha]),
        "self_share": lambda: analysis.self_share(edges, alpha),
        "networkx": lambda: analysis.to_networkx(edges, alpha),
    }[function]
    raises_naming(TypeError, "edge_index", call)


@SETTINGS
@given(
    st.one_of(
        st.floats(max_value=0.0),
        st.floats(min_value=1.0),
        st.just(float("nan")),
        st.booleans(),
        st.text(max_size=2),
        st.just([0.5]),
    )
)
def test_pagerank_refuses_a_damping_outside_the_open_unit_interval(damping):
    graph = analysis.to_networkx(torch.tensor([[0], [0]]), torch.ones(1))
    raises_naming((TypeError, ValueError), "alpha", lambda: analysis.attention_pagerank(graph, alpha=damping))


@SETTINGS
@given(st.integers(1, 4), st.integers(0, 3))
def test_out_of_range_edges_raise_index_error_naming_edge_index(n, excess):
    edge_index = torch.tensor([[n + excess], [0]])
    raises_naming(IndexError, "edge_index[0]", lambda: analysis.to_networkx(edge_index, torch.ones(1), num_nodes=n))
    raises_naming(IndexError, "edge_index[0]", lambda: analysis.attention_rollout([edge_index], [torch.ones(1)], n))


# ---------------------------------------------------------------------------------------- dense
@st.composite
def attention_inputs(draw):
    L, S, heads, d = draw(positive), draw(positive), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32)))
    x, x_kv = torch.randn(L, 4, generator=g, dtype=torch.float64), torch.randn(S, 4, generator=g, dtype=torch.float64)
    w = [torch.randn(4, heads * d, generator=g, dtype=torch.float64) for _ in range(3)]
    bits = draw(st.lists(st.booleans(), min_size=L * S, max_size=L * S))
    return x, x_kv, w, torch.tensor(bits, dtype=torch.bool).reshape(L, S), heads


@SETTINGS
@given(attention_inputs())
def test_six_steps_equals_sdpa_and_empty_rows_are_zero(inputs):
    x, x_kv, w, mask, heads = inputs
    steps = dense.six_steps(x, *w, mask, heads=heads, x_kv=x_kv)
    has_key = mask.any(1)  # (L,) SDPA gives NaN on rows with no key; the oracle defines them as 0
    reference = F.scaled_dot_product_attention(
        steps.queries, steps.keys, steps.values, attn_mask=mask | ~has_key[:, None]
    )  # (H, L, D)
    reference = reference.transpose(0, 1).flatten(-2)  # (L, H * D)
    assert torch.isfinite(steps.output).all()
    assert_close(steps.output[has_key], reference[has_key])
    assert torch.equal(steps.output[~has_key], torch.zeros_like(steps.output[~has_key]))


@SETTINGS
@given(st.one_of(st.integers(max_value=0), st.integers(min_value=5, max_value=7), st.just(HUGE), not_an_int))
def test_six_steps_refuses_heads_that_do_not_divide_the_width(heads):
    x = torch.randn(3, 4)
    raises_naming((TypeError, ValueError), "heads", lambda: dense.six_steps(x, *(torch.eye(4),) * 3, heads=heads))
