"""Shared test configuration: one tolerance table, seeds, and the offline switch."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

# Exactness targets (docs/design.md): float64 to 1e-10, float32 to the noise floor on unit-scale data.
# Half precisions, on unit-scale data against a float32/float64 reference: about one unit in the
# last place at 1.0 (float16 eps = 2**-10 ~ 9.8e-4, bfloat16 eps = 2**-7 ~ 7.8e-3), with rtol for
# bfloat16 at torch.testing's own default (1.6e-2) since its 8-bit mantissa rounds every product.
TOL = {
    torch.float64: dict(atol=1e-10, rtol=0.0),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=1e-3, rtol=1e-3),
    torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2),
}

DTYPES = [pytest.param(torch.float64, id="float64"), pytest.param(torch.float32, id="float32")]


def assert_close(actual, expected, dtype=None, **override):
    """``torch.testing.assert_close`` with the tolerance of ``dtype`` (default: ``expected.dtype``)."""
    tol = dict(TOL[dtype or expected.dtype])
    tol.update(override)
    torch.testing.assert_close(actual, expected, **tol)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """torch at one thread for the test (where the layers project heads innermost), the count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def counted(monkeypatch):
    """How many times each fused kernel family was asked for: {"heads_last": n, "rows": n}."""
    from graphattn.ops import fused

    calls = {"heads_last": 0, "rows": 0}
    heads_last, rows = fused._kernels_heads_last, fused._kernels
    monkeypatch.setattr(
        fused,
        "_kernels_heads_last",
        lambda h: calls.__setitem__("heads_last", calls["heads_last"] + 1) or heads_last(h),
    )
    monkeypatch.setattr(fused, "_kernels", lambda: calls.__setitem__("rows", calls["rows"] + 1) or rows())
    return calls


# ------------------------------------------------------------------ the fast lane and the CUDA report
# `python -m pytest -m "not slow"` is the fast lane. Marked slow here, in one place: whole files slow by nature
# (running the examples, forking processes), so a new test in them is slow without anyone remembering, and the
# tests that execute notebooks or start a fresh interpreter (each 4-15 s alone, 20-85 s on a loaded machine).
# Other slow tests carry `@pytest.mark.slow` themselves.
SLOW_FILES = {"test_examples.py", "test_ddp.py", "test_gpu_check.py"}
SLOW_TESTS = {  # file::test name (any parametrisation)
    "test_notebooks.py::test_executes",
    "test_notebooks.py::test_notebook_2_is_reproducible",
    "test_cli.py::test_console_script_is_installed",
    "test_cli.py::test_commands_import_no_heavy_module_and_the_core_no_command",
    "test_repository.py::test_import_graphattn_loads_nothing_heavy",
    "test_hf.py::test_import_registers_nothing_and_unregistered_loading_fails_in_transformers",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if item.path.name in SLOW_FILES or name in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say how many tests were skipped for want of a CUDA device, so CI's output shows what never ran."""
    reasons = [
        report.longrepr[2]
        for report in terminalreporter.stats.get("skipped", [])
        if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3
    ]
    cuda = [reason for reason in reasons if "CUDA" in reason or "cuda" in reason]
    if cuda and not torch.cuda.is_available():
        terminalreporter.write_line(
            f"{len(cuda)} CUDA tests skipped: no CUDA device (run the suite on a GPU machine to exercise them)",
            yellow=True,
        )
