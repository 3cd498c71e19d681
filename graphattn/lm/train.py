"""The training loop: one resumable job per configuration, optionally data parallel.

Each configuration (:class:`RunConfig`: pattern, length, seed, sizes, budget)
lives in its own folder ``<out>/runs/<name>/``:

- ``ckpt.pt``: model, optimizer, step, tokens, clocks and the evaluation log,
  written atomically every ``ckpt_every`` steps, on Ctrl-C and at the end;
- ``log.jsonl``: one line per evaluation (step, tokens, training seconds,
  FLOPs, validation bits per byte);
- ``result.json``: written last, when the run is finished (final validation
  and test bits per byte, the probes, costs).

:func:`train_run` skips a configuration whose ``result.json`` holds the same
configuration, resumes one that has a checkpoint, and starts the others. The
batch of step s is drawn from a generator seeded by (seed, rank, s), so a
resumed run sees exactly the batches an uninterrupted one sees and ends in
the same state.

Budgets: ``steps`` (equal tokens) or ``seconds`` of training time (equal wall
time; evaluation is not counted). Learning rate: linear warm-up, then constant
(the budget in seconds does not say how many steps there will be).

Data parallel: launched by ``torchrun`` (``WORLD_SIZE`` > 1), every process
trains on its own batches, gradients are averaged by
``DistributedDataParallel`` (gloo on CPU, NCCL on GPU), evaluation windows are
shared out and summed, rank 0 decides when a time budget is spent and writes
the files (a shared folder is assumed).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field

import torch

from graphattn.lm import probe
from graphattn.lm.data import Corpus, eval_windows, sample_batch
from graphattn.lm.flops import num_edges, training_flops
from graphattn.lm.model import ByteLM, LMConfig
from graphattn.validate import message

__all__ = ["RunConfig", "Dist", "dist_context", "train_run", "evaluate_bpb", "write_json"]

LN2 = math.log(2.0)


@dataclass(frozen=True)
class RunConfig:
    """One configuration: a model, a seed and a budget (``steps`` or ``seconds``, exactly one)."""

    model: LMConfig
    seed: int = 0
    batch: int = 1
    lr: float = 1e-3
    warmup: int = 20
    steps: int | None = None
    seconds: float | None = None
    evals: int = 10  # evaluations over the budget
    eval_windows: int = 8
    ckpt_every: int = 50
    probe_windows: int = 8

    def __post_init__(self):
        if (self.steps is None) == (self.seconds is None):
            raise ValueError(
                message(
                    "steps",
                    "given exactly when 'seconds' is None (one of the two budgets)",
                    f"steps={self.steps}, seconds={self.seconds}",
                )
            )

    @property
    def name(self) -> str:
        """Folder name: pattern, length and seed (``window-128_L2048_s0``)."""
        slug = "".join(c if c.isalnum() else "-" for c in self.model.pattern).strip("-")
        return f"{slug}_L{self.model.length}_s{self.seed}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Dist:
    """Where this process runs: rank, world size, device (``world == 1``: no torch.distributed)."""

    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


def dist_context(device: str | None = None) -> Dist:
    """Join the process group when launched by ``torchrun`` (``WORLD_SIZE`` > 1); else a single process."""
    import torch.distributed as dist

    name = device or ("cuda" if torch.cuda.is_available() else "cpu")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(device=torch.device(name))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if name.startswith("cuda"):
        torch.cuda.set_device(local)
        name = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if name.startswith("cuda") else "gloo")
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), device=torch.device(name))


def write_json(path: str, obj) -> None:
    """Write JSON atomically (a temporary file, then ``os.replace``)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1, default=str)
    os.replace(tmp, path)


def _save(path: str, state: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)


def _all_sum(values: list[float], ctx: Dist) -> list[float]:
    if ctx.world == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def evaluate_bpb(model: ByteLM, data: torch.Tensor, length: int, windows: int, ctx: Dist | None = None) -> float:
    """Bits per byte of ``model`` on ``windows`` evenly spaced windows of a split (shared out over ranks)."""
    ctx = ctx or Dist()
    x, y = eval_windows(data, length, windows)  # (n, T), (n, T)
    was = model.training
    model.eval()
    total = 0.0
    for b in range(ctx.rank, windows, ctx.world):
        total += float(model.loss(x[b : b + 1].to(ctx.device), y[b : b + 1].to(ctx.device), reduction="sum"))
    model.train(was)
    total, count = _all_sum([total, float(windows * length)], ctx)[0], windows * length
    return total / count / LN2


