"""The command line (the README's promises about it are checked in tests/test_repository.py)."""

import os
import shutil
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
    monkeypatch.delenv("GRAPHATTN_TRACEBACK")

    def interrupted(args):
        raise KeyboardInterrupt

    fake.main = interrupted
    assert cli.main(["fake"]) == 130
    assert capsys.readouterr().err == "graphattn fake: interrupted\n"
    from graphattn.prune.specs import parse_spec

    fake.main = lambda args: parse_spec("windw:8")  # a multi-line ValueError: its first line only
    assert cli.main(["fake"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphattn fake: error: Expected a pattern spec") and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv,message",
    [
        (["bench", "--patterns", "nope"], "subset of complete, window, random, topk (got 'nope')"),
        (["bench", "--sizes", "0"], "Expected '--sizes' to be an int in [1, 16777216] (got '0')"),
        (["bench", "--sizes", "1" + "0" * 40], "Expected '--sizes' to be an int in"),
        (["bench", "--repeats", "-1"], "Expected '--repeats' to be an int in [1, 10000] (got '-1')"),
        (["bench", "--memory-budget", "nan"], "Expected '--memory-budget' to be a number in (0, 1.04858e+06]"),
        (["bench", "--threads", "100000"], "Expected '--threads' to be an int in [1, "),
        (["prune", "--limit", "0"], "Expected '--limit' to be an int in [3, 100000] (got '0')"),
        (["prune", "--threads", "100000"], "Expected '--threads' to be an int in [1, "),
        (["prune", "--max-length", "99999999999999999999"], "Expected '--max-length' to be an int in [8, 100000]"),
        (["steps", "--length", "0"], "Expected '--length' to be an int in [1, 64] (got '0')"),
        (["explain", "a b", "--token", "a", "--layer", "-1"], "Expected '--layer' to be an int in [0, 1000000]"),
        (["prune", "--nope"], "unrecognized arguments: --nope"),
    ],
    ids=[
        "pattern",
        "size",
        "huge-size",
        "repeats",
        "nan-budget",
        "bench-threads",
        "limit0",
        "prune-threads",
        "huge-length",
        "steps-length",
        "explain-layer",
        "unknown-option",
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"graphattn {argv[0]}: error: ") and err.count("\n") == 1, err
    assert message in err


@pytest.mark.parametrize("device", ["nonsense", "meta", "cuda:7"])
def test_bench_refuses_a_device_it_cannot_use_before_measuring(device, capsys, monkeypatch):
    from graphattn.bench import suite as bench_run

    monkeypatch.setattr(bench_run, "matmul_gflops", lambda *a, **k: pytest.fail("measured before the check"))
    assert cli.main(["bench", "--device", device]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphattn bench: error: Expected '--device'") and err.count("\n") == 1, err


def test_commands_import_no_heavy_module_and_the_core_no_command():
    code = (
        "import sys; import graphattn, graphattn.prune, graphattn.interop, graphattn.steps; "
        "core = sorted(m for m in sys.modules if m.startswith(('graphattn.cli', 'graphattn.bench'))); "
        "import graphattn.cli as c; c.build_parser(); "
        "print(core, sorted(m for m in ('matplotlib',) if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] []"


@pytest.mark.parametrize(
    "command", [["bench"], ["prune"], ["explain", "a b", "--token", "a"]], ids=["bench", "prune", "explain"]
)
@pytest.mark.parametrize("where", ["under_a_file", "is_a_file"])
def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(
    command, where, tmp_path, capsys, monkeypatch
):
    """``--out`` under a file (or a file itself) used to fail with a raw OSError after the whole run."""
    from graphattn import bench, prune
    from graphattn.interop import explain

    for module, name in ((bench, "run"), (prune, "load_model"), (explain, "explain")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("ran before --out was checked"))
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    out = blocker / "out" if where == "under_a_file" else blocker
    assert cli.main(command + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"graphattn {command[0]}: error: Expected '--out' to be a folder") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # the probe left nothing behind


def test_prune_json_must_be_a_writable_file_path(tmp_path, capsys):
    assert cli.main(["prune", "--json", str(tmp_path)]) == 2
    assert "Expected '--json' to be a file path" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert cli.main(["prune", "--json", str(tmp_path / "file" / "x.json")]) == 2
    assert "Expected '--json' to be a file that can be created and written" in capsys.readouterr().err


def test_malloc_for_timing_names_the_argument():
    from graphattn.bench.worker import malloc_for_timing

    with pytest.raises(ValueError, match="'malloc'"):
        malloc_for_timing("tcmalloc")


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo") or shutil.which("lscpu") is None, reason="Linux with lscpu")
def test_cpu_summary_names_the_cpu_lscpu_names():
    from graphattn.bench.worker import cpu_summary

    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), None)
    if model is None:
        pytest.skip("lscpu names no model")
    summary = cpu_summary()
    assert summary.startswith(model)
    flags = open("/proc/cpuinfo").read()
    assert ("avx512f" in summary) == (" avx512f" in flags)


def test_a_closed_pipe_ends_quietly_with_141():
    """``graphattn steps | head``: the reader gone before the output is written ends the run as Unix tools end
    (no error message, 128 + SIGPIPE), not as a user error (it printed "error: BrokenPipeError", exit 2)."""
    read, write = os.pipe()
    os.close(read)  # the reader left first: every write fails with EPIPE
    try:
        result = subprocess.run(
            [sys.executable, "-m", "graphattn.cli", "steps"], stdout=write, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write)
    assert result.returncode == 141
    assert result.stderr == ""
