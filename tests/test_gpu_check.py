"""benchmarks/gpu_check.py: without a GPU it skips cleanly; the tests it selects are the CUDA ones."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script itself is the check")
def test_skips_cleanly_without_cuda():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no CUDA device: skipped"


def test_selects_the_cuda_exactness_tests_of_ops_conv_transformer_conv_and_ragged():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.pop(0)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-k", "cuda", *gpu_check.TESTS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    files = {line.split("::")[0] for line in result.stdout.splitlines() if "::" in line}
    assert files == set(gpu_check.TESTS), result.stdout[-2000:]
