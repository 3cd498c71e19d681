"""The exercise checkers: each accepts the right answer and rejects typical wrong ones, naming the mistake."""

import math

import pytest
import torch

import graphattn as ga
from graphattn import exercises as ex


def _masked_ok(s, keep):
    return torch.where(keep, s, float("-inf")).softmax(-1).nan_to_num(0.0)


def _mp(q, k, v, ei, scale=None, per_target=True):
    s = (q[ei[1]] * k[ei[0]]).sum(-1) / (math.sqrt(q.size(-1)) if scale is None else scale)  # (E, H)
    if per_target:
        from torch_geometric.utils import softmax

        a = softmax(s, ei[1], num_nodes=q.size(0))
    else:
        a = s.softmax(0)
    return torch.zeros(q.size(0), *v.shape[1:], dtype=v.dtype).index_add_(0, ei[1], a[..., None] * v[ei[0]])


def _merge(m1, l1, o1, m2, l2, o2, rescale=True):
    m = torch.maximum(m1, m2)
    a, b = ((m1 - m).exp(), (m2 - m).exp()) if rescale else (torch.ones_like(m), torch.ones_like(m))
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def _gat():
    from torch_geometric.nn import GATConv

    torch.manual_seed(0)
    return GATConv(4, 3, heads=2, add_self_loops=False), torch.randn(6, 4)


def _gat_query_argmax():
    gat, x = _gat()
    with torch.no_grad():
        return (gat.lin(x).view(-1, 2, 3) * gat.att_dst).sum(-1).argmax(0)


def _gat_right():
    gat, x = _gat()
    with torch.no_grad():
        return (gat.lin(x).view(-1, 2, 3) * gat.att_src).sum(-1).argmax(0)


W = torch.tensor([[[0.1, 0.2, 0.7], [0.5, 0.4, 0.1], [0.6, 0.1, 0.3]]]).double()  # (H, N, N), query = row
TOKENS = ["[CLS]", "a", "b"]
HIDDEN = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]).double()
EMBED = HIDDEN.mean(0) / HIDDEN.mean(0).norm()
FULL5 = ga.patterns.full().edge_index(5)
PERM = torch.tensor([2, 0, 3, 1])
EI4 = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
INV = torch.tensor([1, 3, 0, 2])
KV = dict(layers=2, query_heads=8, kv_heads=2, head_dim=4, tokens=10, bytes_per_value=2)

