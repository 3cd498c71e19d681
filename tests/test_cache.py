"""graphattn.cache.ContentCache and its three users: never stale, LRU, a thrash warning, safe under threads.

References: a structure built fresh from a copy of the edited tensor (the
cache must give the same outputs), and counts of builds (``build`` called
again exactly when the content changed).
"""

import threading
import warnings

import numpy as np
import pytest
import torch
from conftest import assert_close

import graphattn as ga
from graphattn import ops, patterns
from graphattn.cache import ContentCache


def _counting_cache(size=4):
    cache, calls = ContentCache("test cache", size, "resize(n)"), []

    def get(t):
        return cache.get(("k",), (t,), lambda: calls.append(1) or t.clone())

    return cache, calls, get


def test_a_hit_needs_equal_content():
    cache, calls, get = _counting_cache()
    t = torch.arange(6).view(2, 3)
    assert torch.equal(get(t), t) and torch.equal(get(t), t) and len(calls) == 1
    t.data[0, 0] = 5  # bypasses the version counter
    assert get(t)[0, 0] == 5 and len(calls) == 2
    t.numpy()[1, 2] = -1  # a NumPy view writes the same storage
    assert get(t)[1, 2] == -1 and len(calls) == 3
    with torch.no_grad():
        t.add_(1)  # in place
    assert torch.equal(get(t), t) and len(calls) == 4


def test_lru_keeps_what_is_used_and_size_zero_disables():
    cache, calls, get = _counting_cache(size=2)
    a, b, c = (torch.full((3,), i) for i in range(3))
    get(a), get(b), get(a), get(c)  # b is the least recently used when c arrives
    assert len(cache) == 2 and len(calls) == 3
    get(a)
    assert len(calls) == 3  # a was kept
    cache.resize(0)
    get(a), get(a)
    assert len(calls) == 5 and len(cache) == 0


def test_thrashing_warns_once_naming_the_fix():
    cache, calls, get = _counting_cache(size=2)
    tensors = [torch.full((4,), i) for i in range(3)]
    with pytest.warns(RuntimeWarning, match=r"keeps 2 graphs.*resize\(n\)") as seen:
        for _ in range(4):
            for t in tensors:  # three graphs in a cache of two, round robin: every call misses
                get(t)
    assert len([w for w in seen if "keeps 2 graphs" in str(w.message)]) == 1


def test_fresh_graphs_at_reused_addresses_do_not_warn():
    """Sampled batches: a new graph each step (often at a recycled address) is not thrashing."""
    cache, calls, get = _counting_cache(size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(20):
            get(torch.randint(0, 100, (2, 50), generator=torch.Generator().manual_seed(step)))
    assert len(calls) == 20


@pytest.mark.parametrize("write", ["data", "numpy", "in_place"])
def test_layer_never_meets_a_stale_structure(write):
    """After any write to edge_index, the layer's output equals the output for a fresh copy of it."""
    torch.manual_seed(0)
    N = 30
    conv = ga.TransformerConv(8, 4, heads=2)
    x = torch.randn(N, 8)
    edge_index = patterns.random(4, seed=0).edge_index(N)
    conv(x, edge_index)  # cached now
    new_sources = torch.randint(0, N, (edge_index.size(1),), generator=torch.Generator().manual_seed(1))
    if write == "data":
        edge_index.data[0] = new_sources
    elif write == "numpy":
        edge_index.numpy()[0] = new_sources.numpy()
    else:
        edge_index[0] = new_sources
    assert_close(conv(x, edge_index), conv(x, edge_index.clone()))
    assert_close(conv(x, edge_index), conv.to_transformer_conv()(x, edge_index))  # PyG's own conv agrees


def test_sparse_adjacency_edit_is_seen():
    """A sparse adjacency edited through .values().data gives the new edges' values, not the cached ones."""
    from torch_geometric.utils import to_torch_coo_tensor

    edge_index = patterns.random(3, seed=4).edge_index(12)
    adj = to_torch_coo_tensor(edge_index.flip(0), size=(12, 12)).coalesce()
    first, _, values = ga.graphs.to_edge_index(adj)
    values = values.clone()  # the returned values may share the adjacency's storage
    adj.values().data.mul_(3.0)
    again, _, values_again = ga.graphs.to_edge_index(adj)
    assert torch.equal(first, again) and torch.equal(values_again, 3.0 * values)


def test_one_cache_under_threads_builds_equal_structures():
    """16 threads on 4 graphs that keep being rewritten: every result equals a fresh single-threaded call."""
    L = 40
    q, k, v = (torch.randn(L, 2, 4, dtype=torch.float64) for _ in range(3))
    graphs_ = [patterns.random(3, seed=s).edge_index(L) for s in range(4)]
    errors = []

    def work(n):
        rng = np.random.default_rng(n)
        for step in range(15):
            e = graphs_[(n + step) % 4].clone()
            e[0] = torch.from_numpy(rng.integers(0, L, e.size(1)))
            got, _ = ops.attention(q, k, v, e)
            want, _ = ops.attention(q, k, v, e.clone(), impl="csr")
            if not torch.equal(got, want) and (got - want).abs().max() > 1e-12:
                errors.append((n, step))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_keep_graphs_holds_a_cycle_of_masks_without_rebuilding_or_warning():
    """An experiment that cycles through n batches, once per pattern, builds each batch's graph once inside
    ``interop.masks.keep_graphs(n)`` (no thrashing warning), and the size before is restored after."""
    from graphattn.interop import masks

    masks.clear_cache()
    before = masks._CACHE.size
    cycle = [torch.rand(1, 1, 3, 3) > 0.3 for _ in range(before + 3)]  # more batches than the default keeps
    built = []
    original = masks._build
    masks._build = lambda *a: built.append(1) or original(*a)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with masks.keep_graphs(len(cycle)):
                for _ in range(3):
                    graphs = [masks.base_graph(m, 1, 3, 3, False, "cpu") for m in cycle]
    finally:
        masks._build = original
    assert len(built) == len(cycle)  # one build per distinct mask, not one per pass
    assert torch.equal(graphs[0].edge_index, masks.graph_from_mask(cycle[0], None).edge_index)
    assert masks._CACHE.size == before
    masks.clear_cache()
