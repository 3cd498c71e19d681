"""The examples, run as scripts with small arguments; their printed results are checked."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script, *args, cwd=None):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300
    )
    return result.returncode, result.stdout, result.stderr


def test_karate_club_trains_and_reports_accuracy():
    rc, out, err = _run("karate_club.py", "--epochs", 30, "--seeds", 2, "--features", "pe", "--quiet")
    assert rc == 0, err
    assert "34 nodes, 156 directed edges + 34 self-loops" in out
    accs = [float(a) for a in re.findall(r"seed \d: test accuracy (\d\.\d+)", out)]
    assert len(accs) == 2 and all(0.0 <= a <= 1.0 for a in accs)
    mean = float(re.search(r"mean test accuracy over 2 seeds: (\d\.\d+)", out).group(1))
    assert mean == pytest.approx(sum(accs) / 2, abs=1e-3)
    rc, _, err = _run("karate_club.py", "--epochs", 0)
    assert rc == 2 and "Expected" in err


def test_mha_drop_in_is_exact_then_sparse():
    rc, out, err = _run("mha_drop_in.py", "--batch", 3, "--max-len", 7, "--window", 1)
    assert rc == 0, err
    diff = float(re.search(r"on real tokens: (\S+)", out).group(1))
    assert diff < 1e-5
    lengths = [int(n) for n in re.search(r"lengths \[([\d, ]+)\]", out).group(1).split(",")]
    edges, dense = (int(n) for n in re.search(r"(\d+) of (\d+) edges", out).groups())
    assert dense == sum(n * n for n in lengths)
    assert edges == sum(3 * n - 2 for n in lengths)  # window(1, 1): 3 keys per query, 2 at the ends


@pytest.mark.slow
def test_export_graphml_round_trip(tmp_path):
    nx = pytest.importorskip("networkx")
    rc, out, err = _run("export_graphml.py", "The cat sat on the mat.", "--out", tmp_path / "g")
    assert rc == 0, err
    files = sorted((tmp_path / "g").glob("*.graphml"))
    assert [f.name for f in files] == [f"layer{k}.graphml" for k in range(6)]
    graph = nx.read_graphml(files[-1], node_type=int)
    tokens = [graph.nodes[k]["token"] for k in range(graph.number_of_nodes())]
    assert tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert graph.number_of_edges() == 81
    for i in graph.nodes:
        assert sum(w for _, _, w in graph.in_edges(i, data="weight")) == pytest.approx(1.0, abs=1e-5)
    assert "layer 5: 81 edges" in out


@pytest.mark.slow
def test_prune_my_text(tmp_path):
    from pydoc_data.topics import topics

    prose = [
        next(p for p in topics[key].split("\n\n") if len(p.split()) >= 8)
        for key in ("assert", "break", "continue", "pass")
    ]
    lines = [" ".join(p.split())[:300] for p in prose]  # prose paragraphs: grammar lines are dropped as too short
    text = tmp_path / "mine.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    main_job = tmp_path / "prune-out"  # graphattn prune's default folder, holding another experiment's results
    main_job.mkdir()
    (main_job / "prune.csv").write_text("the main job's results\n")
    rc, out, err = _run(
        "prune_my_text.py", text, "--patterns", "window:2", "--limit", 4, "--max-length", 32, cwd=tmp_path
    )  # the default --out
    assert rc == 0, err
    assert "oracle(window_2_2)" in out and "PASS" in out
    assert {p.name for p in (tmp_path / "prune-my-text-out").iterdir()} == {"prune.csv", "prune.json", "prune.png"}
    assert [p.name for p in main_job.iterdir()] == ["prune.csv"]  # never touched
    assert (main_job / "prune.csv").read_text() == "the main job's results\n"
    rc, _, err = _run("prune_my_text.py", tmp_path / "missing.txt")
    assert rc == 2 and "missing.txt" in err