# checker -> (call with the right answer, [(wrong answer call, phrase the explanation must hold)])
CASES = {
    "check_equal_scores": (
        lambda: ex.check_equal_scores([1 / 3] * 3),
        [
            (lambda: ex.check_equal_scores([1.0, 1.0, 1.0]), "scaled scores"),
            (lambda: ex.check_equal_scores([0.5, 0.5, 0.5]), "sum to 1"),
            (lambda: ex.check_equal_scores(1 / 3), "give all three"),
        ],
    ),
    "check_book_softmax": (
        lambda: ex.check_book_softmax(torch.softmax(torch.tensor([1.05, 0.2, -0.15]), 0)),
        [
            (lambda: ex.check_book_softmax([0.67, 0.21, 0.12]), "book's printed"),
            (lambda: ex.check_book_softmax(torch.softmax(torch.tensor([2.1, 0.4, -0.3]), 0)), "divide by sqrt(4)"),
            (lambda: ex.check_book_softmax(torch.softmax(torch.tensor([2.1, 0.4, -0.3]) / 4, 0)), "d_k = 4"),
        ],
    ),
    "check_masked_softmax": (
        lambda: ex.check_masked_softmax(_masked_ok),
        [
            (lambda: ex.check_masked_softmax(lambda s, k: torch.where(k, s, float("-inf")).softmax(-1)), "0 / 0"),
            (lambda: ex.check_masked_softmax(lambda s, k: s.masked_fill(~k, -1e9).softmax(-1)), "uniform"),
            (lambda: ex.check_masked_softmax(lambda s, k: s.softmax(-1) * k), "renormalising"),
            (lambda: ex.check_masked_softmax(lambda s, k: _masked_ok(s, ~k)), "other way round"),
        ],
    ),
    "check_bipartite_edges": (
        lambda: ex.check_bipartite_edges(ga.graphs.mask_to_edge_index(torch.ones(7, 3, dtype=bool))),
        [
            (
                lambda: ex.check_bipartite_edges(ga.graphs.mask_to_edge_index(torch.ones(7, 3, dtype=bool)).flip(0)),
                "swapped",
            ),
            (lambda: ex.check_bipartite_edges(torch.tensor([[0], [0]])), "21 edges"),
        ],
    ),
    "check_no_incoming": (
        lambda: ex.check_no_incoming(torch.zeros(4)),
        [
            (lambda: ex.check_no_incoming(torch.ones(4)), "no incoming edge"),
            (lambda: ex.check_no_incoming(torch.zeros(0)), "empty"),
        ],
    ),  # all() of nothing is True
    "check_message_passing": (
        lambda: ex.check_message_passing(_mp),
        [
            (lambda: ex.check_message_passing(lambda *a: _mp(*a, per_target=False)), "all edges at once"),
            (lambda: ex.check_message_passing(lambda *a: _mp(*a, scale=1.0)), "not scaled"),
        ],
    ),
    "check_window_edges": (lambda: ex.check_window_edges(28), [(lambda: ex.check_window_edges(30), "one")]),
    "check_causal_density": (
        lambda: ex.check_causal_density(136 / 256),
        [
            (lambda: ex.check_causal_density(120 / 256), "self-loops"),
            (lambda: ex.check_causal_density(136), "edge count"),
        ],
    ),
    "check_sliding_window": (
        lambda: ex.check_sliding_window(ga.patterns.window(2, 0).edge_index(8)),
        [(lambda: ex.check_sliding_window(ga.patterns.window(2, 0).edge_index(8).flip(0)), "future")],
    ),
    "check_online_merge": (
        lambda: ex.check_online_merge(_merge),
        [(lambda: ex.check_online_merge(lambda *a: _merge(*a, rescale=False)), "rescaling")],
    ),
    "check_kv_cache_bytes": (
        lambda: ex.check_kv_cache_bytes(2 * 2 * 2 * 4 * 10 * 2, **KV),
        [
            (lambda: ex.check_kv_cache_bytes(2 * 2 * 8 * 4 * 10 * 2, **KV), "per query head"),
            (lambda: ex.check_kv_cache_bytes(2 * 2 * 4 * 10 * 2, **KV), "keys and values"),
        ],
    ),
    "check_top_received": (
        lambda: ex.check_top_received("[CLS]", W, TOKENS),
        [(lambda: ex.check_top_received("b", W, TOKENS), "column")],
    ),
    "check_cls_reads": (
        lambda: ex.check_cls_reads("b", W, TOKENS),
        [
            (lambda: ex.check_cls_reads("[CLS]", W, TOKENS), "leave out"),
            (lambda: ex.check_cls_reads("a", W, TOKENS), "a column"),
        ],
    ),
    "check_sentence_embedding": (
        lambda: ex.check_sentence_embedding(EMBED, HIDDEN, EMBED),
        [
            (lambda: ex.check_sentence_embedding(HIDDEN[0], HIDDEN, EMBED), "[CLS] vector"),
            (lambda: ex.check_sentence_embedding(HIDDEN.mean(0), HIDDEN, EMBED), "normalised"),
        ],
    ),
    "check_karate_edges": (
        lambda: ex.check_karate_edges(190),
        [(lambda: ex.check_karate_edges(156), "self-loops"), (lambda: ex.check_karate_edges(78), "twice")],
    ),
    "check_relabelled_edges": (
        lambda: ex.check_relabelled_edges(INV[EI4], EI4, PERM),
        [(lambda: ex.check_relabelled_edges(PERM[EI4], EI4, PERM), "inverse")],
    ),
    "check_gat_first_key": (
        lambda: ex.check_gat_first_key(_gat_right(), *_gat()),
        [(lambda: ex.check_gat_first_key(_gat_right().flip(0) + 7, *_gat()), "one key per head")]
        + (
            [(lambda: ex.check_gat_first_key(_gat_query_argmax(), *_gat()), "query term")]
            if not torch.equal(_gat_query_argmax(), _gat_right())
            else []
        ),
    ),
    "check_global_edges": (lambda: ex.check_global_edges(593), [(lambda: ex.check_global_edges(1521), "per graph")]),
    "check_causal_bias": (
        lambda: ex.check_causal_bias(torch.where(FULL5[0] > FULL5[1], float("-inf"), 0.0), FULL5),
        [
            (
                lambda: ex.check_causal_bias(torch.where(FULL5[0] < FULL5[1], float("-inf"), 0.0), FULL5),
                "blocks the past",
            ),
            (lambda: ex.check_causal_bias(torch.where(FULL5[0] > FULL5[1], -5.0, 0.0), FULL5), "-inf"),
            (lambda: ex.check_causal_bias(torch.where(FULL5[0] > FULL5[1], -1e9, 0.0), FULL5), "underflows"),
        ],
    ),
}


