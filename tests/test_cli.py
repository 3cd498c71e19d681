"""The command line and the README's promises about it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import graphattn
from graphattn import cli

ROOT = Path(__file__).resolve().parents[1]


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"graphattn {graphattn.__version__}"
    assert cli.main([]) == 0
    help_text = capsys.readouterr().out
    for command in cli.COMMANDS:
        assert command in help_text


def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "graphattn.cli", "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "prune" in result.stdout


def test_readme_starts_with_the_two_setup_commands_and_ci_runs_the_second():
    readme = (ROOT / "README.md").read_text()
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


def test_user_errors_become_one_line(monkeypatch, capsys, tmp_path):
    import types

    fake = types.ModuleType("graphattn_fake_command")
    fake.add_arguments = lambda parser: parser.add_argument("--out")
    fake.main = lambda args: open(args.out, "w")  # a directory: IsADirectoryError, an OSError
    monkeypatch.setitem(sys.modules, "graphattn_fake_command", fake)
    monkeypatch.setitem(cli.COMMANDS, "fake", ("graphattn_fake_command", "a test command"))
    monkeypatch.delenv("GRAPHATTN_TRACEBACK", raising=False)
    assert cli.main(["fake", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("graphattn fake: error: IsADirectoryError") and "\n" not in err
    monkeypatch.setenv("GRAPHATTN_TRACEBACK", "1")
    with pytest.raises(IsADirectoryError):
        cli.main(["fake", "--out", str(tmp_path)])


@pytest.mark.parametrize(
    "argv,message",
    [
        (["bench", "--patterns", "nope"], "subset of complete, window, random, topk"),
        (["bench", "--sizes", "0"], "expected a positive int (got '0')"),
        (["bench", "--repeats", "-1"], "expected a positive int"),
    ],
    ids=["pattern", "size", "repeats"],
)
def test_bench_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_rejects_a_device_it_cannot_use(capsys):
    assert cli.main(["bench", "--device", "nonsense"]) == 2
    assert "'--device'" in capsys.readouterr().err
