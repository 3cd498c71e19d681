"""Pictures of attention: heatmaps, layer-by-head grids, masks, graphs, Pareto fronts.

Every function takes ``ax=None`` (or ``fig=None``), draws, and returns the
artist it made, so tests and callers can read the data back. Nothing is saved,
printed or shown; matplotlib is imported inside the functions, so importing
this package is cheap and never picks a backend.

Orientation everywhere (docs/design.md): queries i on rows (y axis, top to
bottom, whatever ``rcParams["image.origin"]`` says), keys j on columns (x
axis). A cell ``(i, j)`` is the weight with which query i (the edge's target)
reads key j (the edge's source). Heatmaps carry a colour bar and take
``vmin``/``vmax`` so that pictures that are compared share one scale.
"""

from graphattn.viz._common import KEY_LABEL, QUERY_LABEL
from graphattn.viz.graph import attention_graph, encoder_decoder, multihead
from graphattn.viz.heatmaps import attention_heatmap, head_grid, pattern_mask
from graphattn.viz.interactive import bertviz_attention, bertviz_view
from graphattn.viz.pareto import pareto

__all__ = [
    "attention_heatmap",
    "head_grid",
    "pattern_mask",
    "attention_graph",
    "encoder_decoder",
    "multihead",
    "pareto",
    "bertviz_attention",
    "bertviz_view",
    "QUERY_LABEL",
    "KEY_LABEL",
]
