"""Size and connectivity of a pattern: :func:`stats`.

Edge counts come from the edge list in O(E); the all-pairs questions
(reachability within p hops, diameter) need an (L, L) computation and are
answered only up to a documented size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.patterns.base import MAX_LENGTH, Pattern, is_pattern
from graphattn.validate import check_int, message

__all__ = ["stats", "REACH_MAX_L", "DIAMETER_MAX_L"]

REACH_MAX_L = 2048  # reachability: dense (L, L) float products, about 0.1 s per hop at L = 2048
DIAMETER_MAX_L = 128  # networkx all-pairs BFS is Python-speed: skip above this


def _reachable_within(pattern: Pattern, L: int, p: int, causal: bool) -> bool:
    """Every parent pair (j <= i if causal, else all) joined by a path j -> ... -> i of <= p edges."""
    adj = pattern.mask(L, L).float()  # (L, L) adj[i, j] = 1 for the edge j -> i
    reach = torch.eye(L)  # (L, L) reach[i, j]: j reaches i within t hops
    for _ in range(min(p, max(L - 1, 1))):  # a shortest path has at most L - 1 edges
        grown = ((reach + adj @ reach) > 0).float()  # (L, L) · (L, L) -> (L, L)
        if torch.equal(grown, reach):  # a fixed point: more hops reach nothing new
            break
        reach = grown
    reached = reach.bool()  # (L, L)
    return bool(reached.tril().sum() == L * (L + 1) // 2) if causal else bool(reached.all())


def _diameter(src: Tensor, dst: Tensor, L: int, causal: bool) -> int | None:
    """The most hops any parent pair needs (networkx BFS); None if a pair is unreachable."""
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(range(L))
    graph.add_edges_from(zip(src.tolist(), dst.tolist()))  # j -> i
    hops = dict(nx.all_pairs_shortest_path_length(graph))
    worst = 0
    for j in range(L):
        for i in range(j if causal else 0, L):
            if i not in hops[j]:
                return None
            worst = max(worst, hops[j][i])
    return worst


def stats(pattern: Pattern, L: int, p: int = 2) -> dict:
    """Size and connectivity of a pattern on L = S tokens.

    Parameters
    ----------
    pattern : Pattern
    L : int, 0 <= L <= MAX_LENGTH
    p : int >= 1, default 2
        Hop budget of the Sparse Transformer's criterion [1]_.

    Returns
    -------
    dict
        ``edges`` (int), ``density`` (edges / L^2, in [0, 1]), ``edges_per_query_min``,
        ``_mean``, ``_max`` (int, float, int), ``causal`` (no edge with j > i),
        ``reachable_within_p`` (every pair of the parent pattern, all j <= i if
        causal else all (i, j), joined by a path j -> ... -> i of at most p edges;
        j == i counts as reached in 0 hops; None when L > ``REACH_MAX_L``), and
        ``diameter``: the most hops any parent pair needs (networkx BFS), None if
        a pair is unreachable or L > ``DIAMETER_MAX_L``.

    Raises
    ------
    TypeError
        ``pattern`` not a Pattern; ``L`` or ``p`` not an int.
    ValueError
        ``L`` outside [0, MAX_LENGTH], ``p`` < 1, or more edges than the pattern may build.

    Notes
    -----
    The counts take O(E) time and memory from the edge list, so L = 20000 with
    a sparse pattern is cheap. Reachability is a dense (L, L) product per hop,
    O(min(p, L) L^3) time, and is computed only for L <= ``REACH_MAX_L`` = 2048.

    References
    ----------
    .. [1] Child et al., "Generating Long Sequences with Sparse Transformers", 2019.

    Examples
    --------
    >>> from graphattn.patterns import strided
    >>> s = stats(strided(4), 16)
    >>> s["edges"], s["causal"], s["reachable_within_p"], s["diameter"]
    (82, True, True, 2)
    """
    if not is_pattern(pattern):
        raise TypeError(message("pattern", "a graphattn.patterns.Pattern", type(pattern).__name__))
    L, p = check_int("L", L, 0, MAX_LENGTH), check_int("p", p, 1)
    src, dst = pattern.edge_index(L, L)  # (E,), (E,)
    per_query = torch.bincount(dst, minlength=L)  # (L,)
    is_causal = bool((src <= dst).all())
    return {
        "edges": src.numel(),
        "density": src.numel() / (L * L) if L else 0.0,
        "edges_per_query_min": int(per_query.min()) if L else 0,
        "edges_per_query_mean": float(per_query.double().mean()) if L else 0.0,
        "edges_per_query_max": int(per_query.max()) if L else 0,
        "causal": is_causal,
        "reachable_within_p": _reachable_within(pattern, L, p, is_causal) if L <= REACH_MAX_L else None,
        "diameter": _diameter(src, dst, L, is_causal) if L <= DIAMETER_MAX_L else None,
    }
