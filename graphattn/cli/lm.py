"""``graphattn lm``: train small byte-level causal LMs with dense and sparse attention graphs (:mod:`graphattn.lm`).

Prints the corpus, a progress bar per configuration, the table (final
validation and test bits per byte, tokens, FLOPs, time) and the comparisons
at equal tokens and equal wall time; writes ``lm.csv``, ``lm.json`` and
``lm.png`` into ``--out``, and one resumable job per configuration under
``--out/runs/``: rerun the same command to resume or to skip finished ones.
Data parallel: ``torchrun --nproc-per-node N -m graphattn.cli lm ...``.
"""

from __future__ import annotations

import argparse

from graphattn.cli.args import cpu_threads, float_in, int_in, ints, message, out_path

__all__ = ["add_arguments", "main"]

PRESET_NAMES = ("smoke", "default", "full")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``graphattn lm`` (a preset, then overrides; None keeps the preset's value)."""
    parser.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        default="smoke",
        help="smoke: tiny model, L=128, < 2 min (default); default: L=2048, dense vs window vs "
        "strided vs window+sinks at 110 s each, ~10 min on 2 cores; full: L=1024/2048/4096 x "
        "4 patterns x 3 seeds, ~13 h on 2 cores (resumable)",
    )
    parser.add_argument(
        "--patterns",
        nargs="+",
        metavar="SPEC",
        default=None,
        help="dense (SDPA causal) or pattern specs, always intersected with the causal DAG: "
        "causal, window:128, strided:64, window:128|global:0+1+2+3, bigbird:block=16, "
        "random:32 (grammar: graphattn.patterns.from_spec)",
    )
    parser.add_argument(
        "--lengths",
        type=ints("--lengths", 8, 1 << 16),
        default=None,
        metavar="L,...",
        help="comma-separated sequence lengths in bytes",
    )
    parser.add_argument(
        "--seeds",
        type=ints("--seeds", 0, 2**31 - 1),
        default=None,
        metavar="S,...",
        help="comma-separated seeds (initial weights and batches; paired across patterns)",
    )
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument(
        "--seconds",
        type=float_in("--seconds", 0, 1e7),
        default=None,
        help="training seconds per configuration (equal wall time)",
    )
    budget.add_argument(
        "--steps",
        type=int_in("--steps", 1, 10**9),
        default=None,
        help="optimizer steps per configuration (equal tokens)",
    )
    parser.add_argument(
        "--batch", type=int_in("--batch", 1, 1 << 16), default=None, help="sequences per step and process"
    )
    parser.add_argument("--layers", type=int_in("--layers", 1, 256), default=None)
    parser.add_argument("--d-model", type=int_in("--d-model", 1, 1 << 16), default=None)
    parser.add_argument("--heads", type=int_in("--heads", 1, 1024), default=None)
    parser.add_argument("--d-ff", type=int_in("--d-ff", 1, 1 << 18), default=None)
    parser.add_argument("--lr", type=float_in("--lr", 0, 10), default=None, help="peak learning rate (AdamW)")
    parser.add_argument(
        "--out",
        type=out_path("--out"),
        metavar="DIR",
        default="lm-out",
        help="folder for lm.csv, lm.json, lm.png and runs/ (default lm-out)",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--threads",
        type=cpu_threads("--threads"),
        default=None,
        metavar="N",
        help="torch threads (default: torch's own choice)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    """Run ``graphattn lm``; 0 on success (user errors raise, see :func:`graphattn.cli.main`)."""
    import torch

    from graphattn.lm import experiment, report

    runs = experiment.make_runs(
        args.preset,
        lengths=args.lengths,
        patterns=args.patterns,
        seeds=args.seeds,
        seconds=args.seconds,
        steps=args.steps,
        batch=args.batch,
        layers=args.layers,
        d_model=args.d_model,
        heads=args.heads,
        d_ff=args.d_ff,
        lr=args.lr,
    )
    if args.device is not None:
        kind = args.device.split(":")[0]
        if kind not in ("cpu", "cuda") or (kind == "cuda" and not torch.cuda.is_available()):
            raise ValueError(
                message(
                    "--device",
                    "cpu, or cuda with a GPU that torch sees",
                    f"{args.device!r}; torch.cuda.is_available() is {torch.cuda.is_available()}",
                )
            )
    if args.threads:
        torch.set_num_threads(args.threads)
    arguments = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items() if k != "func"}
    results, paths = experiment.run_experiment(
        runs,
        args.out,
        device=args.device,
        progress=not args.no_progress,
        meta={"preset": args.preset, "arguments": arguments},
    )
    if paths:
        print(report.format_table(results, report.compare(results)))
        print(f"wrote {', '.join(paths.values())}")
    return 0
