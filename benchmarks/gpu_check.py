"""The GPU check in one short run: the CUDA exactness tests, then a short training benchmark on CUDA.

    python benchmarks/gpu_check.py                  # about 2-5 minutes on one GPU
    python benchmarks/gpu_check.py --no-bench       # the tests only

1. ``pytest -q -k cuda`` over the tests that run on cuda when a GPU is present
   (and are skipped otherwise): every ``graphattn.ops`` kernel and the ragged
   kernel against the CPU references, ``AttentionConv`` against the dense
   oracle, ``TransformerConv`` against PyG's (float64, to 1e-10).
2. ``benchmarks/train.py --device cuda --modes eager`` on the sparse and sampled cases
   (D = 8 and 64), whose table and ``results/train-<stamp>.{json,md}`` it prints
   and writes (time and ``max_memory_allocated`` ratios).

Without a CUDA device it prints ``no CUDA device: skipped`` and exits 0. The
exit status is 1 when a test fails, 2 when the benchmark fails.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_ops.py", "tests/test_conv.py", "tests/test_transformer_conv.py", "tests/test_ragged.py"]


def _run(title: str, command: list[str], timeout: float) -> int:
    print(f"== {title}: {' '.join(command)}", flush=True)
    t0 = time.perf_counter()
    try:
        code = subprocess.run(command, cwd=ROOT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"== {title}: timed out after {timeout:.0f} s", flush=True)
        return 124
    print(f"== {title}: exit {code} in {time.perf_counter() - t0:.0f} s", flush=True)
    return code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-bench", action="store_true", help="run the tests only")
    parser.add_argument("--cases", default="sparse,sampled", help="benchmarks/train.py --cases")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds for each of the two steps")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}", flush=True)
    code = _run("CUDA exactness tests", [sys.executable, "-m", "pytest", "-q", "-k", "cuda", *TESTS], args.timeout)
    if code != 0:
        return 1
    if not args.no_bench:
        bench = [
            sys.executable,
            "benchmarks/train.py",
            "--device",
            "cuda",
            "--cases",
            args.cases,
            "--dims",
            "8,64",
            "--repeats",
            "5",
            "--modes",
            "eager",
        ]
        if _run("training benchmark on CUDA", bench, args.timeout) != 0:
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
