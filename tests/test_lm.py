"""graphattn.lm: data split, causality, equality with SDPA, FLOPs, resume, probes, the command's files."""

from __future__ import annotations

import csv
import json
import os

import pytest
import torch
import torch.nn.functional as F

from graphattn.lm import data, flops, probe, report
from graphattn.lm.experiment import make_runs, run_experiment
from graphattn.lm.model import ByteLM, CausalSelfAttention, LMConfig, attention_graph
from graphattn.lm.train import RunConfig, train_run

SPECS = ["dense", "causal", "window:4", "strided:4", "window:4|global:0+1", "bigbird:block=4,random=1", "random:3"]


@pytest.fixture(scope="module")
def corpus():
    return data.load_corpus(max_bytes=40_000)


def test_split_is_deterministic_disjoint_and_without_tests():
    files = data.stdlib_files()
    assert files == sorted(files) and len(files) > 100
    assert not any(part in ("test", "tests", "idle_test") for f in files for part in f.split("/")[:-1])
    assert not any(f.rsplit("/", 1)[-1].startswith("test_") for f in files)
    splits = [data.split_of(f) for f in files]
    assert splits == [data.split_of(f) for f in files]  # a fixed hash, not a random draw
    counts = {s: splits.count(s) for s in data.SPLITS}
    assert counts["val"] > 10 and counts["test"] > 10 and counts["train"] > 0.8 * len(files)
    c = data.load_corpus(max_bytes=30_000)
    seen = [set(c.files[s]) for s in data.SPLITS]
    assert not (seen[0] & seen[1]) and not (seen[0] & seen[2]) and not (seen[1] & seen[2])
    assert all(data.split_of(f) == s for s in data.SPLITS for f in c.files[s])
    assert c.sha256 == data.load_corpus(max_bytes=30_000).sha256
    assert all(0 < n <= 30_000 for n in c.sizes().values())


def test_batches_are_next_byte_pairs(corpus):
    x, y = data.sample_batch(corpus.train, 3, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (3, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="more than"):
        data.sample_batch(corpus.train[:10], 1, 16, torch.Generator())


def _tiny(spec, length=24, dtype=torch.float64):
    torch.manual_seed(0)
    return ByteLM(LMConfig(length=length, layers=2, d_model=8, heads=2, d_ff=16, pattern=spec)).to(dtype)


@pytest.mark.parametrize("spec", SPECS)
def test_every_pattern_run_is_causal(spec):
    model = _tiny(spec)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (2, 24), generator=g)
    base = model(x)  # (2, 24, 256)
    for t in (0, 7, 16):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randint(0, 256, (2, 23 - t), generator=g)
        out = model(changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-12)
        assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :])  # the future does change the future


