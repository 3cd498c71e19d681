"""``graphattn prune --sweep``: budget curves and two ablations, as one list of specs.

- budget: k = 1, 2, 4, 8, 16, 32 keys per query for a window (``k`` keys
  around the query: ``(k - 1) // 2`` to the left, the rest to the right), the
  same window with [CLS] global (Longformer-style) and oracle top-k (``topk:k``,
  data-dependent: a bound, not a saving);
- globals: ``window:8`` with no global token, [CLS], [CLS] and [SEP], the first 4;
- layers: ``window:8`` in one layer only (``@layers=l``), and from layer l on
  (``@layers=l-last``, 0 < l < last).

:func:`sweep_specs` returns ``(spec text, group, x)`` triples; the command
runs them without oracle rows and draws :func:`graphattn.cli.prune.sweep_figure`.
"""

from __future__ import annotations

__all__ = ["BUDGETS", "GLOBALS", "sweep_specs"]

BUDGETS = (1, 2, 4, 8, 16, 32)
GLOBALS = {"none": "", "cls": "|global:cls", "cls+sep": "|global:cls+sep", "first 4": "|global:first4"}


def _window(k: int) -> str:
    left = (k - 1) // 2
    return f"window:left={left},right={k - 1 - left}"  # k keys: the query, left before it, the rest after


def sweep_specs(num_layers: int) -> list[tuple[str, str, object]]:
    """The sweep as ``(spec, group, x)``: group ``window``, ``window|cls``, ``topk`` (x = k), ``globals``
    (x = the global tokens), ``one layer`` and ``from layer`` (x = the layer).

    Examples
    --------
    >>> sweep_specs(2)[:2]
    [('window:left=0,right=0', 'window', 1), ('window:left=0,right=1', 'window', 2)]
    """
    out = [(_window(k), "window", k) for k in BUDGETS]
    out += [(_window(k) + "|global:cls", "window|cls", k) for k in BUDGETS]
    out += [(f"topk:{k}", "topk", k) for k in BUDGETS]
    out += [("window:8" + extra, "globals", name) for name, extra in GLOBALS.items()]
    out += [(f"window:8@layers={layer}", "one layer", layer) for layer in range(num_layers)]
    # from layer l on, for 0 < l < last: from 0 is every layer (globals "none"), from the last is "one layer"
    out += [(f"window:8@layers={layer}-{num_layers - 1}", "from layer", layer) for layer in range(1, num_layers - 1)]
    return out
