"""The errata: every number checked against an independent computation (numpy, or another code path)."""

import numpy as np
import pytest
import torch

from graphattn import cli
from graphattn.errata import errata, errata_lines

CLAIMS = [
    "softmax(2.1",
    "attention is a fully",
    "self-attention's score",
    "filling masked",
    "masking after",
    "the encoder",
    "the diagonal",
]


@pytest.fixture(scope="module")
def rows():
    return {r["claim"]: r for r in errata()}


def _row(rows, start):
    return next(r for claim, r in rows.items() if claim.startswith(start))


def _softmax(s, axis=-1):
    z = np.exp(s - s.max(axis, keepdims=True))
    return z / z.sum(axis, keepdims=True)


def test_seven_claims_without_a_model_each_quoted_and_measured(rows):
    assert len(rows) == 7 and [any(c.startswith(p) for c in rows) for p in CLAIMS] == [True] * 7
    assert all(r["measured"] and r["values"] for r in rows.values())


def test_worked_softmax_names_the_exp_and_normalise_step(rows):
    r = _row(rows, "softmax(2.1")
    s = np.array([2.1, 0.4, -0.3])
    assert "softmax(1.05, 0.2, -0.15)" in r["claim"] and "two thirds" in r["claim"]  # the division comes first
    np.testing.assert_allclose(s / 2, [1.05, 0.2, -0.15])  # the book's division is right
    right = _softmax(s / 2)
    np.testing.assert_allclose([r["values"][f"w{j}"] for j in range(3)], right, atol=1e-15)
    assert r["values"]["division_error"] < 1e-15 and r["values"]["book_error"] == pytest.approx(0.67 - right[0])
    assert f"{right[0]:.0%}" == "58%" and "58% from itself, not two thirds" in r["measured"]
    c = np.linspace(1, 3, 20001)  # every divisor that reproduces the book's printed weights to 0.01
    fit = c[np.abs(_softmax(s[None] / c[:, None]) - [0.67, 0.21, 0.12]).max(1) <= 0.01]
    assert r["values"]["fit_low"] == pytest.approx(fit.min(), abs=2e-4)
    assert r["values"]["fit_high"] == pytest.approx(fit.max(), abs=2e-4)
    assert f"{fit.min():.2f}-{fit.max():.2f}" == "1.39-1.48" and "1.39-1.48" in r["measured"]


def test_no_edge_has_a_parameter(rows):
    r = _row(rows, "attention is a fully")
    e = 8  # in-projection (3E x E, 3E), out-projection (E x E, E): no axis of length L
    assert r["values"]["parameters"] == 4 * e * e + 4 * e and r["values"]["tensors"] == 4
    assert abs(r["values"]["alpha_input_1"] - r["values"]["alpha_input_2"]) > 0.01


def test_square_diagnosis_and_kv_cache_step(rows):
    r = _row(rows, "self-attention's score")
    with pytest.raises(ValueError):  # numpy agrees: a width mismatch fails before any score exists
        np.ones((6, 4)) @ np.ones((6, 3)).T
    assert r["values"]["mismatch_raises"] == 1.0
    assert (r["values"]["step_rows"], r["values"]["step_cols"]) == (1.0, 6.0)
    gen = torch.Generator().manual_seed(0)  # the same draws, recomputed in numpy: full causal attention
    x = torch.randn(6, 4, generator=gen, dtype=torch.float64).numpy()
    w_q, w_k, w_v = (torch.randn(4, 4, generator=gen, dtype=torch.float64).numpy() for _ in range(3))
    s = (x @ w_q) @ (x @ w_k).T / 2
    full = _softmax(np.where(np.tril(np.ones((6, 6), bool)), s, -np.inf)) @ (x @ w_v)
    step = _softmax(s[-1]) @ (x @ w_v)  # the last query against every cached key
    np.testing.assert_allclose(step, full[-1], atol=1e-12)
    assert r["values"]["cache_diff"] < 1e-12


def test_very_negative_fill_on_a_fully_masked_row(rows):
    r = _row(rows, "filling masked")
    s = np.zeros(4) - 1e9  # every key masked with -1e9
    assert _softmax(s)[0] == 0.25 and r["values"]["full_row_weight"] == 0.25
    with np.errstate(invalid="ignore"):
        z = np.exp(np.full(4, -np.inf))
        assert np.isnan(z / z.sum()).all()  # -inf: 0 / 0
    assert r["values"]["inf_nan"] == 1.0 and r["values"]["partial_masked_max"] == 0.0
    assert r["values"]["graph_zero_row"] == 0.0