def _optimizer(model: ByteLM, run: RunConfig) -> torch.optim.Optimizer:
    """AdamW, weight decay 0.1 on matrices only (nanoGPT's split), betas (0.9, 0.95)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=run.lr, betas=(0.9, 0.95)
    )


def _lr(run: RunConfig, step: int) -> float:
    return run.lr * min(1.0, (step + 1) / max(run.warmup, 1))


def _progress(run: RunConfig, state: dict) -> float:
    """Fraction of the budget spent, in [0, 1]."""
    if run.steps is not None:
        return min(1.0, state["step"] / run.steps)
    return min(1.0, state["train_seconds"] / run.seconds)


def _fresh_state(run: RunConfig) -> dict:
    return {"step": 0, "tokens": 0, "train_seconds": 0.0, "cpu_seconds": 0.0, "log": [], "next_eval": 1}


def train_run(
    run: RunConfig,
    corpus: Corpus,
    out: str,
    ctx: Dist | None = None,
    *,
    max_new_steps: int | None = None,
    progress: bool = True,
) -> dict | None:
    """Train one configuration (resuming or skipping as the folder says); its result, or None if unfinished.

    Parameters
    ----------
    run : RunConfig
    corpus : Corpus
    out : str
        The experiment folder; this run uses ``<out>/runs/<run.name>/``.
    ctx : Dist, optional
        Default :func:`dist_context` (a single process unless under torchrun).
    max_new_steps : int, optional
        Stop after this many steps in this call, checkpointed, and return None
        (a job with a wall-clock limit on a cluster; the tests' interruption).
    progress : bool, default True
        A tqdm bar on rank 0.

    Returns
    -------
    dict or None
        The contents of ``result.json``.
    """
    ctx = ctx or dist_context()
    folder = os.path.join(out, "runs", run.name)
    done = os.path.join(folder, "result.json")
    if os.path.exists(done):
        with open(done) as fh:
            result = json.load(fh)
        if result.get("run") == json.loads(json.dumps(run.to_dict())):
            return result
    os.makedirs(folder, exist_ok=True)
    ckpt = os.path.join(folder, "ckpt.pt")
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(run.seed)  # the same initial weights for every pattern of a seed: paired comparisons
        model = ByteLM(run.model).to(ctx.device)
    optimizer = _optimizer(model, run)
    state = _fresh_state(run)
    if os.path.exists(ckpt):
        saved = torch.load(ckpt, map_location=ctx.device, weights_only=False)
        if saved["run"] == run.to_dict():
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            state = saved["state"]
    if ctx.rank == 0:  # the log as of the checkpoint (a killed run may have logged past it)
        with open(os.path.join(folder, "log.jsonl"), "w") as fh:
            fh.writelines(json.dumps(entry) + "\n" for entry in state["log"])
    result = _loop(run, model, optimizer, state, corpus, folder, ckpt, ctx, max_new_steps, progress)
    return result


def _checkpoint(ckpt: str, run: RunConfig, model, optimizer, state: dict, ctx: Dist) -> None:
    if ctx.rank == 0:
        _save(
            ckpt,
            {"run": run.to_dict(), "model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": state},
        )


def _loop(run, model, optimizer, state, corpus, folder, ckpt, ctx, max_new_steps, progress):
    from tqdm.auto import tqdm

    net = model
    if ctx.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    L = run.model.length
    edges = num_edges(run.model.pattern, L)
    per_step = training_flops(run.model, sequences=run.batch * ctx.world, edges=edges)
    unit, total = ("step", run.steps) if run.steps is not None else ("s", run.seconds)
    bar = tqdm(
        total=total,
        desc=run.name,
        unit=unit,
        disable=not progress or ctx.rank != 0,
        leave=False,
        mininterval=1.0,
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} {unit} [{elapsed}<{remaining}]{postfix}",
    )
    bar.update(state["step"] if run.steps is not None else state["train_seconds"])
    new_steps = 0
    train = corpus.train
    if not state["log"]:  # the initial model: every curve starts at 0 tokens, 0 s
        _evaluate(run, model, state, corpus, per_step, folder, ctx)
    try:
        while _progress(run, state) < 1.0:
            if max_new_steps is not None and new_steps >= max_new_steps:
                _checkpoint(ckpt, run, model, optimizer, state, ctx)
                return None
            g = torch.Generator().manual_seed(run.seed * 1_000_003 + ctx.rank * 7919 + state["step"])
            x, y = sample_batch(train, run.batch, L, g)  # (batch, L), (batch, L)
            for group in optimizer.param_groups:
                group["lr"] = _lr(run, state["step"])
            _sync(ctx)
            t0, c0 = time.perf_counter(), time.process_time()
            logits = net(x.to(ctx.device))  # (batch, L, V)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.to(ctx.device).flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            _sync(ctx)
            dt = _agree(time.perf_counter() - t0, ctx)  # rank 0's clock decides a time budget
            state["train_seconds"] += dt
            state["cpu_seconds"] += time.process_time() - c0
            state["step"] += 1
            state["tokens"] += run.batch * L * ctx.world
            new_steps += 1
            state["last_loss_bpb"] = float(loss.detach()) / LN2
            bar.update(1 if run.steps is not None else dt)
            bar.set_postfix_str(f"train {state['last_loss_bpb']:.2f} bpb", refresh=False)
            if _progress(run, state) * run.evals >= state["next_eval"] or _progress(run, state) >= 1.0:
                _evaluate(run, model, state, corpus, per_step, folder, ctx)
                bar.set_postfix_str(f"val {state['log'][-1]['val_bpb']:.3f} bpb", refresh=False)
            if state["step"] % run.ckpt_every == 0:
                _checkpoint(ckpt, run, model, optimizer, state, ctx)
    except KeyboardInterrupt:
        _checkpoint(ckpt, run, model, optimizer, state, ctx)
        raise
    finally:
        bar.close()
    _checkpoint(ckpt, run, model, optimizer, state, ctx)
    return _finish(run, model, state, corpus, per_step, edges, folder, ctx)


def _sync(ctx: Dist) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def _agree(seconds: float, ctx: Dist) -> float:
    """Rank 0's step time on every rank, so that all stop after the same step."""
    if ctx.world == 1:
        return seconds
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64, device=ctx.device)
    dist.broadcast(t, src=0)
    return float(t)


