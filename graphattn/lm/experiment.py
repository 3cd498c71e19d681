"""The experiment: presets, the grid of configurations, and one call that runs it and writes the outputs.

A preset fixes the model sizes, the budget per configuration and the grid
(patterns x lengths x seeds):

- ``smoke``: a tiny model on 128 bytes, dense, graphattn's causal graph and a
  window, 100 steps each (CI; under 2 minutes on 2 cores);
- ``default``: 4 layers, d = 256, 4 heads, L = 2048, dense vs ``window:128``
  vs ``strided:64`` vs ``window:128|global:0+1+2+3`` (four sink tokens),
  110 s of training each, at equal wall time (about 10 minutes on 2 idle cores);
- ``full``: the same model, L = 1024, 2048, 4096, the same four patterns,
  seeds 0, 1, 2, 1200 s each: 36 configurations, about 13 hours on 2 cores
  (each a resumable job: stop and rerun at will).

Every option of a preset can be overridden (:func:`make_runs`).
"""

from __future__ import annotations

from graphattn.lm.model import DENSE, LMConfig, attention_graph
from graphattn.lm.train import RunConfig, dist_context, train_run
from graphattn.provenance import environment
from graphattn.validate import message

__all__ = ["PRESETS", "make_runs", "run_experiment", "environment"]

_MODEL = dict(layers=4, d_model=256, heads=4, d_ff=1024)
_PATTERNS = [DENSE, "window:128", "strided:64", "window:128|global:0+1+2+3"]
PRESETS = {
    "smoke": dict(
        lengths=[128],
        patterns=[DENSE, "causal", "window:16"],
        seeds=[0],
        layers=2,
        d_model=64,
        heads=2,
        d_ff=256,
        batch=8,
        lr=3e-3,
        warmup=10,
        steps=100,
        seconds=None,
        evals=4,
        eval_windows=8,
        probe_windows=16,
    ),
    "default": dict(
        lengths=[2048],
        patterns=_PATTERNS,
        seeds=[0],
        **_MODEL,
        batch=1,
        lr=1e-3,
        warmup=10,
        steps=None,
        seconds=110.0,
        evals=8,
        eval_windows=4,
        probe_windows=4,
    ),
    "full": dict(
        lengths=[1024, 2048, 4096],
        patterns=_PATTERNS,
        seeds=[0, 1, 2],
        **_MODEL,
        batch=1,
        lr=1e-3,
        warmup=20,
        steps=None,
        seconds=1200.0,
        evals=20,
        eval_windows=16,
        probe_windows=8,
    ),
}


def make_runs(preset: str = "smoke", **overrides) -> list[RunConfig]:
    """The configurations of ``preset`` with ``overrides`` (keys of :data:`PRESETS`' entries; None = keep).

    Giving ``steps`` clears the preset's ``seconds`` and the other way round.
    Order: length, then seed, then pattern (dense first), so that an early
    stop still leaves complete comparisons.
    """
    if preset not in PRESETS:
        raise ValueError(message("preset", f"one of {', '.join(PRESETS)}", repr(preset)))
    p = dict(PRESETS[preset])
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(given) - set(p)
    if unknown:
        raise ValueError(message("overrides", f"among {', '.join(sorted(p))}", ", ".join(sorted(unknown))))
    if "steps" in given:
        p["seconds"] = None
    if "seconds" in given:
        p["steps"] = None
    p.update(given)
    for pattern in p["patterns"]:
        attention_graph(pattern)  # a bad spec is refused now, before the corpus is read
    runs = []
    for length in p["lengths"]:
        for seed in p["seeds"]:
            for pattern in p["patterns"]:
                model = LMConfig(
                    length=length,
                    layers=p["layers"],
                    d_model=p["d_model"],
                    heads=p["heads"],
                    d_ff=p["d_ff"],
                    pattern=pattern,
                )
                runs.append(
                    RunConfig(
                        model=model,
                        seed=seed,
                        batch=p["batch"],
                        lr=p["lr"],
                        warmup=p["warmup"],
                        steps=p["steps"],
                        seconds=p["seconds"],
                        evals=p["evals"],
                        eval_windows=p["eval_windows"],
                        probe_windows=p["probe_windows"],
                    )
                )
    return runs


def run_experiment(
    runs: list[RunConfig],
    out: str,
    *,
    corpus=None,
    device: str | None = None,
    progress: bool = True,
    draw: bool = True,
    meta: dict | None = None,
    log=print,
) -> tuple[list[dict], dict]:
    """Train every configuration (skipping finished ones, resuming interrupted ones), then write the outputs.

    Parameters
    ----------
    runs : list of RunConfig
    out : str
        Folder for ``runs/<name>/`` and ``lm.csv``, ``lm.json``, ``lm.png``.
    corpus : Corpus, optional
        Default :func:`graphattn.lm.data.load_corpus`.
    device : str, optional
        Default CUDA when available, else CPU (under torchrun: the local rank's GPU).
    progress, draw : bool, default True
        tqdm bars; the figure.
    meta : dict, optional
        Added to the JSON's ``meta`` (the command puts its arguments there).

    Returns
    -------
    results : list of dict
        One per configuration (``result.json``).
    paths : dict
        ``{"csv", "json", "png"}`` on rank 0, empty on the others.
    """
    from graphattn.lm import data, report

    ctx = dist_context(device)
    corpus = corpus or data.load_corpus()
    if ctx.rank == 0:
        sizes = corpus.sizes()
        log(
            f"corpus {corpus.root}: {len(corpus.files['train'])}/{len(corpus.files['val'])}/"
            f"{len(corpus.files['test'])} files, {sizes['train']}/{sizes['val']}/{sizes['test']} bytes "
            f"(train/val/test), sha256 {corpus.sha256[:12]}; {len(runs)} configurations on {ctx.device}"
            f"{f' x {ctx.world} processes' if ctx.world > 1 else ''}"
        )
    results = []
    for k, run in enumerate(runs):
        result = train_run(run, corpus, out, ctx, progress=progress)
        results.append(result)
        if ctx.rank == 0:
            log(
                f"[{k + 1}/{len(runs)}] {run.name}: val {result['val_bpb']:.3f} bpb, test {result['test_bpb']:.3f} "
                f"bpb, {result['tokens']} tokens in {result['train_seconds']:.1f} s"
            )
    if ctx.rank != 0:
        return results, {}
    first = runs[0].model
    info = {
        "model_text": f"{first.layers} layers, d={first.d_model}, {first.heads} heads, FFN {first.d_ff}",
        "corpus_sha256": corpus.sha256,
        "corpus_bytes": corpus.sizes(),
        "corpus_root": corpus.root,
        "seeds": sorted({r.seed for r in runs}),
        "world": ctx.world,
        **environment(("torch", "numpy", "pandas", "scipy", "matplotlib")),
        **(meta or {}),
    }
    return results, report.write_outputs(results, out, info, draw=draw)
