"""``graphattn bench``: graph attention against SDPA, FlexAttention and PyG TransformerConv.

Every competitor runs on the same data in the same run, and the table reports
ratios to graphattn, so numbers from a busy or a quiet machine compare alike.

Methods (H heads of D channels, float32 by default):

- ``graphattn``: :func:`graphattn.attention` on ``(L, H, D)`` tensors with the
  pattern's edges (a ``Pattern`` for the complete graph), ``need_weights=False``;
  its structure (sorting, tiles) is built once per graph, timed as ``prep_s``.
- ``sdpa``: ``F.scaled_dot_product_attention`` without a mask (complete graph only).
- ``sdpa_mask``: the same with the pattern as a dense bool mask (L, S).
- ``flex``: ``torch.compile(flex_attention)`` with an equivalent ``BlockMask``;
  ``prep_s`` is ``create_block_mask``, ``compile_s`` the first call minus a
  steady call. FlexAttention has no CPU backward: fwd+bwd is "n/a" on CPU.
- ``pyg``: the attention part of ``TransformerConv(HD, D, heads=H,
  root_weight=False)`` on the same ``edge_index``: its query/key/value
  projections are replaced by identities, so it computes exactly what
  ``graphattn`` computes (scores, softmax and aggregation on the edges).

Measurement: each (pattern, L) runs in its own subprocess. Time is the median
wall-clock of ``--repeats`` calls after one warm-up call. Peak memory is the
peak resident set size during one more call above the resident size just
before it (Linux ``VmHWM`` reset through ``/proc/self/clear_refs``; before
that call glibc is told to map every buffer of 64 KiB or more on its own and
to return freed memory, so that the resident size tracks live memory);
on CUDA, ``torch.cuda.max_memory_allocated`` above the allocated memory before
the call. Inputs, structures and compiled kernels are resident before, so not
counted. A case whose estimated memory exceeds ``--memory-budget`` is skipped
and reported as such. GFLOP/s counts the useful work only, ``4 E H D`` per
forward (scores and aggregation on the edges), three times that for
forward+backward, against a plain ``torch.mm`` measured in the same run.

Modules: :mod:`~graphattn.bench.cases` (the grid, edge counts, memory
estimates), :mod:`~graphattn.bench.worker` (one case, measured in a
subprocess), :mod:`~graphattn.bench.report` (ratios, targets, table, files),
:mod:`~graphattn.bench.suite` (all of it). Only the command
(:mod:`graphattn.cli.bench`) imports this package.
"""

from graphattn.bench import cases as _cases
from graphattn.bench.cases import *  # noqa: F403 (its __all__: the grid)
from graphattn.bench.report import add_ratios, markdown, markdown_from_json, report, targets
from graphattn.bench.suite import check_device, measure, run
from graphattn.bench.worker import matmul_gflops, worker

__all__ = [  # the grid's names as graphattn.bench.cases lists them, then the rest
    *_cases.__all__,
    "worker",
    "matmul_gflops",
    "measure",
    "add_ratios",
    "targets",
    "report",
    "markdown",
    "markdown_from_json",
    "check_device",
    "run",
]