@pytest.mark.parametrize("spec", SPECS[1:])
def test_pattern_attention_equals_sdpa_with_its_mask(spec):
    L, B, H, D = 19, 3, 2, 4
    torch.manual_seed(2)
    config = LMConfig(length=L, d_model=H * D, heads=H, d_ff=8, pattern=spec)
    graph = attention_graph(spec)
    layer = CausalSelfAttention(config, graph).double()
    x = torch.randn(B, L, H * D, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    mask = graph.mask(L) & torch.ones(L, L, dtype=torch.bool).tril()  # (L, S), True = may attend
    q, k, v = layer.qkv(x).view(B, L, 3, H, D).unbind(2)  # 3 x (B, L, H, D)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    ref = layer.proj(ref.transpose(1, 2).reshape(B, L, H * D))  # (B, L, C)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    g_out = torch.autograd.grad(out.square().sum(), [x, layer.qkv.weight])
    g_ref = torch.autograd.grad(ref.square().sum(), [x, layer.qkv.weight])
    for a, b in zip(g_out, g_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_dense_and_graphattn_causal_agree():
    x = torch.randint(0, 256, (2, 24))
    torch.testing.assert_close(_tiny("dense")(x), _tiny("causal")(x), rtol=0, atol=1e-10)


def test_bad_spec_is_refused_at_construction():
    with pytest.raises(ValueError, match="nope"):
        ByteLM(LMConfig(length=8, layers=1, d_model=4, heads=2, d_ff=8, pattern="nope:3"))
    with pytest.raises(ValueError, match="d_model"):
        LMConfig(d_model=10, heads=3)


def test_flops_against_a_hand_count():
    config = LMConfig(length=3, layers=1, d_model=4, heads=2, d_ff=8, pattern="dense")
    # weights per token: qkv 4*12 + out 4*4 + mlp 4*8 + 8*4 + head 4*256 = 1152 multiply-adds, x 2 FLOPs x 3 tokens
    # attention: 6 causal edges x 2 heads x (2 + 2 multiply-adds per channel of D = 2) -> 6 * 2 * 2 * 2 * 2 = 96
    assert flops.forward_flops(config) == {"attention": 96, "other": 6912, "total": 7008}
    assert flops.training_flops(config, sequences=2) == {"attention": 576, "other": 41472, "total": 42048}
    window = LMConfig(length=3, layers=1, d_model=4, heads=2, d_ff=8, pattern="window:1")
    assert flops.num_edges("window:1", 3) == 5  # (0,0) (0,1) (1,1) (1,2) (2,2)
    assert flops.forward_flops(window)["attention"] == 80
    for spec in SPECS[1:]:
        assert flops.num_edges(spec, 50) == int(attention_graph(spec).mask(50).tril().sum())


def _run(steps, **kw):
    model = LMConfig(length=16, layers=1, d_model=8, heads=2, d_ff=16, pattern=kw.pop("pattern", "window:4"))
    return RunConfig(
        model=model,
        seed=3,
        batch=2,
        lr=1e-2,
        warmup=2,
        steps=steps,
        evals=3,
        eval_windows=2,
        probe_windows=2,
        ckpt_every=100,
        **kw,
    )


def test_resume_after_interruption_equals_an_uninterrupted_run(tmp_path, corpus):
    run = _run(7)
    whole = train_run(run, corpus, str(tmp_path / "a"), progress=False)
    assert train_run(run, corpus, str(tmp_path / "b"), max_new_steps=3, progress=False) is None
    assert not os.path.exists(tmp_path / "b" / "runs" / run.name / "result.json")
    resumed = train_run(run, corpus, str(tmp_path / "b"), progress=False)
    a, b = (torch.load(tmp_path / d / "runs" / run.name / "ckpt.pt", weights_only=False) for d in "ab")
    assert a["state"]["step"] == b["state"]["step"] == 7
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for s in a["optimizer"]["state"]:
        assert torch.equal(a["optimizer"]["state"][s]["exp_avg_sq"], b["optimizer"]["state"][s]["exp_avg_sq"])
    assert [e["val_bpb"] for e in whole["log"]] == [e["val_bpb"] for e in resumed["log"]]
    assert whole["test_bpb"] == resumed["test_bpb"]
    # a finished configuration is skipped: the rerun returns its result without training
    mtime = os.path.getmtime(tmp_path / "b" / "runs" / run.name / "ckpt.pt")
    again = train_run(run, corpus, str(tmp_path / "b"), progress=False)
    assert again["test_bpb"] == resumed["test_bpb"]
    assert os.path.getmtime(tmp_path / "b" / "runs" / run.name / "ckpt.pt") == mtime


def test_repeat_distances_known_answer():
    seq = list(b"abcabcabxab")  # grams at t = 1..9: abc bca cab abc bca cab abx bxa xab
    x, y = torch.tensor([seq[:-1]]), torch.tensor([seq[1:]])
    dist = probe.repeat_distances(x, y, ngram=2)  # (1, 10): gram = x[t-1], x[t], y[t]
    assert dist.tolist() == [[0, 0, 0, 0, 3, 3, 3, 0, 0, 0]]  # t = 4, 5, 6 repeat t = 1, 2, 3
    seg, distances = probe.copy_distances(2048)
    assert seg == 32 and distances == [256, 512, 1024, 2015]


def test_compare_pairs_seeds_at_equal_budgets():
    def row(pattern, seed, bpbs, seconds):
        log = [{"tokens": 100 * (k + 1), "train_seconds": seconds * (k + 1), "val_bpb": v} for k, v in enumerate(bpbs)]
        return {"pattern": pattern, "length": 8, "seed": seed, "log": log}

    rows = [
        row("dense", 0, [5, 4], 2.0),
        row("w", 0, [5.5, 4.5, 4.0, 3.0], 1.0),
        row("dense", 1, [6, 5], 2.0),
        row("w", 1, [6.5, 5.5, 5.0, 4.0], 1.0),
    ]
    comp = {c["basis"]: c for c in report.compare(rows)}
    tokens, wall = comp["equal tokens"], comp["equal wall time"]
    assert tokens["at"] == 200 and tokens["delta"] == pytest.approx(0.5) and tokens["seeds"] == 2
    assert wall["at"] == 4.0 and wall["delta"] == pytest.approx(-1.0)
    assert tokens["lo"] == pytest.approx(0.5) and tokens["hi"] == pytest.approx(0.5)  # no spread over seeds


@pytest.mark.slow
def test_smoke_sized_experiment_writes_its_files(tmp_path, corpus):
    runs = make_runs("smoke", lengths=[32], steps=20, patterns=["dense", "window:4"], seeds=[0, 1])
    _, paths = run_experiment(
        runs, str(tmp_path), corpus=corpus, progress=False, log=lambda *a: None, meta={"preset": "test"}
    )
    assert set(paths) == {"csv", "json", "png"} and all(os.path.getsize(p) > 0 for p in paths.values())
    with open(paths["csv"]) as fh:
        rows = list(csv.DictReader(fh))
    assert [r["pattern"] for r in rows] == ["dense", "window:4"] * 2
    assert all(float(r["val_bpb"]) < 8.0 and float(r["flops"]) > float(r["attn_flops"]) > 0 for r in rows)
    with open(paths["json"]) as fh:
        out = json.load(fh)
    assert {"versions", "git_commit", "corpus_sha256", "seeds", "preset"} <= set(out["meta"])
    assert out["meta"]["seeds"] == [0, 1] and len(out["runs"][0]["position_bpb"]) == 32
    assert {c["basis"] for c in out["comparisons"]} == {"equal tokens", "equal wall time"}
    assert all(c["seeds"] == 2 for c in out["comparisons"])


@pytest.mark.slow
def test_command_smoke_preset_small(tmp_path, capsys):
    from graphattn.cli import main

    code = main(
        [
            "lm",
            "--preset",
            "smoke",
            "--steps",
            "5",
            "--lengths",
            "32",
            "--patterns",
            "dense",
            "window:4",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 0
    assert {"lm.csv", "lm.json", "lm.png", "runs"} <= set(os.listdir(tmp_path))
    assert "equal wall time" in capsys.readouterr().out
    assert main(["lm", "--patterns", "nope:1", "--out", str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["lm", "--device", "cuda", "--out", str(tmp_path)]) == 2
        assert "Expected '--device'" in capsys.readouterr().err


def test_presets_make_the_documented_grids():
    smoke, default, full = (make_runs(p) for p in ("smoke", "default", "full"))
    assert [r.model.pattern for r in smoke] == ["dense", "causal", "window:16"] and smoke[0].steps == 100
    assert [r.model.pattern for r in default] == ["dense", "window:128", "strided:64", "window:128|global:0+1+2+3"]
    assert {r.model.length for r in default} == {2048} and default[0].seconds == 110.0
    assert len(full) == 36 and {r.model.length for r in full} == {1024, 2048, 4096}
    assert len({r.name for r in full}) == 36  # one folder per configuration
    over = make_runs("default", steps=5, lengths=[64])
    assert over[0].steps == 5 and over[0].seconds is None and over[0].model.length == 64
    with pytest.raises(ValueError, match="preset"):
        make_runs("huge")
    with pytest.raises(ValueError, match="nope"):
        make_runs("smoke", patterns=["nope:2"])


@pytest.mark.slow
def test_two_processes_with_torchrun_gloo(tmp_path):
    """Data parallel on CPU: 2 processes (gloo), rank 0 writes, tokens count both processes."""
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "graphattn.cli",
        "lm",
        "--steps",
        "2",
        "--lengths",
        "16",
        "--batch",
        "2",
        "--patterns",
        "dense",
        "window:4",
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    with open(tmp_path / "lm.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["world"]) for r in rows] == [2, 2]
    assert [int(r["tokens"]) for r in rows] == [2 * 2 * 16 * 2] * 2  # steps x batch x L x processes
