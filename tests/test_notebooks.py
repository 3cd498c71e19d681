"""The notebooks: committed with outputs, in sync with their jupytext sources, and executed here.

Every claim in a notebook is followed by a cell that asserts it, so executing
a notebook is its test. The ``.py`` files in ``notebooks/`` (jupytext percent
format) are the sources; the ``.ipynb`` files are generated from them and
committed executed (see ``notebooks/README.md``). Each notebook ends with
exercises: stub lines (``answer = ...  # your code``) checked by
``graphattn.exercises``; here every notebook runs with the solutions of
``notebooks/solutions/`` filled in, the checkers strict (a wrong answer raises).
"""

import re
from pathlib import Path

import jupytext  # the test extra installs these three: a missing one must fail, not skip
import nbclient
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SLOW = {
    "03_real_model.ipynb",
    "04_dense_vs_sparse.ipynb",  # load the pretrained model
    "06_graph_transformers.ipynb",
    "08_transformer_block.ipynb",
}  # train over seeds (tens of seconds)
REPRODUCED = "02_message_passing.ipynb"  # executed twice and compared
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
PARAMS = [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.name in SLOW else []) for p in PATHS]


STUB = re.compile(r"^(\s*)(?:(\w+) = |return )\.\.\.  # your code.*$", re.M)


def _code(cells):
    return [c.source.strip() for c in cells if c.cell_type == "code"]


def _solutions(path):
    """The solution cells of ``notebooks/solutions/<name>.py``, in order: [(name, code)]."""
    text = (NOTEBOOKS / "solutions" / path.with_suffix(".py").name).read_text()
    cells = re.split(r"^# %% (\w+)\n", text, flags=re.M)[1:]
    return [(name, code.rstrip()) for name, code in zip(cells[::2], cells[1::2])]


def _stub_name(source, match):
    """The name a stub defines: its assignment target, or the function its ``return ...`` is in."""
    if match.group(2):
        return match.group(2)
    return re.findall(r"def (\w+)\(", source[: match.start()])[-1]


def _filled(nb, path):
    """``nb`` with every stub line replaced by its solution (names must match, in order)."""
    solutions = iter(_solutions(path))
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        while (m := STUB.search(cell.source)) is not None:
            name, code = next(solutions)
            assert name == _stub_name(cell.source, m), f"{path.name}: solution {name} for stub {m.group(0)!r}"
            cell.source = cell.source[: m.start()] + code + cell.source[m.end() :]
    assert next(solutions, None) is None, f"{path.name}: more solutions than stubs"
    return nb


@pytest.mark.parametrize("path", PARAMS)
def test_ends_with_exercises_a_learner_fills(path):
    nb = nbformat.read(path, as_version=4)
    heading = next(k for k, c in enumerate(nb.cells) if c.cell_type == "markdown" and "## Exercises" in c.source)
    cells = [c.source for c in nb.cells[heading:] if c.cell_type == "code"]
    assert cells and all(STUB.search(c) and "check_" in c for c in cells)
    assert len(_solutions(path)) == sum(len(STUB.findall(c)) for c in cells) >= 2
    assert not any(STUB.search(c.source) for c in nb.cells[:heading] if c.cell_type == "code")
    stub_outputs = [
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells[heading:]
        if c.cell_type == "code"
        for o in c.outputs
    ]
    assert any("Replace `...`" in o for o in stub_outputs), "the committed stubs show the checker's prompt"


@pytest.mark.parametrize("path", PARAMS)
def test_committed_with_outputs_and_in_sync_with_source(path):
    nb = nbformat.read(path, as_version=4)
    source = jupytext.read(path.with_suffix(".py"))
    assert _code(nb.cells) == _code(source.cells), f"regenerate {path.name} from {path.stem}.py"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), f"{path.name} is committed unexecuted"
    assert not any(o.output_type == "error" for c in code for o in c.outputs)
    assert any(c.outputs for c in code)


@pytest.mark.parametrize("path", [p for p in PARAMS if p.values[0].name != REPRODUCED])
def test_executes_with_the_solutions_filled_in(path, monkeypatch):  # notebook 2: test_notebook_2_is_reproducible
    monkeypatch.setenv("GRAPHATTN_EXERCISES_STRICT", "1")  # the kernel inherits it: a wrong answer raises
    nb = _filled(nbformat.read(path, as_version=4), path)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError, naming the failing cell, when an assert or a checker fails
    outputs = "".join(
        str(o.get("data", {}).get("text/plain", "")) for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    assert "Not yet." not in outputs and "Right." in outputs


def _outputs(nb):
    """The text a reader sees, cell by cell: streams, plain text, HTML (tables) and the PNG bytes."""
    seen = []
    for cell in nb.cells:
        outputs = cell.get("outputs", [])
        seen.append("".join(out.text for out in outputs if out.output_type == "stream"))  # chunking varies
        seen += [
            re.sub(r" at 0x[0-9a-f]+", "", out.data[key])
            for out in outputs
            if "data" in out
            for key in ("text/plain", "text/html", "image/png")
            if key in out.data
        ]  # object addresses vary
    return seen


def test_notebook_2_is_reproducible(monkeypatch):
    """Two fresh runs of notebook 2, solutions filled in, print and draw the same things (it is seeded)."""
    monkeypatch.setenv("GRAPHATTN_EXERCISES_STRICT", "1")
    path = NOTEBOOKS / REPRODUCED
    runs = []
    for _ in range(2):
        nb = _filled(nbformat.read(path, as_version=4), path)
        nbclient.NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
        ).execute()
        runs.append(_outputs(nb))
    assert runs[0] == runs[1] and len(runs[0]) > 10
