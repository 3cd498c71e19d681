"""Train small byte-level causal language models from scratch, one attention graph per run (``graphattn lm``).

``graphattn.prune`` asks what removing edges costs a model trained dense;
this package asks what a pattern costs, and saves, when the model is trained
with it from the start (the question of the Sparse Transformer, Longformer
and BigBird papers): bits per byte on held-out text against tokens, wall
time and FLOPs, loss per position, and long-range probes.

Modules, by concept: ``data`` (the standard library's sources as bytes, a
hashed split by file), ``model`` (the GPT-style byte-level LM on
:func:`graphattn.attention`), ``flops`` (training FLOPs, attention and the
rest), ``train`` (resumable, data-parallel loop), ``probe`` (per-position
loss, repeated n-grams, copy task), ``report`` (tables, comparisons, files,
figure), ``experiment`` (presets and the whole run). See ``docs/lm.md``.
"""

from graphattn.lm import data, experiment, flops, model, probe, report, train
from graphattn.lm.data import Corpus, load_corpus
from graphattn.lm.experiment import PRESETS, make_runs, run_experiment
from graphattn.lm.model import ByteLM, LMConfig
from graphattn.lm.train import RunConfig, train_run

__all__ = [
    "data",
    "model",
    "flops",
    "train",
    "probe",
    "report",
    "experiment",
    "Corpus",
    "load_corpus",
    "ByteLM",
    "LMConfig",
    "RunConfig",
    "train_run",
    "PRESETS",
    "make_runs",
    "run_experiment",
]
