"""Sparsity patterns against independent references: brute-force Python rules written from the
papers' definitions, FlexAttention's own evaluation of ``mask_mod``, known edge counts, networkx."""

import networkx as nx
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask

from graphattn import patterns as P
from graphattn.graphs import mask_to_edge_index

PATTERNS = [
    P.full(),
    P.causal(),
    P.window(2, 2),
    P.window(0, 3),
    P.window(3, 0, 2),
    P.window(None, 1),
    P.dilated(1, 2, 3),
    P.longformer_window(4),
    P.flash_window(-1, 2),
    P.strided(3),
    P.strided(1),
    P.fixed(4, 1),
    P.fixed(3, 3),
    P.fixed(4, 0),
    P.global_tokens([0, 5]),
    P.global_tokens([]),
    P.random(3, seed=1),
    P.random(10),
    P.bigbird(3, 3, 2, 1),
    P.bigbird(4, 1, 1, 2, seed=3),
    P.longformer(4, [0, 11]),
    P.window(1, 1) | P.global_tokens([3]),
    P.strided(3) & P.window(4, 0),
    (P.causal() & P.random(5)) | P.global_tokens(2),
]
SIZES = [(1, 1), (7, 7), (12, 12), (16, 16), (7, 12), (12, 7), (16, 5)]
CASES = [pytest.param(p, L, S, id=f"{p.name}-{L}x{S}") for p in PATTERNS for L, S in SIZES]


def brute(rule, L, S):
    """The reference mask: ``rule(i, j)`` evaluated by a Python loop over every pair."""
    return torch.tensor([[bool(rule(i, j)) for j in range(S)] for i in range(L)]).reshape(L, S)


# ---------------------------------------------------------------- the three views
@pytest.mark.parametrize("p, L, S", CASES)
def test_three_views_agree(p, L, S):
    """edge_index (index arithmetic), mask (the rule on a grid) and FlexAttention's ``create_mask``
    (its own vmap evaluation of mask_mod) give the same graph."""
    edge_index, mask = p.edge_index(L, S), p.mask(L, S)
    assert mask.shape == (L, S) and mask.dtype == torch.bool
    assert edge_index.dtype == torch.long and edge_index.shape[0] == 2
    assert torch.equal(edge_index, mask_to_edge_index(mask))
    # FlexAttention evaluates mask_mod on scalar indices through vmap
    flex = create_mask(p.bind(L, S).mask_mod, None, None, L, S, device="cpu")[0, 0]  # (L, S)
    assert torch.equal(flex, mask)


@pytest.mark.parametrize("p, L, S", CASES)
def test_edges_sorted_unique_in_range(p, L, S):
    """docs/design.md's contract: sorted by target then source, no duplicates, indices in range."""
    src, dst = p.edge_index(L, S)
    key = dst * S + src
    assert (key[1:] > key[:-1]).all()  # sorted by target then source, no duplicate
    assert ((src >= 0) & (src < S) & (dst >= 0) & (dst < L)).all()


@pytest.mark.parametrize("p", PATTERNS, ids=lambda p: p.name)
@pytest.mark.parametrize("L, S", [(0, 0), (0, 5), (5, 0)])
def test_empty_sizes(p, L, S):
    """Known answer: no queries or no keys, no edges."""
    assert p.edge_index(L, S).shape == (2, 0)
    assert p.mask(L, S).shape == (L, S)


def test_bound_pattern_is_reused_and_rebinds():
    """Known answers: binding the same size returns the same object; another size rebinds."""
    p = P.random(2).bind(8, 8)
    assert p.bind(8) is p and p.bind(9).mask(9).shape == (9, 9)
    assert repr(p) == "random(k=2, seed=0).bind(8, 8)"


def test_edge_index_is_built_without_a_grid():
    """Known edge counts at L = 10^6, where an L x L grid (10^12 entries) is refused by mask()."""
    n = 10**6
    assert P.window(1, 1).edge_index(n).shape == (2, 3 * n - 2)
    assert P.global_tokens([0]).edge_index(n).shape == (2, 2 * n - 1)
    assert P.random(2).edge_index(n).shape == (2, 2 * n)
    with pytest.raises(ValueError, match=r"'L \* S' to be at most 2147483648 for a dense mask"):
        P.window(1, 1).mask(n)


