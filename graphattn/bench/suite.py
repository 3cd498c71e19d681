"""The benchmark end to end: every case of the grid, measured, compared and reported."""

from __future__ import annotations

import os

from graphattn.bench.cases import applicable, estimate_bytes, grid, num_edges
from graphattn.bench.report import add_ratios, report
from graphattn.bench.worker import matmul_gflops, spawn

__all__ = ["check_device", "measure", "run"]


def measure(cases: list[dict], args) -> list[dict]:
    """Run every case (skipping what cannot fit or does not apply), one interpreter per (pattern, L)."""
    from rich.progress import Progress

    itemsize = {"float32": 4, "float64": 8, "bfloat16": 2}[args.dtype]
    rows, groups = [], {}
    for case in cases:
        row = dict(case, edges=num_edges(case["pattern"], case["L"]))
        why = applicable(case["method"], case["pattern"], case["mode"], args.device)
        need = estimate_bytes(
            case["method"], case["pattern"], case["L"], case["mode"], case["heads"], case["dim"], itemsize
        )
        if why:
            row["status"] = why
        elif need > args.memory_budget * 2**30:
            row["status"] = f"skipped: needs ~{need / 2**30:.1f} GiB > budget {args.memory_budget:g} GiB"
        else:
            groups.setdefault((case["pattern"], case["L"], case.get("sweep")), []).append(len(rows))
        rows.append(row)
    with Progress(transient=False) as progress:
        task = progress.add_task("bench", total=sum(len(g) for g in groups.values()))
        for (pattern, L, _), idx in groups.items():
            progress.update(task, description=f"{pattern} L={L}: {len(idx)} cases")
            for i, result in zip(idx, spawn([cases[i] for i in idx], args.timeout)):
                rows[i].update(result)
            progress.advance(task, len(idx))
    return rows


def check_device(text: str):
    """``text`` as a ``torch.device`` this process can run the benchmark on, else ValueError.

    CPU always; CUDA when this torch build sees that device; MPS when available.
    Devices that hold no data (``meta``) or that torch cannot reach here are refused.
    """
    import torch

    from graphattn.validate import message

    try:
        device = torch.device(text)
    except (RuntimeError, TypeError):
        raise ValueError(message("--device", "a torch device such as cpu or cuda", repr(text))) from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise ValueError(
                message("--device", "a CUDA device this torch build sees", f"{text!r}; {count} CUDA device(s) visible")
            )
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(message("--device", "available here", f"{text!r}: MPS is not available"))
    elif device.type != "cpu":
        raise ValueError(message("--device", "cpu, cuda or mps, a device that runs kernels", repr(text)))
    return device


def run(args, cases: list[dict] | None = None) -> int:
    """Run the grid (or ``cases``), print the table and the targets, write the files; return 0.

    Raises
    ------
    ValueError
        For a device this process cannot run on (before anything is measured).
    """
    check_device(args.device)
    cases = grid(args) if cases is None else cases
    load = os.getloadavg()[0]
    matmul = matmul_gflops(args.device, args.dtype, threads=args.threads)
    rows = measure(cases, args)
    add_ratios(rows)
    args.load = (load, os.getloadavg()[0])  # other jobs on the machine distort every number: recorded
    report(rows, matmul, args)
    return 0
