"""Context-parallel graph attention over ``torch.distributed``.

Each process owns a contiguous block of the sequence (its queries, keys and
values) and receives only the key/value rows that the edges into its queries
cross; attention then runs locally with graphattn's kernels, exactly as on one
process. Ring attention passes every block to every process whatever the
pattern; here a window costs its halo and only the complete graph costs
everything (docs/distributed.md).

Modules, by concept: :mod:`~graphattn.distributed.plan` (who needs which rows,
computed once from the graph), :mod:`~graphattn.distributed.comm` (the
exchange, an autograd function over ``all_to_all_single``),
:mod:`~graphattn.distributed.attention` (the entry),
:mod:`~graphattn.distributed.traffic` (planned traffic from a pattern's rule at
sizes whose edges would not fit; ring attention's, for comparison).
"""

from graphattn.distributed.attention import attention, plan_for_group
from graphattn.distributed.comm import exchange
from graphattn.distributed.plan import ExchangePlan, block_bounds, build_plan
from graphattn.distributed.traffic import pattern_rows, ring_rows

__all__ = [
    "ExchangePlan",
    "attention",
    "block_bounds",
    "build_plan",
    "exchange",
    "pattern_rows",
    "plan_for_group",
    "ring_rows",
]