# ---------------------------------------------------------------- known answers
@pytest.mark.parametrize("L, S", SIZES)
def test_full_and_causal_counts(L, S):
    """Known answers: L S edges; sum_i min(i + 1, S) causal edges, L (L + 1) / 2 when square."""
    assert P.full().edge_index(L, S).shape[1] == L * S
    assert P.causal().edge_index(L, S).shape[1] == sum(min(i + 1, S) for i in range(L))
    assert P.causal().edge_index(L).shape[1] == L * (L + 1) // 2


@pytest.mark.parametrize("left, right", [(0, 0), (1, 1), (2, 3), (5, 0), (6, 6)])
@pytest.mark.parametrize("L", [7, 12, 16])
def test_window_count_formula(L, left, right):
    """The closed form in window's docstring (while left, right < L) against the built edges."""
    expected = L * (left + right + 1) - left * (left + 1) // 2 - right * (right + 1) // 2
    assert P.window(left, right).edge_index(L).shape[1] == expected


@pytest.mark.parametrize("left, right, d", [(2, 2, 1), (0, 3, 1), (3, 1, 2), (2, 2, 3), (None, 1, 2)])
@pytest.mark.parametrize("L, S", SIZES)
def test_window_brute_force(left, right, d, L, S):
    """Reference: a Python loop over (i, j) of the rule j - i = d t, t in [-left, right]."""

    def rule(i, j):
        ok_left = left is None or j - i >= -left * d
        return (j - i) % d == 0 and ok_left and j - i <= right * d

    assert torch.equal(P.window(left, right, d).mask(L, S), brute(rule, L, S))


def test_window_presets():
    """Longformer (w/2 keys each side) and FlashAttention (inclusive (left, right), -1 unbounded) rules."""
    # Longformer: window size w, w/2 keys each side (w + 1 in all)
    assert torch.equal(P.longformer_window(6).mask(12), brute(lambda i, j: abs(i - j) <= 3, 12, 12))
    # FlashAttention window_size=(left, right): keys in [i - left, i + right], -1 = unbounded
    flash = brute(lambda i, j: i - 2 <= j <= i + 1, 12, 12)
    assert torch.equal(P.flash_window(2, 1).mask(12), flash)
    assert torch.equal(P.flash_window(-1, 0).mask(12), P.causal().mask(12))
    assert torch.equal(P.flash_window(-1, -1).mask(5), P.full().mask(5))


def sparse_transformer_strided(ell, i):
    """Child et al. 2019, Sec. 4.2.

    A1 = {t, t + 1, ..., i} for t = max(0, i - ell); A2 = {j : (i - j) mod ell = 0}.
    """
    a1 = set(range(max(0, i - ell), i + 1))
    a2 = {j for j in range(i + 1) if (i - j) % ell == 0}
    return a1 | a2


