"""Checks of the repository itself, not of the library: layering, module size, the README's promises.

- the layers contract in ``pyproject.toml`` holds (``lint-imports``);
- no module of the package is longer than about 400 lines (``MAX_LINES``);
- ``import graphattn`` loads nothing heavy (transformers, matplotlib, pandas);
- the README starts with its two set-up commands, CI runs the second, and
  every path its layout table names exists;
- there are eight notebooks, numbered 01 to 08.
"""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "graphattn"
MAX_LINES = 500  # "about 400 lines" of compact code (docs/style.md); `ruff format` puts one argument a line


def _env() -> dict:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_the_layers_contract_holds():
    """``lint-imports`` (the venv's own executable) finds no import against the layers of pyproject.toml."""
    executable = Path(sys.executable).parent / "lint-imports"
    if not executable.exists():
        pytest.fail(f"lint-imports is missing next to {sys.executable}: pip install -e '.[test]'")
    result = subprocess.run(
        [str(executable), "--no-cache"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_are_short(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES}): split it by concept"


def test_import_graphattn_loads_nothing_heavy():
    code = (
        "import graphattn, sys; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'transformers', 'matplotlib', 'pandas'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_starts_with_the_two_setup_commands_and_ci_runs_the_second():
    readme = _readme()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    first_heading = readme.index("\n## ")
    assert readme.index(blocks[1]) < first_heading  # both commands come before any section
    assert blocks[0].endswith("graphattn prune")
    assert blocks[1].endswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = blocks[1].split("&&")[-1].strip()
    assert ci.strip().splitlines()[-1] == test_command
    for step in blocks[1].split("&&")[:-1]:
        step = step.strip()
        if step.startswith("pip install") or step.startswith("python3 -m venv"):
            assert step in ci, step


def test_readme_setup_commands_name_what_exists():
    """The extras the two commands install and the console script they run are declared in pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    blocks = re.findall(r"```bash\n(.*?)\n```", _readme(), flags=re.S)[:2]
    for block in blocks:
        for extra in re.findall(r"pip install -e '\.\[([a-z,]+)\]'", block):
            for name in extra.split(","):
                assert name in project["optional-dependencies"], f"extra [{name}] of {block!r}"
    assert blocks[0].split("&&")[-1].split()[0] in project["scripts"]
    module = ROOT / Path(*project["scripts"]["graphattn"].partition(":")[0].split("."))
    assert module.with_suffix(".py").exists() or (module / "__init__.py").exists(), module


def _layout_paths() -> list[str]:
    """Every path in the first column of the README's Layout table (bare names resolve next to the previous path)."""
    section = _readme().split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    paths = []
    for row in section.splitlines():
        if not row.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([^`]+)`", row.split("|")[1]):
            if "/" in name.rstrip("/"):
                folder = str(Path(name).parent)
                paths.append(name)
            else:
                paths.append(f"{folder}/{name}" if folder and not name.endswith("/") else name)
    return paths


def test_readme_layout_table_names_existing_paths():
    paths = _layout_paths()
    assert len(paths) >= 10
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"the README's layout table names paths that do not exist: {missing}"


def test_there_are_eight_notebooks():
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert [p.stem[:2] for p in notebooks] == ["01", "02", "03", "04", "05", "06", "07", "08"]


def test_version_is_written_once_and_the_changelog_names_it():
    """``graphattn.__version__`` is the version pyproject reads; CHANGELOG.md's top entry is that version."""
    import graphattn

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "graphattn.__version__"}
    top = re.search(r"^## \[(\d+\.\d+\.\d+)\]", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert top and top.group(1) == graphattn.__version__


def test_python_floor_is_what_the_code_needs():
    """``requires-python`` admits no version older than the one the tests run on needs (``tomllib``: 3.11)."""
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert floor == ">=3.11" and sys.version_info >= (3, 11)
