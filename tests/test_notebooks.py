"""The notebooks: committed with outputs, in sync with their jupytext sources, and executed here.

Every claim in a notebook is followed by a cell that asserts it, so executing
a notebook is its test. The ``.py`` files in ``notebooks/`` (jupytext percent
format) are the sources; the ``.ipynb`` files are generated from them and
committed executed (see ``notebooks/README.md``).
"""

from pathlib import Path

import jupytext  # the test extra installs these three: a missing one must fail, not skip
import nbclient
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SLOW = {"03_real_model.ipynb", "04_dense_vs_sparse.ipynb"}  # load the pretrained model
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
PARAMS = [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.name in SLOW else []) for p in PATHS]


def _code(cells):
    return [c.source.strip() for c in cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", PARAMS)
def test_committed_with_outputs_and_in_sync_with_source(path):
    nb = nbformat.read(path, as_version=4)
    source = jupytext.read(path.with_suffix(".py"))
    assert _code(nb.cells) == _code(source.cells), f"regenerate {path.name} from {path.stem}.py"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), f"{path.name} is committed unexecuted"
    assert not any(o.output_type == "error" for c in code for o in c.outputs)
    assert any(c.outputs for c in code)


@pytest.mark.parametrize("path", PARAMS)
def test_executes(path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError, naming the failing cell, when an assert fails
