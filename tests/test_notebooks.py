"""The notebooks: committed with outputs, in sync with their jupytext sources, and executed here.

Every claim in a notebook is followed by a cell that asserts it, so executing
a notebook is its test. The ``.py`` files in ``notebooks/`` (jupytext percent
format) are the sources; the ``.ipynb`` files are generated from them and
committed executed (see ``notebooks/README.md``).
"""

import re
from pathlib import Path

import jupytext  # the test extra installs these three: a missing one must fail, not skip
import nbclient
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SLOW = {"03_real_model.ipynb", "04_dense_vs_sparse.ipynb"}  # load the pretrained model
REPRODUCED = "02_message_passing.ipynb"  # executed twice and compared
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
PARAMS = [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.name in SLOW else []) for p in PATHS]


def _code(cells):
    return [c.source.strip() for c in cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", PARAMS)
def test_ends_with_exercises_and_checked_answers(path):
    nb = nbformat.read(path, as_version=4)
    heading = next(k for k, c in enumerate(nb.cells) if c.cell_type == "markdown" and "## Exercises" in c.source)
    answers = [c for c in nb.cells[heading:] if c.cell_type == "code"]
    assert answers and all("assert" in c.source for c in answers)


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
def test_executes(path):  # notebook 2 is executed (twice) by test_notebook_2_is_reproducible
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError, naming the failing cell, when an assert fails


def _outputs(nb):
    """The text a reader sees, cell by cell: streams, plain text, HTML (tables) and the PNG bytes."""
    seen = []
    for cell in nb.cells:
        outputs = cell.get("outputs", [])
        seen.append("".join(out.text for out in outputs if out.output_type == "stream"))  # chunking varies
        seen += [re.sub(r" at 0x[0-9a-f]+", "", out.data[key]) for out in outputs if "data" in out
                 for key in ("text/plain", "text/html", "image/png") if key in out.data]  # object addresses vary
    return seen


def test_notebook_2_is_reproducible():
    """Two fresh runs of notebook 2 print and draw the same things (it is seeded)."""
    path = NOTEBOOKS / REPRODUCED
    runs = []
    for _ in range(2):
        nb = nbformat.read(path, as_version=4)
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        runs.append(_outputs(nb))
    assert runs[0] == runs[1] and len(runs[0]) > 10
