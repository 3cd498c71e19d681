"""Metrics on hand-made cases with known values."""

import math

import pytest
import torch

from graphattn.prune import metrics


def test_keep_everything_gives_mass_one_kl_zero_cosine_one():
    scores = torch.randn(3, 5, 7, dtype=torch.float64)
    weights = scores.softmax(-1)
    keep = torch.ones_like(scores, dtype=torch.bool)
    torch.testing.assert_close(metrics.attention_mass(weights, keep), torch.ones(3, 5, dtype=torch.float64))
    assert metrics.kl_sparse_dense(scores, keep).abs().max() < 1e-12
    x = torch.randn(4, 6)
    torch.testing.assert_close(metrics.cosine_similarity(x, x), torch.ones(4))
    assert metrics.relative_error(x, x) == 0.0


def test_hand_computed_mass_and_kl():
    # scores log(1), log(2), log(3), log(4): p = (1, 2, 3, 4) / 10; keep keys 1 and 3
    scores = torch.tensor([[0.0, math.log(2), math.log(3), math.log(4)]], dtype=torch.float64)
    keep = torch.tensor([[False, True, False, True]])
    mass = metrics.attention_mass(scores.softmax(-1), keep)
    assert mass.item() == pytest.approx(0.6, abs=1e-15)
    # q = (2, 4) / 6; KL = 1/3 log((1/3)/(2/10)) + 2/3 log((2/3)/(4/10)) = log(10/6)
    assert metrics.kl_sparse_dense(scores, keep).item() == pytest.approx(math.log(10 / 6), abs=1e-14)


def test_kl_equals_minus_log_mass_and_is_inf_for_empty_queries():
    scores = torch.randn(2, 6, 6, dtype=torch.float64)
    keep = torch.rand(2, 6, 6) < 0.5
    keep[0, 0] = False  # a query with no kept key
    keep[1, 1] = True
    kl = metrics.kl_sparse_dense(scores, keep)
    mass = metrics.attention_mass(scores.softmax(-1), keep)
    assert torch.isinf(kl[0, 0]) and kl[0, 0] > 0
    nonempty = keep.any(-1)
    torch.testing.assert_close(kl[nonempty], -mass[nonempty].log(), atol=1e-12, rtol=0)


def test_kl_with_valid_graph_and_bad_keep():
    scores = torch.zeros(1, 4)
    valid = torch.tensor([[True, True, True, False]])  # padding key 3 is not a node
    keep = torch.tensor([[True, False, False, False]])
    assert metrics.kl_sparse_dense(scores, keep, valid).item() == pytest.approx(math.log(3), abs=1e-6)
    with pytest.raises(ValueError, match="inside 'valid'"):
        metrics.kl_sparse_dense(scores, torch.tensor([[False, False, False, True]]), valid)
    with pytest.raises(ValueError, match="to have the shape of"):
        metrics.attention_mass(torch.zeros(2, 3), torch.ones(3, 2, dtype=torch.bool))


def test_relative_error_hand_case():
    assert metrics.relative_error(torch.tensor([3.0, 0.0]), torch.tensor([3.0, 4.0])) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="nonzero"):
        metrics.relative_error(torch.ones(2), torch.zeros(2))


def _unit(degrees):
    rad = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([rad.cos(), rad.sin()], dim=1)  # (N, 2)


def test_retrieval_fidelity_hand_case():
    # reference at 0, 10, 90 degrees: pair similarities (0,1) > (1,2) > (0,2), ranks (3, 1, 2);
    # sparse at 0, 90, 100 degrees: (1,2) > (0,1) > (0,2), ranks (2, 1, 3);
    # Spearman = 1 - 6 * (1 + 0 + 1) / (3 * (9 - 1)) = 0.5; nearest neighbours 1,0,1 vs 1,2,1 -> 2/3
    rho, top1 = metrics.retrieval_fidelity(_unit([0, 10, 90]), _unit([0, 90, 100]))
    assert rho == pytest.approx(0.5)
    assert top1 == pytest.approx(2 / 3)
    x = torch.randn(5, 3)
    assert metrics.retrieval_fidelity(x, x) == pytest.approx((1.0, 1.0))
    with pytest.raises(ValueError, match="at least 3"):
        metrics.retrieval_fidelity(x[:2], x[:2])


def test_attention_flops_counts_four_d_per_edge_and_head():
    # window_1_1 on 4 tokens: 10 edges, 2 heads, D = 8: scores 2 * 10 * 2 * 8 + aggregation the same
    assert metrics.attention_flops(10 * 2, 8) == 640


def test_retrieval_fidelity_is_tie_robust_for_a_repeated_passage():
    # passages 0 and 1 are the same text: for passage 2 both are nearest; the sparse run picks the other one
    ref = _unit([0, 0, 5, 90])
    sparse = _unit([0.0, 0.0, 5.0, 90.0])
    sparse[1] += 1e-9  # float noise decides the argmax differently
    rho, top1 = metrics.retrieval_fidelity(ref, sparse)
    assert top1 == 1.0  # (Spearman is not tie-robust: which is why the experiment drops exact repeats first)
    rho, top1 = metrics.retrieval_fidelity(ref, _unit([0, 60, 5, 90]))  # a real change still counts
    assert top1 < 1.0


def test_score_flops_are_half_the_attention_flops():
    assert metrics.score_flops(10, 8) == 2 * 10 * 8 == metrics.attention_flops(10, 8) // 2


def test_task_metrics_by_ranx_match_a_hand_ranking():
    import numpy as np

    from graphattn.prune import tasks

    rng = np.random.default_rng(0)
    q, d = rng.normal(size=(7, 5)), rng.normal(size=(11, 5))
    relevant = [[0], [1, 2], [3], [4, 9], [5], [6], [10]]
    task = tasks.Task("t", ["q"] * 7, ["d"] * 11, relevant)
    got = tasks.evaluate(task, q, d)
    sims = q @ d.T
    for i, rel in enumerate(relevant):
        order = list(np.argsort(-sims[i]))  # no ties with continuous random scores
        ranks = sorted(order.index(j) + 1 for j in rel)
        dcg = sum(1 / math.log2(r + 1) for r in ranks if r <= 10)
        ideal = sum(1 / math.log2(r + 1) for r in range(1, len(rel) + 1))
        assert got["R@1"][i] == float(ranks[0] == 1)
        assert got["MRR"][i] == pytest.approx(1 / ranks[0])
        assert got["nDCG@10"][i] == pytest.approx(dcg / ideal)


def test_paired_ci_matches_a_plain_bootstrap_of_the_differences():
    import numpy as np

    from graphattn.prune import tasks

    rng = np.random.default_rng(1)
    a = rng.random(60)
    b = a - 0.1 + 0.2 * rng.random(60)
    mean, lo, hi = tasks.paired_ci(a, b, seed=3, resamples=4000)
    diff = b - a
    draws = rng.integers(0, 60, size=(20000, 60))
    plain = diff[draws].mean(1)  # resample the queries, both models together
    assert mean == pytest.approx(diff.mean())
    assert lo == pytest.approx(np.percentile(plain, 2.5), abs=0.01)
    assert hi == pytest.approx(np.percentile(plain, 97.5), abs=0.01)
    assert tasks.paired_ci(a, a) == (0.0, 0.0, 0.0)  # nothing to resample