def sparse_transformer_fixed(ell, c, i):
    """Child et al. 2019, Sec. 4.2.

    A1 = {j : floor(j / ell) = floor(i / ell)}; A2 = {j : j mod ell in {t, t + 1, ..., ell}}, t = ell - c.
    """
    a1 = {j for j in range(i + 1) if j // ell == i // ell}
    a2 = {j for j in range(i + 1) if j % ell in range(ell - c, ell + 1)}
    return a1 | a2


@pytest.mark.parametrize("stride", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("L, S", [(16, 16), (12, 7), (7, 12), (33, 33)])
def test_strided_is_the_papers_rule(stride, L, S):
    """Reference: Child et al. 2019's sets A1, A2, by a Python loop."""
    expected = brute(lambda i, j: j in sparse_transformer_strided(stride, i), L, S)
    assert torch.equal(P.strided(stride).mask(L, S), expected)
    assert torch.equal(mask_to_edge_index(expected), P.strided(stride).edge_index(L, S))


@pytest.mark.parametrize("block, summary", [(1, 1), (4, 1), (4, 2), (3, 3), (5, 0)])
@pytest.mark.parametrize("L, S", [(16, 16), (12, 7), (7, 12), (33, 33)])
def test_fixed_is_the_papers_rule(block, summary, L, S):
    """Reference: Child et al. 2019's sets A1, A2, by a Python loop."""
    expected = brute(lambda i, j: j in sparse_transformer_fixed(block, summary, i), L, S)
    assert torch.equal(P.fixed(block, summary).mask(L, S), expected)
    assert torch.equal(mask_to_edge_index(expected), P.fixed(block, summary).edge_index(L, S))


@pytest.mark.parametrize(
    "p",
    [P.causal(), P.strided(3), P.fixed(4, 2), P.flash_window(-1, 0), P.window(5, 0, 2), P.strided(2) & P.random(4)],
    ids=lambda p: p.name,
)
def test_causal_patterns_have_no_future_keys(p):
    """Known answer: a causal pattern (or its intersection) has no edge with j > i, also for L != S."""
    src, dst = p.edge_index(16, 20)
    assert (src <= dst).all()


def test_global_tokens():
    """Reference rule i in G or j in G; known count 2 g L - g^2; the name sorts and dedups."""
    g = [0, 3, 20]  # 20 is out of range for these sizes and ignored
    for L, S in [(7, 7), (12, 5)]:
        expected = brute(lambda i, j: i in g or j in g, L, S)
        assert torch.equal(P.global_tokens(g).mask(L, S), expected)
    n_global = 2
    assert P.global_tokens(g).edge_index(12).shape[1] == 2 * n_global * 12 - n_global**2
    assert P.global_tokens(torch.tensor([3, 0, 3])).name == "global_0_3"


# ---------------------------------------------------------------- random and BigBird
@pytest.mark.parametrize("k", [0, 3, 9, 16, 40])
def test_random_keys_per_query(k):
    """Known answer: exactly min(k, S) keys per query."""
    L, S = 12, 16
    mask = P.random(k, seed=5).mask(L, S)
    assert (mask.sum(1) == min(k, S)).all()
    assert P.random(k, seed=5).edge_index(L, S).shape[1] == L * min(k, S)


@pytest.mark.parametrize(
    "make", [lambda s: P.random(3, seed=s), lambda s: P.random(12, seed=s), lambda s: P.bigbird(2, 1, 1, 2, seed=s)]
)
def test_seeds_reproducible_and_distinct(make):
    """Same seed, same edges; another seed, other edges; torch's global RNG state unchanged."""
    state = torch.get_rng_state()
    a, b = make(0).edge_index(16), make(0).edge_index(16)
    assert torch.equal(a, b) and torch.equal(a, make(0).edge_index(16))
    assert not torch.equal(a, make(1).edge_index(16))
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched


def test_random_is_roughly_uniform():
    """Each key is drawn with probability k / S: 2000 queries, 2 of 10 keys, 400 expected per key."""
    counts = torch.bincount(P.random(2).edge_index(2000, 10)[0], minlength=10)
    assert counts.min() > 300 and counts.max() < 500  # expected 400 each, sd 18


@pytest.mark.parametrize(
    "k, S, L", [(2, 16, 12000), (2, 5, 5000), (3, 5, 5000)], ids=["rejection-draw", "dense-draw-k2", "dense-draw-k3"]
)
def test_random_subsets_are_uniform_in_both_draws(k, S, L):
    """Every k-subset of the S keys is equally likely (C(S, k) subsets, L / C(S, k) expected each):
    the rejection draw (8 k <= S) and the top-k-of-uniforms draw (8 k > S) alike."""
    from math import comb

    keys = P.random(k, seed=11).edge_index(L, S)[0].reshape(L, k)  # (L, k) one query per row
    subsets = torch.unique(keys, dim=0, return_counts=True)[1]  # (C,) counts of each subset seen
    expected = L / comb(S, k)
    assert subsets.numel() == comb(S, k)
    assert subsets.min() > 0.5 * expected and subsets.max() < 1.6 * expected


def test_random_near_half_the_keys_draws_distinct_keys():
    """Known answer at k near S / 2 (the regime Floyd's algorithm made quadratic): k distinct keys each."""
    L = S = 1000
    for k in (S // 2 - 1, S // 2 + 1):
        keys = P.random(k, seed=3).edge_index(L, S)[0].reshape(L, k)  # (L, k) sorted per row
        assert bool((keys[:, 1:] > keys[:, :-1]).all())  # distinct and sorted


def test_bigbird_without_random_blocks_brute_force():
    """Reference: Zaheer et al. 2020's block rule (sliding and global blocks), by a Python loop."""
    b, L, S = 3, 17, 14  # partial last blocks on both axes
    nq, nk = -(-L // b), -(-S // b)

    def rule(i, j):
        a, c = i // b, j // b
        glob = a in (0, nq - 1) or c in (0, nk - 1)  # global_blocks=2: first and last
        return abs(a - c) <= 1 or glob

    assert torch.equal(P.bigbird(b, 3, 2, 0).mask(L, S), brute(rule, L, S))


def test_bigbird_random_blocks():
    """Known answers: whole blocks only; each non-global query block reads itself, the global
    block and exactly r random blocks."""
    b, L, r = 4, 40, 2
    p = P.bigbird(b, window_blocks=1, global_blocks=1, random_blocks=r, seed=7)
    blocks = p.mask(L).reshape(L // b, b, L // b, b)  # (nq, b, nk, b)
    assert (blocks.all((1, 3)) | ~blocks.any((1, 3))).all()  # whole blocks only
    table = blocks.any((1, 3))  # (nq, nk)
    assert table[0].all() and table[:, 0].all()  # the global first block
    # each other query block: itself, the global block, and r random ones
    assert (table[1:].sum(1) == 2 + r).all()


def test_bigbird_default_name():
    """Known answer: the name lists every parameter, defaults included."""
    assert P.bigbird(16).name == "bigbird_b16_w3_g2_r2_s0"


# ---------------------------------------------------------------- composition, names, kind
@pytest.mark.parametrize(
    "a, b",
    [
        (P.window(2, 2), P.global_tokens([0])),
        (P.strided(3), P.fixed(4, 1)),
        (P.causal(), P.random(4, seed=2)),
        (P.bigbird(2, 1, 1, 1), P.window(1, 0)),
    ],
    ids=lambda p: p.name,
)
@pytest.mark.parametrize("L, S", [(12, 12), (7, 12), (12, 7)])
def test_composition_matches_mask_algebra(a, b, L, S):
    """Reference: ``|`` and ``&`` of the parts' dense masks."""
    ma, mb = a.mask(L, S), b.mask(L, S)
    assert torch.equal((a | b).mask(L, S), ma | mb)
    assert torch.equal((a & b).mask(L, S), ma & mb)
    assert torch.equal((a | b).edge_index(L, S), mask_to_edge_index(ma | mb))
    assert torch.equal((a & b).edge_index(L, S), mask_to_edge_index(ma & mb))


def test_names_and_repr():
    """Known names; the repr is the constructor call, so eval(repr(p)) rebuilds the same mask."""
    assert P.window(2, 2).name == "window_2_2" and P.strided(8).name == "strided_8"
    assert P.window(None, 0, 2).name == "window_inf_0_d2"
    assert (P.window(2, 2) | P.global_tokens([0])).name == "window_2_2|global_0"
    assert ((P.causal() | P.full()) & P.strided(2)).name == "(causal|full)&strided_2"
    assert P.longformer(8, [0, 5]).name == "longformer_w8_g0_5"
    assert repr(P.window(2, 2)) == "window(left=2, right=2, dilation=1)"
    for p in PATTERNS:  # the repr is the constructor call
        assert torch.equal(eval(repr(p), vars(P)).mask(12, 9), p.mask(12, 9)), repr(p)


@pytest.mark.parametrize(
    "p, kind",
    [
        (P.full(), "full"),
        (P.causal(), "causal"),
        (P.window(2, 2), None),
        (P.strided(4), None),
        (P.full() | P.window(1, 1), "full"),
        (P.causal() & P.full(), "causal"),
        (P.causal() | P.causal(), "causal"),
        (P.causal() | P.global_tokens([0]), None),
        (P.flash_window(-1, 0), "causal"),
        (P.window(None, None), "full"),
        (P.random(3).bind(5), None),
    ],
    ids=lambda x: getattr(x, "name", str(x)),
)
def test_kind_for_dispatch(p, kind):
    """Known kinds; a pattern of kind full/causal has exactly full()'s or causal()'s mask."""
    assert p.kind == kind
    if kind is not None:
        reference = P.full() if kind == "full" else P.causal()
        assert torch.equal(p.mask(9, 6), reference.mask(9, 6))


# ---------------------------------------------------------------- data-dependent
def test_topk_against_brute_force_with_ties():
    """Reference: Python's sorted by (-score, j), the first k; integer scores give many ties."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (9, 11), generator=g).double()  # many ties
    for k in [0, 1, 3, 11, 20]:

        def rule(i, j, k=k):
            ranked = sorted(range(11), key=lambda c: (-scores[i, c].item(), c))
            return j in ranked[:k]

        p = P.topk(scores, k)
        assert torch.equal(p.mask(), brute(rule, 9, 11))
        assert torch.equal(p.edge_index(9, 11), mask_to_edge_index(p.mask(9, 11)))
        assert p.edge_index().shape[1] == 9 * min(k, 11)


def test_threshold():
    """Reference: a Python loop over pairs with scores[i, j] >= tau; a query may keep no key."""
    scores = torch.softmax(torch.randn(6, 8, generator=torch.Generator().manual_seed(1)), -1)
    scores[2] = 0.05  # every key of query 2 below tau
    p = P.threshold(scores, 0.1)
    expected = brute(lambda i, j: scores[i, j].item() >= 0.1, 6, 8)
    assert torch.equal(p.mask(), expected) and not expected[2].any()
    assert torch.equal(p.edge_index(), mask_to_edge_index(expected))
    assert p.name == "threshold_0.1"


def test_topk_mask_batched_equals_topk_per_head_and_a_sort_reference():
    """topk_mask over (layers, H, L, S) equals topk(scores[l, h]) per slice, and a stable
    descending sort (``torch.sort(stable=True)``) per row; +-inf rank first and last."""
    g = torch.Generator().manual_seed(4)
    scores = torch.randint(0, 3, (2, 3, 7, 9), generator=g).double()  # (layers, H, L, S) many ties
    scores[0, 0, 0, :4] = float("-inf")
    scores[1, 2, 3, 8] = float("inf")
    for k in (0, 1, 4, 9, 12):
        got = P.topk_mask(scores, k)  # (2, 3, 7, 9)
        order = scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]
        expected = torch.zeros_like(got).scatter_(-1, order, True)
        assert torch.equal(got, expected)
        for layer in range(2):
            for h in range(3):
                assert torch.equal(got[layer, h], P.topk(scores[layer, h], k).mask())


def test_topk_mask_per_query_budget():
    """A tensor k gives each query its own budget: query i keeps its k[i] highest keys (a known answer)."""
    scores = torch.tensor([[3.0, 1.0, 2.0, 2.0]] * 4)  # (4, 4) rank: 0, then 2 and 3 (tie), then 1
    got = P.topk_mask(scores.expand(2, 4, 4), torch.tensor([0, 1, 2, 9]))
    assert got[0].int().tolist() == [[0, 0, 0, 0], [1, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]]
    assert torch.equal(got[0], got[1])
    with pytest.raises(ValueError, match=r"'k' to be an int or a Tensor broadcastable to \(2, 4\)"):
        P.topk_mask(scores.expand(2, 4, 4), torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="'k'"):
        P.topk_mask(scores, torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_scored_pattern_size_and_input_errors():
    scores = torch.randn(4, 5)
    with pytest.raises(ValueError, match=r"\(4, 5\)"):
        P.topk(scores, 2).edge_index(5)
    with pytest.raises(ValueError, match="one layer and head"):
        P.topk(torch.randn(2, 4, 5), 2)
    with pytest.raises(TypeError, match="'scores'"):
        P.topk(torch.ones(4, 5, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="NaN"):
        P.threshold(torch.full((2, 2), float("nan")), 0.5)


# ---------------------------------------------------------------- stats
def test_stats_known_cases():
    """Known answers: full and causal graphs' counts, reachability and diameter 1."""
    s = P.stats(P.full(), 8)
    assert s["density"] == 1.0 and s["edges"] == 64 and s["edges_per_query_min"] == 8
    assert s["reachable_within_p"] and s["diameter"] == 1 and not s["causal"]
    s = P.stats(P.causal(), 8, p=1)
    assert s["causal"] and s["reachable_within_p"] and s["diameter"] == 1
    assert s["edges_per_query_min"] == 1 and s["edges_per_query_max"] == 8
    assert s["edges_per_query_mean"] == pytest.approx(4.5)


@pytest.mark.parametrize("p", [P.strided(4), P.strided(5), P.fixed(4, 1), P.fixed(8, 2)], ids=lambda p: p.name)
def test_stats_sparse_transformer_two_hops(p):
    """Child et al. 2019: both factorisations connect every j <= i within p = 2 hops."""
    assert P.stats(p, 32, p=2)["reachable_within_p"]
    assert not P.stats(p, 32, p=1)["reachable_within_p"]


def test_stats_disconnected_and_large():
    """Known answers: a path graph needs L - 1 hops, a hub 2, self-loops alone reach nothing."""
    s = P.stats(P.window(1, 0), 8, p=2)
    assert not s["reachable_within_p"] and s["diameter"] == 7
    assert P.stats(P.window(1, 1), 8)["diameter"] == 7
    star = P.stats(P.global_tokens([0]), 8)  # 1 -> 0 -> 2: the hub joins every pair in 2 hops
    assert star["reachable_within_p"] and star["diameter"] == 2
    assert P.stats(P.window(0, 0), 4)["diameter"] is None  # self-loops only: unreachable pairs
    assert P.stats(P.window(2, 2), P.DIAMETER_MAX_L + 1)["diameter"] is None
    assert P.stats(P.full(), 0)["edges"] == 0


@pytest.mark.parametrize(
    "p", [P.strided(5), P.window(2, 1), P.global_tokens([3]) | P.window(0, 1)], ids=lambda p: p.name
)
@pytest.mark.parametrize("hops", [1, 2, 3, 40])
def test_stats_reachability_equals_networkx_bfs(p, hops):
    """Reference: networkx shortest path lengths on the edge list; every parent pair within p hops."""
    L = 40
    src, dst = p.edge_index(L)
    graph = nx.DiGraph(zip(src.tolist(), dst.tolist()))
    dist = dict(nx.all_pairs_shortest_path_length(graph))
    causal = bool((src <= dst).all())
    need = [(j, i) for i in range(L) for j in range(L) if j <= i or not causal]
    assert P.stats(p, L, p=hops)["reachable_within_p"] == all(dist[j].get(i, hops + 1) <= hops for j, i in need)


def test_stats_on_long_inputs_count_from_the_edges(monkeypatch):
    """At L = 20000 no dense (L, L) view is built (mask() is made to fail); counts are known answers."""

    def no_dense(*args, **kwargs):
        raise AssertionError("stats built a dense mask")

    monkeypatch.setattr(P.Pattern, "mask", no_dense)
    L = 20000
    s = P.stats(P.window(2, 2) | P.global_tokens([0]), L)
    window = 5 * L - 6
    assert s["edges"] == window + 2 * (L - 3)  # the hub adds its row and column beyond the window's 3
    assert s["edges_per_query_max"] == L and s["edges_per_query_min"] == 4
    assert s["reachable_within_p"] is None and s["diameter"] is None


# ---------------------------------------------------------------- FlexAttention
def test_create_block_mask_accepts_mask_mod():
    """Reference: FlexAttention's create_mask on the same mask_mod equals the pattern's mask."""
    L, S = 300, 260
    for p in [P.window(2, 2) | P.global_tokens([0]), P.bigbird(16).bind(L, S)]:
        block_mask = create_block_mask(p.mask_mod, None, None, L, S, device="cpu")
        assert block_mask.shape == (1, 1, L, S)
        dense = create_mask(p.mask_mod, None, None, L, S, device="cpu")[0, 0]
        assert torch.equal(dense, p.mask(L, S))


@pytest.mark.parametrize(
    "p",
    [
        P.window(3, 1, 2) | P.global_tokens([0, 4]),
        P.fixed(4, 1),
        P.bigbird(3).bind(12, 9),
        P.topk(torch.randn(12, 9), 3),
    ],
    ids=lambda p: p.name,
)
def test_mask_mod_traces_without_graph_breaks(p):
    """torch.compile(fullgraph=True) traces mask_mod; the compiled result equals the mask."""
    torch._dynamo.reset()
    compiled = torch.compile(p.bind(12, 9).mask_mod, fullgraph=True, backend="aot_eager")
    q, kv = torch.arange(12).unsqueeze(1), torch.arange(9).unsqueeze(0)  # (12, 1), (1, 9)
    assert torch.equal(compiled(0, 0, q, kv).expand(12, 9), p.mask(12, 9))


def test_unbound_size_dependent_mask_mod_raises():
    """Known refusal: a random pattern's mask_mod needs bind(L, S)."""
    i = torch.tensor(1)
    with pytest.raises(ValueError, match="bind"):
        P.random(2).mask_mod(i, i, i, i)


# ---------------------------------------------------------------- bad parameters
@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: P.strided(0), ValueError, "Expected 'stride' to be a positive int <= 2**62 (got 0)"),
        (lambda: P.strided(2.5), TypeError, "Expected 'stride' to be a positive int (got 2.5)"),
        (lambda: P.window(-1, 2), ValueError, "Expected 'left' to be a non-negative int <= 2**62 (got -1)"),
        (lambda: P.window(1, True), TypeError, "'right'"),
        (lambda: P.window(1, 1, 0), ValueError, "'dilation' to be a positive int <= 2**62 (got 0)"),
        (lambda: P.fixed(4, 5), ValueError, "Expected 'summary' to be an int in [0, 4] (got 5)"),
        (lambda: P.fixed(0, 0), ValueError, "'block'"),
        (lambda: P.longformer_window(3), ValueError, "even"),
        (lambda: P.random(-1), ValueError, "'k'"),
        (lambda: P.random(2, seed="a"), TypeError, "'seed'"),
        (lambda: P.bigbird(0), ValueError, "'block'"),
        (lambda: P.bigbird(4, random_blocks=-2), ValueError, "'random_blocks'"),
        (lambda: P.global_tokens([-1]), ValueError, "'indices'"),
        (lambda: P.topk(torch.randn(3, 3), -1), ValueError, "'k'"),
        (lambda: P.threshold(torch.randn(3, 3), "0.5"), TypeError, "'tau'"),
        (lambda: P.full().edge_index(-1), ValueError, "Expected 'L' to be an int in [0, 2147483647] (got -1)"),
        (lambda: P.causal().mask(3, 2.0), TypeError, "'S'"),
        (lambda: P.stats(P.full(), 4, p=0), ValueError, "'p'"),
        (lambda: P.stats("full", 4), TypeError, "Expected 'pattern' to be a graphattn.patterns.Pattern (got str)"),
        (lambda: P.window(2**70, 1), ValueError, "Expected 'left' to be a non-negative int <= 2**62"),
        (lambda: P.random(2, seed=2**64), ValueError, "Expected 'seed' to be an int in [-9223372036854775808, "),
        (lambda: P.full().edge_index(2**31), ValueError, "Expected 'L' to be an int in [0, 2147483647]"),
        (
            lambda: P.full().edge_index(2**16),
            ValueError,
            "Expected 'L and S' to be sizes giving at most 2147483648 edges",
        ),
        (lambda: P.causal().edge_index(2**17), ValueError, "'L and S'"),
        (lambda: P.bigbird(1).mask(50000), ValueError, "'L * S'"),
        (lambda: P.threshold(torch.randn(3, 3), float("nan")), ValueError, "Expected 'tau' to be a finite float"),
        (lambda: P.global_tokens("0"), TypeError, "Expected 'indices' to be an int or a sequence"),
        (lambda: P.flash_window(-2, 0), ValueError, "Expected 'left' to be an int >= -1 (got -2)"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_bad_parameters(call, error, message):
    """Each refusal is validate's template naming the argument, raised before anything is built."""
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)


def test_is_pattern_is_an_isinstance_check():
    """Known answers: patterns (composed, bound) are patterns; tensors and look-alikes are not."""

    class LooksLikeOne:
        kind = None

        def edge_index(self, L):
            return torch.empty(2, 0, dtype=torch.long)

        def mask(self, L):
            return torch.zeros(L, L, dtype=torch.bool)

    for p in (P.full(), P.window(1, 1) | P.causal(), P.random(2).bind(4), P.topk(torch.randn(2, 2), 1)):
        assert P.is_pattern(p)
    for obj in (torch.zeros(2, 3, dtype=torch.long), LooksLikeOne(), "causal", None):
        assert not P.is_pattern(obj)


def test_every_public_name_is_importable_from_graphattn_patterns():
    """The split into a package keeps ``graphattn.patterns.<name>`` for every documented name."""
    import graphattn

    for name in [
        "Pattern",
        "is_pattern",
        "full",
        "causal",
        "window",
        "dilated",
        "longformer_window",
        "flash_window",
        "strided",
        "fixed",
        "global_tokens",
        "random",
        "bigbird",
        "longformer",
        "topk",
        "topk_mask",
        "threshold",
        "stats",
        "DIAMETER_MAX_L",
    ]:
        assert name in P.__all__ and getattr(graphattn.patterns, name) is getattr(P, name)
