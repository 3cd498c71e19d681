"""Every reference to the design and style documents resolves to a tracked file.

The design (``docs/design.md``) and the style (``docs/style.md``) live in the repository; code,
tests, ``pyproject.toml`` and the documentation cite them by path. A reference to a file that is
not there (or to the old untracked ``DESIGN.md`` / ``STYLE.md``) fails here.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    [
        *ROOT.joinpath("graphattn").rglob("*.py"),
        *ROOT.joinpath("tests").rglob("*.py"),
        *ROOT.joinpath("docs").glob("*.md"),
        ROOT / "pyproject.toml",
        ROOT / "README.md",
    ]
)


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_reference_to_an_untracked_design_file(path):
    if path == Path(__file__):
        return
    stale = re.findall(r"(?<![\w/])(?:DESIGN|STYLE)\.md", _text(path))
    assert not stale, f"{path.relative_to(ROOT)} cites {stale}: cite docs/design.md or docs/style.md"


# Pages the README may link before they are merged from another branch (none at present).
PENDING: set[str] = set()


def test_every_docs_reference_resolves():
    missing = []
    for path in SOURCES:
        for name in re.findall(r"docs/[\w./-]+\.md", _text(path)):
            if not (ROOT / name).is_file() and name not in PENDING:
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, missing


def test_docs_links_between_pages_resolve():
    """Relative markdown links inside docs/ (``[style.md](style.md)``) name files that exist; a link into
    ``notebooks/`` names a notebook of the top-level folder (docs/conf.py copies it there for the site)."""
    missing = []
    for page in ROOT.joinpath("docs").glob("*.md"):
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", _text(page)):
            if not (page.parent / target).exists() and not (ROOT / target).exists():
                missing.append(f"{page.name}: {target}")
    assert not missing, missing


def test_the_design_names_every_layer_of_the_contract():
    """Each package in the import-linter layers appears in docs/design.md's layering."""
    import tomllib

    config = tomllib.loads(_text(ROOT / "pyproject.toml"))["tool"]["importlinter"]["contracts"]
    layers = next(c for c in config if c["type"] == "layers")["layers"]
    design = _text(ROOT / "docs" / "design.md")
    names = [name.strip().removeprefix("graphattn.") for layer in layers for name in layer.split("|")]
    absent = [name for name in names if name not in design]
    assert not absent, f"docs/design.md does not mention the layers {absent}"
