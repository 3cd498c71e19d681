"""Sphinx configuration of the graphattn documentation (``sphinx-build -W docs docs/_build/html``).

Pages are MyST markdown (``docs/*.md``), the API reference is generated from the numpydoc docstrings
(autosummary), and the notebooks are rendered from their stored outputs, never executed here (the test
suite executes them).
"""

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

import graphattn  # noqa: E402

project = "graphattn"
author = "the graphattn authors"
copyright = "2026, the graphattn authors"
release = version = graphattn.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_nb",
]

# --- the notebooks: copied next to the pages at build time, rendered with their stored outputs
NOTEBOOKS = DOCS / "notebooks"
NOTEBOOKS.mkdir(exist_ok=True)
for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
    target = NOTEBOOKS / notebook.name
    if not target.exists() or target.read_bytes() != notebook.read_bytes():
        shutil.copyfile(notebook, target)
nb_execution_mode = "off"
nb_output_stderr = "remove"

source_suffix = {
    ".rst": "restructuredtext",
    ".md": "myst-nb",
    ".ipynb": "myst-nb",
}  # .rst first: autosummary writes .rst
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints", "notebooks/*.py"]
templates_path = ["_templates"]

myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3

# --- API reference
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options: dict[str, bool] = {}  # members are listed by the autosummary templates
autodoc_typehints = "none"  # the numpydoc type lines carry the types, with shapes and defaults
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()

html_theme = "pydata_sphinx_theme"
html_title = f"graphattn {version}"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2, "header_links_before_dropdown": 3}
html_static_path: list[str] = []


def _summary_without_citations():
    """Autosummary tables show each docstring's first sentence; drop its ``[1]_`` citations there.

    The citation targets live in each object's own page (numpydoc renames them per page), so a
    citation in a table of another page would point nowhere.
    """
    import re

    from sphinx.ext import autosummary

    extract = autosummary.extract_summary

    def extract_summary(doc, document):
        return re.sub(r"\s*\[[\w-]+\]_", "", extract(doc, document))

    autosummary.extract_summary = extract_summary


_summary_without_citations()
