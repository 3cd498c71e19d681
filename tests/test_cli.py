"""The command line (the README's promises about it are checked in tests/test_repository.py)."""

import subprocess
import sys

import pytest

import graphattn
from graphattn import cli


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
