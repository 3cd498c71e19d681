"""Dense vs sparse attention on a real model: what a pattern loses and what it saves.

The experiment, a module per concept:

- :mod:`graphattn.prune.corpus`: real passages (the Python reference
  documentation, or a user's file);
- :mod:`graphattn.prune.keep`: :class:`Spec`, what a spec keeps per layer and head: a rule of three
  kinds (a fixed pattern, a pattern drawn per layer and head, a selection from the dense weights);
- :mod:`graphattn.prune.specs`: short pattern specs (``window:8``,
  ``topk:16``, ``window:4|global:0``; the fixed ones from
  :func:`graphattn.patterns.from_spec`), roles, scopes, checked against the model;
- :mod:`graphattn.prune.tasks`: labelled retrieval tasks (first sentences,
  topic titles), their construction, scored with ranx; BM25; paired bootstrap intervals;
- :mod:`graphattn.prune.stats`: paired sign-flip p-values, Holm-Bonferroni;
- :mod:`graphattn.prune.scoring`: a row's metrics against the reference, the spread over seeds, the BM25 row;
- :mod:`graphattn.prune.costs`: peak memory per row, the timed eager and SDPA passes;
- :mod:`graphattn.prune.metrics`: attention mass, output error, retrieval fidelity, FLOPs;
- :mod:`graphattn.prune.models`: any local encoder or causal LM, its limits, the forward loop;
- :mod:`graphattn.prune.accounting`: per-layer accounting of a run (the sparsity callable and observer,
  one accumulator per layer, the per-layer metrics);
- :mod:`graphattn.prune.run`: :func:`run_experiment`, built on the Hugging
  Face bridge's sparsity hook (:func:`graphattn.interop.hf.sparsity`);
- :mod:`graphattn.prune.report`: the self-check, the table, the figure and the files;
- :mod:`graphattn.prune.sweep`: the specs of ``--sweep`` (budget curves, global and layer ablations).

Nothing heavy (transformers, pandas, matplotlib) is imported until a function needs it.
"""

from graphattn.prune import corpus, costs, keep, metrics, models, scoring, specs, stats, sweep, tasks
from graphattn.prune.corpus import DEFAULT_LIMIT
from graphattn.prune.models import load_model
from graphattn.prune.report import SELF_CHECK_TOL, TABLE_COLUMNS, format_table, self_check, write_outputs
from graphattn.prune.run import Results, run_experiment
from graphattn.prune.specs import DEFAULT_PATTERNS, SPEC_HELP, Spec, as_spec, parse_spec
from graphattn.prune.tasks import Task, make_task

__all__ = [
    "corpus",
    "costs",
    "keep",
    "metrics",
    "models",
    "scoring",
    "specs",
    "stats",
    "sweep",
    "tasks",
    "run_experiment",
    "Results",
    "load_model",
    "self_check",
    "format_table",
    "write_outputs",
    "parse_spec",
    "as_spec",
    "Spec",
    "Task",
    "make_task",
    "SPEC_HELP",
    "DEFAULT_PATTERNS",
    "DEFAULT_LIMIT",
    "SELF_CHECK_TOL",
    "TABLE_COLUMNS",
]