def _evaluate(run, model, state, corpus, per_step, folder, ctx) -> None:
    while state["next_eval"] <= _progress(run, state) * run.evals:
        state["next_eval"] += 1
    bpb = evaluate_bpb(model, corpus.val, run.model.length, run.eval_windows, ctx)
    entry = {
        "step": state["step"],
        "tokens": state["tokens"],
        "train_seconds": state["train_seconds"],
        "flops": per_step["total"] * state["step"],
        "attn_flops": per_step["attention"] * state["step"],
        "val_bpb": bpb,
        "train_bpb": state.get("last_loss_bpb"),
    }
    state["log"].append(entry)
    if ctx.rank == 0:
        with open(os.path.join(folder, "log.jsonl"), "a") as fh:
            fh.write(json.dumps(entry) + "\n")


def _peak_memory_mb(ctx: Dist) -> float:
    """CUDA: peak allocated on the device; CPU: the process's peak resident set (all runs so far)."""
    if ctx.device.type == "cuda":
        return torch.cuda.max_memory_allocated(ctx.device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _finish(run, model, state, corpus, per_step, edges, folder, ctx) -> dict:
    L = run.model.length
    test_bpb = evaluate_bpb(model, corpus.test, L, run.eval_windows, ctx)
    probes = probe.run_probes(model, corpus.val, L, run.probe_windows, ctx.device)
    steps = state["step"]
    result = {
        "name": run.name,
        "pattern": run.model.pattern,
        "length": L,
        "seed": run.seed,
        "steps": steps,
        "tokens": state["tokens"],
        "val_bpb": state["log"][-1]["val_bpb"],
        "test_bpb": test_bpb,
        "edges": edges,
        "density": edges / (L * (L + 1) / 2),
        "flops": per_step["total"] * steps,
        "attn_flops": per_step["attention"] * steps,
        "other_flops": per_step["other"] * steps,
        "train_seconds": state["train_seconds"],
        "cpu_seconds": state["cpu_seconds"],
        "tokens_per_s": state["tokens"] / max(state["train_seconds"], 1e-9),
        "peak_memory_mb": _peak_memory_mb(ctx),
        "parameters": model.num_parameters(),
        "world": ctx.world,
        "device": str(ctx.device),
        "log": state["log"],
        "run": json.loads(json.dumps(run.to_dict())),
        **probes,
    }
    if ctx.rank == 0:
        write_json(os.path.join(folder, "result.json"), result)
    return result
