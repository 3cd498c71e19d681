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


# ------------------------------------------------------------------ the fast lane and the CUDA report
# `python -m pytest -m "not slow"` is the fast lane. Whole files slow by nature (executing notebooks, running
# the examples, forking processes) are marked here, so a new test in them is slow without anyone remembering;
# single slow tests elsewhere carry `@pytest.mark.slow` themselves.
SLOW_FILES = {"test_notebooks.py", "test_examples.py", "test_ddp.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say how many tests were skipped for want of a CUDA device, so CI's output shows what never ran."""
    reasons = [report.longrepr[2] for report in terminalreporter.stats.get("skipped", [])
               if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3]
    cuda = [reason for reason in reasons if "CUDA" in reason or "cuda" in reason]
    if cuda and not torch.cuda.is_available():
        terminalreporter.write_line(f"{len(cuda)} CUDA tests skipped: no CUDA device (run the suite on a GPU "
                                    f"machine to exercise them)", yellow=True)