def test_mask_after_and_encoder(rows):
    mask = _row(rows, "masking after")["values"]
    assert mask["renormalise_diff"] < 1e-12 and mask["min_row_sum"] < 0.5 and mask["float16_nan"] == 1.0
    assert np.exp(np.float16(0.0 - 20.0)) == 0  # numpy agrees: exp(s_0 - max) underflows in float16, 0 / 0 follows
    enc = [m for m in torch.nn.TransformerEncoderLayer(4, 1).modules() if isinstance(m, torch.nn.MultiheadAttention)]
    assert _row(rows, "the encoder")["values"]["encoder_attentions"] == len(enc) == 1


def test_diagonal_free_mixed_tied_against_numpy(rows):
    v = _row(rows, "the diagonal")["values"]
    gen = torch.Generator().manual_seed(0)  # the same draws as errata, the softmax in numpy
    shares = np.zeros(3)
    for _ in range(200):
        x = torch.randn(16, 64, generator=gen, dtype=torch.float64).numpy()
        w_q, w_k = (torch.randn(64, 64, generator=gen, dtype=torch.float64).numpy() / 8 for _ in range(2))
        for n, w in enumerate((w_k, 0.7 * w_q + 0.3 * w_k, w_q)):
            shares[n] += np.diag(_softmax((x @ w_q) @ (x @ w).T / 8)).mean() / 200
    np.testing.assert_allclose(
        [v["random_self_weight"], v["mixed_self_weight"], v["tied_self_weight"]], shares, atol=1e-12
    )
    assert abs(shares[0] - 1 / 16) < 0.01 and shares[0] < shares[1] < shares[2]


def test_steps_prints_every_erratum(capsys, rows):
    assert cli.main(["steps"]) == 0
    out = capsys.readouterr().out
    for line in errata_lines(list(rows.values()))[1:]:
        assert line in out


@pytest.mark.slow
def test_minilm_errata_against_the_graph_attention_path():
    """The four model claims, recomputed on graphattn's own attention path (not the eager run errata uses)."""
    from pathlib import Path

    from graphattn import analysis
    from graphattn.errata import ERRATA_SENTENCE, OTHER_SENTENCE, errata_markdown
    from graphattn.interop.hf import load_minilm
    from graphattn.interop.records import attention_records

    all_rows = errata(model=True)
    assert len(all_rows) == 11
    smooth, cls, same, irrelevant = (r["values"] for r in all_rows[7:])
    model, tokenizer = load_minilm()
    rec, other = attention_records(model, tokenizer, [ERRATA_SENTENCE, OTHER_SENTENCE], hidden_states=True)
    sim = analysis.smoothing_per_layer(rec.hidden_states)
    assert smooth["first"] == pytest.approx(sim[0], abs=1e-4) and smooth["last"] == pytest.approx(sim[-1], abs=1e-4)
    dense = rec.dense()  # (layers, H, N, N)
    weight = (dense[1:5, ..., 0].sum((1, 2)) / dense[1:5].sum((1, 2, 3))).mean().item()
    assert cls["cls_weight_layers_1_4"] == pytest.approx(weight, abs=1e-4)
    last_row = dense[-1].mean(0)[0]  # (N,) what [CLS] reads in the last layer
    assert cls["cls_self"] == pytest.approx(last_row[0].item(), abs=1e-4)
    assert cls["row_tired"] == pytest.approx(last_row[rec.tokens.index("tired")].item(), abs=1e-4)
    n = dense.size(-1)
    share = [((a * (a < 1 / n)).sum() / a.sum()).item() for a in dense]
    assert irrelevant["below_uniform_min"] == pytest.approx(min(share), abs=1e-3)
    assert irrelevant["below_uniform_max"] == pytest.approx(max(share), abs=1e-3)
    attn = model.encoder.layer[0].attention.self  # layer 0's query and key, by hand from the embeddings
    i, j = rec.tokens.index("it"), rec.tokens.index("street")
    h1, h2 = rec.hidden_states[0], other.hidden_states[0]  # (N, F)
    with torch.no_grad():
        s1, s2 = ((attn.query(h[i]).view(12, -1) * attn.key(h[j]).view(12, -1)).sum(-1) for h in (h1, h2))
    assert same["layer0_score_diff"] == (s1 - s2).abs().max().item() == 0.0
    assert not torch.equal(rec.hidden_states[1][i], other.hidden_states[1][i]) and same["query_change_min"] > 0
    learn = (Path(__file__).resolve().parents[1] / "docs" / "learn.md").read_text()
    assert errata_markdown(all_rows) in learn, "regenerate the errata table of docs/learn.md with errata_markdown"