def _mp_in_place(q, k, v, ei):
    q.div_(math.sqrt(q.size(-1)))  # right, but edits the caller's tensor
    return _mp(q, k, v, ei, scale=1.0)


OTHER_FORMS = [  # right answers in another valid form: hand-rounded, float32, another edge order, (src, dst) pair
    lambda: ex.check_equal_scores([0.333, 0.333, 0.333]),
    lambda: ex.check_masked_softmax(lambda s, k: _masked_ok(s.float(), k)),
    lambda: ex.check_message_passing(lambda q, k, v, ei: _mp(q.float(), k.float(), v.float(), ei)),
    lambda: ex.check_message_passing(_mp_in_place),
    lambda: ex.check_relabelled_edges(INV[EI4][:, [3, 1, 0, 2]], EI4, PERM),
    lambda: ex.check_relabelled_edges(INV[EI4].tolist(), EI4, PERM),
    lambda: ex.check_bipartite_edges((torch.arange(3).repeat(7), torch.arange(7).repeat_interleave(3))),
    lambda: ex.check_sliding_window(tuple(ga.patterns.window(2, 0).edge_index(8).flip(1))),
]


@pytest.mark.parametrize("index", range(len(OTHER_FORMS)))
def test_accepts_a_right_answer_in_another_form(index):
    v = OTHER_FORMS[index]()
    assert v.ok, v.message


def test_every_checker_has_cases():
    assert sorted(CASES) == sorted(n for n in ex.__all__ if n.startswith("check_"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_accepts_the_right_answer(name):
    v = CASES[name][0]()
    assert v and v.ok and repr(v).startswith("Right.")


@pytest.mark.parametrize("name", sorted(CASES))
def test_rejects_wrong_answers_and_says_why(name):
    for call, phrase in CASES[name][1]:
        v = call()
        assert not v and repr(v).startswith("Not yet.") and phrase in v.message, (name, v.message)


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_unfilled_stub_is_not_an_answer(name):
    context = dict(
        check_top_received=(W, TOKENS),
        check_cls_reads=(W, TOKENS),
        check_sentence_embedding=(HIDDEN, EMBED),
        check_relabelled_edges=(EI4, PERM),
        check_gat_first_key=_gat(),
        check_causal_bias=(FULL5,),
    )
    v = getattr(ex, name)(..., *context.get(name, ()), **(KV if name == "check_kv_cache_bytes" else {}))
    assert not v and "Replace `...`" in v.message
    if name in {"check_masked_softmax", "check_message_passing", "check_online_merge"}:  # a function stub
        v = getattr(ex, name)(lambda *args: ...)
        assert not v and "Replace `...`" in v.message


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setenv("GRAPHATTN_EXERCISES_STRICT", "1")
    with pytest.raises(AssertionError, match="the book's printed"):
        ex.check_book_softmax([0.67, 0.21, 0.12])
    assert ex.check_book_softmax(torch.softmax(torch.tensor([1.05, 0.2, -0.15]), 0))
