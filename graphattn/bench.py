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
"""

from __future__ import annotations

import argparse

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

PATTERNS = ("complete", "window", "random", "topk")
METHODS = ("graphattn", "sdpa", "sdpa_mask", "flex", "pyg")
MODES = ("fwd", "fwdbwd")
DEFAULT_SIZES = (1024, 4096)
FULL_SIZES = (1024, 2048, 4096, 8192, 16384)
SCALING = {"window": (1024, 4096, 16384, 65536), "random": (4096, 16384, 65536, 262144)}  # E = 1.3e5 ... 8.4e6
WINDOW, KEYS = 64, 32  # |i - j| <= 64; 32 keys per query for random and top-k


def add_arguments(parser) -> None:
    """Options of ``graphattn bench``."""
    parser.add_argument("--full", action="store_true",
                        help=f"the whole grid: L in {FULL_SIZES}, and the linear-scaling sweeps")
    parser.add_argument("--sizes", type=_ints, default=None, help="comma-separated L (default 1024,4096)")
    parser.add_argument("--patterns", type=_names(PATTERNS), default=PATTERNS,
                        help=f"comma-separated subset of {','.join(PATTERNS)}")
    parser.add_argument("--methods", type=_names(METHODS), default=METHODS,
                        help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--modes", type=_names(MODES), default=MODES, help="fwd, fwdbwd")
    parser.add_argument("--scaling", action="store_true", help="also time graphattn for E = 1e5 ... 1e7")
    parser.add_argument("--heads", type=_positive(int), default=8)
    parser.add_argument("--dim", type=_positive(int), default=64, help="channels per head D")
    parser.add_argument("--dtype", choices=("float32", "float64", "bfloat16"), default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=_positive(int), default=3)
    parser.add_argument("--threads", type=_positive(int), default=None, help="torch threads (default: torch's)")
    parser.add_argument("--memory-budget", type=_positive(float), default=8.0, metavar="GIB",
                        help="skip a case whose estimated extra memory exceeds this (GiB)")
    parser.add_argument("--timeout", type=_positive(float), default=600.0, help="seconds per case before it is killed")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder for CSV/JSON/PNG")
    parser.add_argument("--plot", action="store_true", help="also write a PNG (time vs L per pattern)")


def _positive(kind=int):
    """argparse type: a positive number (argparse prints ArgumentTypeError's message as it is)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__} (got {text!r})") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__} (got {text!r})")
        return value

    return parse


def _ints(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated positive ints."""
    return tuple(_positive(int)(t) for t in text.split(","))


def _names(allowed):
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(t.strip() for t in text.split(",") if t.strip())
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {', '.join(allowed)} (got {text!r})")
        return names

    return parse


# ------------------------------------------------------------------------------ cases and estimates
def num_edges(pattern: str, L: int) -> int:
    """Edges of ``pattern`` on L = S nodes."""
    if pattern == "complete":
        return L * L
    if pattern == "window":
        w = min(WINDOW, L - 1)
        return L * (2 * w + 1) - w * (w + 1)
    return L * min(KEYS, L)


def estimate_bytes(method: str, pattern: str, L: int, mode: str, H: int, D: int, itemsize: int = 4) -> int:
    """Conservative extra memory of one call (bytes), to skip cases that cannot fit."""
    E, nodes = num_edges(pattern, L), L * H * D * itemsize  # nodes: one (L, H, D) tensor
    back = 2 if mode == "fwdbwd" else 1
    if method == "graphattn":  # padded copies of q, k, v, the output; O(E H) scores and weights
        return 8 * nodes * back + (0 if pattern == "complete" else 6 * E * H * itemsize * back + 40 * E)
    if method == "sdpa":
        return 8 * nodes * back
    if method == "sdpa_mask":  # the bool mask, its float copy; the CPU kernel is blocked (no H L S buffer)
        return 8 * nodes * back + (5 + 2 * (back - 1)) * L * L
    if method == "flex":
        return 8 * nodes + 2 * L * L
    if method == "pyg":  # query_i, key_j, value_j and products on every edge (measured ~4x / ~6x E H D)
        return 8 * nodes + (4 if back == 1 else 6) * E * H * D * itemsize + 40 * E
    raise ValueError(f"Expected a method from {METHODS} (got {method!r})")


def applicable(method: str, pattern: str, mode: str, device: str) -> str | None:
    """None if the method runs this case, else why not."""
    if method == "sdpa" and pattern != "complete":
        return "n/a: no mask (complete graph only)"
    if method == "flex" and mode == "fwdbwd" and device == "cpu":
        return "n/a: FlexAttention has no CPU backward"
    return None


# ------------------------------------------------------------------------------ the worker (subprocess)
def _memory_probe(device):
    """``(reset, read)``: reset the peak, then read the peak extra bytes since the reset."""
    import torch

    if device.type == "cuda":
        def reset():
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            return torch.cuda.memory_allocated(device)

        def read(base):
            torch.cuda.synchronize(device)
            return torch.cuda.max_memory_allocated(device) - base

        return reset, read

    def status(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
        raise OSError(f"{field} not in /proc/self/status")

    def reset():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS (Linux >= 4.0)
        return status("VmRSS:")

    def read(base):  # memory freed during the call can leave the peak below the start: report 0
        return max(status("VmHWM:") - base, 0)

    return reset, read


def _malloc_for_memory_run(on: bool) -> None:
    """``on``: every buffer of 64 KiB or more is its own mapping, returned to the system when freed, and
    what glibc keeps of earlier buffers is returned now, so the resident size tracks live memory. ``off``:
    back to large buffers from the heap (glibc's steady state after warm-up), for the timed runs, since
    per-buffer mappings cost page faults on every call."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 65536 if on else 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 0 if on else 64 << 20)  # M_TRIM_THRESHOLD
        if on:
            libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the peak may miss reused freed memory
        pass


def _topk_table(q, k, keys):
    """Top-``keys`` keys per query of the head-averaged scores, as a bool table (L, S); chunked."""
    import torch

    qm, km = q.float().mean(1), k.float().mean(1)  # (L, D), (S, D)
    table = torch.zeros(q.size(0), k.size(0), dtype=torch.bool, device=q.device)
    for i0 in range(0, q.size(0), 1024):
        top = (qm[i0:i0 + 1024] @ km.T).topk(min(keys, k.size(0)), dim=1).indices  # (c, keys)
        table[i0:i0 + 1024].scatter_(1, top, True)
    return table


def _setup(case):
    """Inputs, structure and the call for one case; returns (run, prep_s, flops)."""
    import torch
    import torch.nn.functional as F

    from graphattn import graphs, ops, patterns

    torch.manual_seed(0)
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    L, H, D, method, pattern, mode = case["L"], case["heads"], case["dim"], case["method"], case["pattern"], case["mode"]
    grad = mode == "fwdbwd"
    q, k, v = (torch.randn(L, H, D, device=device, dtype=dtype) for _ in range(3))  # (L, H, D)
    table = None
    if pattern == "complete":
        pat = patterns.full()
    elif pattern == "window":
        pat = patterns.window(WINDOW, WINDOW)
    elif pattern == "random":  # bind (an L x S table for mask_mod) only where a mask is needed
        pat = patterns.random(KEYS, seed=0)
        pat = pat.bind(L, L) if method in ("flex", "sdpa_mask") else pat
    else:
        table = _topk_table(q, k, KEYS)  # (L, S)
        pat = None
    flops = 4 * num_edges(pattern, L) * H * D * (3 if grad else 1)
    t0 = time.perf_counter()
    if method in ("graphattn", "pyg"):
        if pattern == "complete" and method == "graphattn":
            edges = pat  # the dense path, no edges built
        elif table is not None:
            edges = graphs.mask_to_edge_index(table).to(device)
        else:
            edges = pat.edge_index(L).to(device)
        if method != "pyg" and isinstance(edges, torch.Tensor):
            ops.prepare(edges, L, device=device).tiles()
    elif method == "sdpa_mask":
        mask = table if table is not None else pat.mask(L).to(device)  # (L, S)
    elif method == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if table is not None:
            def mask_mod(b, h, q_idx, kv_idx):
                return table[q_idx, kv_idx]
        else:
            mask_mod = pat.mask_mod
        block_mask = None if pattern == "complete" else create_block_mask(mask_mod, None, None, L, L, device=device)
        flex = torch.compile(flex_attention, dynamic=False)
    prep_s = time.perf_counter() - t0

    if method == "pyg":
        from torch_geometric.nn import TransformerConv

        layer = TransformerConv(H * D, D, heads=H, root_weight=False).to(device=device, dtype=dtype)
        layer.lin_query = layer.lin_key = layer.lin_value = torch.nn.Identity()  # the attention part only
        x = torch.randn(L, H * D, device=device, dtype=dtype, requires_grad=grad)  # q = k = v = x (L, H*D)
        inputs = [x]

        def call():
            return layer(x, edges)
    else:
        if method == "graphattn":
            inputs = [t.requires_grad_(grad) for t in (q, k, v)]

            def call():
                return ops.attention(q, k, v, edges, need_weights=False)[0]
        else:
            qd, kd, vd = (t.transpose(0, 1).unsqueeze(0).contiguous().requires_grad_(grad) for t in (q, k, v))
            inputs = [qd, kd, vd]  # (1, H, L, D)
            if method == "sdpa":
                def call():
                    return F.scaled_dot_product_attention(qd, kd, vd)
            elif method == "sdpa_mask":
                def call():
                    return F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask)
            else:
                def call():
                    return flex(qd, kd, vd, block_mask=block_mask)

    def run():
        if not grad:
            with torch.no_grad():
                call()
            return
        for t in inputs:
            t.grad = None
        out = call()
        out.backward(torch.ones_like(out))

    return run, prep_s, flops


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def worker(case: dict) -> dict:
    """Run one case in this process and return its measurements."""
    import gc

    import torch

    if case.get("threads"):
        torch.set_num_threads(case["threads"])
    device = torch.device(case["device"])
    run, prep_s, flops = _setup(case)
    t0 = time.perf_counter()
    run()
    _sync(device)
    first = time.perf_counter() - t0
    times = []
    repeats = case["repeats"] if first < 10.0 else 0
    if case["method"] == "flex":  # the first call compiles: always time at least one more
        repeats = case["repeats"] if first < 30.0 else 1
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - t0)
    times = times or [first]
    gc.collect()
    reset, read = _memory_probe(device)
    _malloc_for_memory_run(True)
    base = reset()
    run()
    peak = read(base)
    del run
    gc.collect()
    _malloc_for_memory_run(False)
    median = sorted(times)[len(times) // 2]
    return dict(time_s=median, time_min_s=min(times), runs=len(times), prep_s=prep_s,
                compile_s=max(first - median, 0.0) if case["method"] == "flex" else None,
                peak_bytes=peak, gflops=flops / median / 1e9)


def _worker_main() -> None:
    """Measure the cases given as a JSON list on stdin, printing one ``RESULT`` line per case."""
    for case in json.loads(sys.stdin.read()):
        print("RESULT " + json.dumps(worker(case)), flush=True)


def _spawn(cases: list[dict], timeout: float) -> list[dict]:
    """Run ``worker`` on ``cases`` in a fresh interpreter; a crash or timeout becomes the ``status``
    of the case it hit, and the cases after it run in a new interpreter."""
    env = dict(os.environ)
    code = "from graphattn.bench import _worker_main; _worker_main()"
    results: list[dict] = []
    while len(results) < len(cases):
        todo = cases[len(results):]
        try:
            proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(todo), capture_output=True,
                                  text=True, timeout=timeout * len(todo), env=env)
            stdout, error = proc.stdout, None
            if proc.returncode:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                error = f"failed (rc {proc.returncode}): {tail[:120]}"
        except subprocess.TimeoutExpired as err:
            stdout = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
            error = f"timeout > {timeout:.0f} s"
        done = [dict(status="ok", **json.loads(line[7:])) for line in stdout.splitlines()
                if line.startswith("RESULT ")]
        results += done
        if len(results) < len(cases) and error is not None:
            results.append(dict(status=error))
    return results


def matmul_gflops(device: str = "cpu", dtype: str = "float32", n: int = 2048, threads: int | None = None) -> float:
    """GFLOP/s of a plain ``torch.mm`` of two (n, n) matrices (median of 5)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    a = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
    a @ a
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        a @ a
        _sync(torch.device(device))
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / sorted(times)[2] / 1e9


# ------------------------------------------------------------------------------ the grid and the report
def grid(args) -> list[dict]:
    """All cases of this run, in the order they are measured."""
    sizes = args.sizes or (FULL_SIZES if args.full else DEFAULT_SIZES)
    base = dict(heads=args.heads, dim=args.dim, dtype=args.dtype, device=args.device, repeats=args.repeats,
                threads=args.threads)
    cases = [dict(base, pattern=p, L=L, method=m, mode=mode)
             for p in args.patterns for L in sizes for mode in args.modes for m in args.methods]
    if args.scaling or args.full:
        cases += [dict(base, pattern=p, L=L, method="graphattn", mode="fwd", sweep="scaling")
                  for p, Ls in SCALING.items() for L in Ls]
    return cases


def measure(cases: list[dict], args) -> list[dict]:
    """Run every case (skipping what cannot fit or does not apply), one interpreter per (pattern, L)."""
    from rich.progress import Progress

    itemsize = {"float32": 4, "float64": 8, "bfloat16": 2}[args.dtype]
    rows, groups = [], {}
    for case in cases:
        row = dict(case, edges=num_edges(case["pattern"], case["L"]))
        why = applicable(case["method"], case["pattern"], case["mode"], args.device)
        need = estimate_bytes(case["method"], case["pattern"], case["L"], case["mode"], case["heads"],
                              case["dim"], itemsize)
        if why:
            row["status"] = why
        elif need > args.memory_budget * 2 ** 30:
            row["status"] = f"skipped: needs ~{need / 2 ** 30:.1f} GiB > budget {args.memory_budget:g} GiB"
        else:
            groups.setdefault((case["pattern"], case["L"], case.get("sweep")), []).append(len(rows))
        rows.append(row)
    with Progress(transient=False) as progress:
        task = progress.add_task("bench", total=sum(len(g) for g in groups.values()))
        for (pattern, L, _), idx in groups.items():
            progress.update(task, description=f"{pattern} L={L}: {len(idx)} cases")
            for i, result in zip(idx, _spawn([cases[i] for i in idx], args.timeout)):
                rows[i].update(result)
            progress.advance(task, len(idx))
    return rows


def add_ratios(rows: list[dict]) -> None:
    """``time_ratio`` and ``memory_ratio``: the method over its graphattn reference on the same case."""
    ref = {(r["pattern"], r["L"], r["mode"], r.get("sweep")): r for r in rows
           if r.get("status") == "ok" and r["method"] == "graphattn"}
    for r in rows:
        base = ref.get((r["pattern"], r["L"], r["mode"], r.get("sweep")))
        if r.get("status") == "ok" and base is not None:
            r["time_ratio"] = r["time_s"] / base["time_s"]
            r["memory_ratio"] = r["peak_bytes"] / max(base["peak_bytes"], 1)


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets, each with the measured ratio (met / missed / not measured)."""
    get = {(r["pattern"], r["L"], r["mode"], r["method"]): r for r in rows if r.get("sweep") != "scaling"}
    lines = []

    def check(text, pattern, L, mode, method, key, op, bound):
        r = get.get((pattern, L, mode, method))
        what = ("time" if key == "time_ratio" else "memory") + f" {method}/graphattn"
        if r is None or key not in r:
            if r is not None:
                lines.append(f"[not measured] {text} ({pattern} L={L} {mode}: {r.get('status')})")
            return
        ok = r[key] >= bound if op == ">=" else r[key] <= bound
        lines.append(f"[{'met' if ok else 'MISSED'}] {text}: {what} = {r[key]:.2f} ({pattern} L={L} {mode})")

    for mode in MODES:
        for L in (1024, 4096):
            check("complete: time <= 1.2x SDPA", "complete", L, mode, "sdpa", "time_ratio", ">=", 1 / 1.2)
            check("complete: memory <= 1.5x SDPA", "complete", L, mode, "sdpa", "memory_ratio", ">=", 1 / 1.5)
        for L in (4096, 16384):
            for pattern in ("random", "topk"):
                check(f"{pattern}: >= 10x faster than flex", pattern, L, mode, "flex", "time_ratio", ">=", 10)
                check(f"{pattern}: >= 20x faster than SDPA+mask", pattern, L, mode, "sdpa_mask", "time_ratio", ">=", 20)
            check("window: time <= 1.5x flex", "window", L, mode, "flex", "time_ratio", ">=", 1 / 1.5)
            check("window: >= 10x faster than SDPA+mask", "window", L, mode, "sdpa_mask", "time_ratio", ">=", 10)
        for pattern in ("window", "random", "topk"):
            for L in sorted({r["L"] for r in rows}):
                if (pattern, L, mode, "pyg") in get:
                    check(f"{pattern}: >= 5x faster than TransformerConv", pattern, L, mode, "pyg", "time_ratio", ">=", 5)
                    check(f"{pattern}: >= 5x less memory than TransformerConv", pattern, L, mode, "pyg",
                          "memory_ratio", ">=", 5)
    for (pattern, L, method), r in sorted(((k[0], k[1], k[3]), v) for k, v in get.items() if k[2] == "fwd"):
        fb = get.get((pattern, L, "fwdbwd", method))
        if method != "graphattn" and "time_ratio" in r and fb is not None and "time_ratio" in fb:
            ok = fb["time_ratio"] >= r["time_ratio"] / 2
            lines.append(f"[{'met' if ok else 'MISSED'}] fwd+bwd ratio >= fwd ratio / 2: {method}/graphattn "
                         f"{fb['time_ratio']:.2f} vs {r['time_ratio']:.2f} ({pattern} L={L})")
    for pattern in SCALING:
        sweep = [r for r in rows if r.get("sweep") == "scaling" and r["pattern"] == pattern and r.get("status") == "ok"]
        if len(sweep) < 2:
            continue
        x = [math.log(r["edges"]) for r in sweep]
        y = [math.log(r["time_s"]) for r in sweep]
        mx, my = sum(x) / len(x), sum(y) / len(y)
        slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
        ok = 0.9 <= slope <= 1.1
        lines.append(f"[{'met' if ok else 'MISSED'}] time linear in E ({pattern}, growing L): log-log slope "
                     f"{slope:.2f} (E = {sweep[0]['edges']:.1e} ... {sweep[-1]['edges']:.1e}, fwd)")
    return lines


def report(rows: list[dict], matmul: float, args) -> None:
    """The table to stdout; CSV, JSON and optionally a PNG under ``args.out``."""
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    frame = pd.DataFrame(rows)
    for col in ("time_s", "prep_s", "compile_s", "peak_bytes", "gflops", "time_ratio", "memory_ratio"):
        if col not in frame:
            frame[col] = float("nan")
    frame["peak_mib"] = frame["peak_bytes"] / 2 ** 20
    frame["pct_matmul"] = 100 * frame["gflops"] / matmul
    table = Table(title=f"graphattn bench — H={args.heads}, D={args.dim}, {args.dtype}, {args.device}, "
                        f"plain matmul {matmul:.0f} GFLOP/s; ratio = method / graphattn (> 1: graphattn wins)")
    cols = ["pattern", "L", "edges", "mode", "method", "time_s", "time_ratio", "peak_mib", "memory_ratio",
            "gflops", "pct_matmul", "prep_s", "compile_s", "status"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("pattern", "mode", "method", "status") else "right")
    for _, r in frame.iterrows():
        table.add_row(*[_fmt(r[c]) for c in cols])
    console = Console(width=200)
    console.print(table)
    for line in targets(rows):
        console.print(line, markup=False)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    frame.drop(columns=["peak_bytes"]).to_csv(args.out / f"bench-{stamp}.csv", index=False)
    import torch

    meta = dict(date=time.strftime("%Y-%m-%d %H:%M"), matmul_gflops=matmul, argv=sys.argv[1:],
                threads=args.threads or torch.get_num_threads(), torch=torch.__version__, machine=_machine(),
                load=getattr(args, "load", None), targets=targets(rows))
    (args.out / f"bench-{stamp}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str))
    (args.out / f"bench-{stamp}.md").write_text(markdown(rows, meta))
    if args.plot:
        _plot(frame, args.out / f"bench-{stamp}.png")
    console.print(f"wrote {args.out}/bench-{stamp}.csv, .json, .md" + (" and .png" if args.plot else ""))


def markdown(rows: list[dict], meta: dict) -> str:
    """The results as a markdown page: date, machine, the table, the targets."""
    cols = ["pattern", "L", "mode", "method", "time_s", "time_ratio", "peak_mib", "memory_ratio", "gflops",
            "prep_s", "compile_s", "status"]
    lines = [f"# graphattn bench, {meta['date']}", "", f"Arguments: `{' '.join(meta['argv']) or '(defaults)'}`; "
             f"torch threads: {meta.get('threads', '?')}; 1-minute load average at start and end: "
             f"{meta.get('load')}; plain matmul: {meta['matmul_gflops']:.0f} GFLOP/s; "
             "ratio = method / graphattn (> 1: graphattn is faster / smaller); times in seconds, peaks in MiB "
             "above the resident size before the call.", "", "```", meta["machine"], "```", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        r = dict(r, peak_mib=r["peak_bytes"] / 2 ** 20 if r.get("peak_bytes") is not None else None)
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    lines += ["", "## Targets", ""] + [f"- {t}" for t in meta["targets"]]
    return "\n".join(lines) + "\n"


def markdown_from_json(path) -> Path:
    """Write ``<path>.md`` next to a results JSON file written by ``graphattn bench``."""
    path = Path(path)
    data = json.loads(path.read_text())
    out = path.with_suffix(".md")
    out.write_text(markdown(data["rows"], data["meta"]))
    return out


def _fmt(x) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        if math.isnan(x):
            return ""
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def _machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines()
        keep = ("Architecture", "CPU(s):", "Model name", "Thread(s)", "Core(s)", "L1d", "L2", "L3")
        return "\n".join(line for line in out if line.startswith(keep))
    except (OSError, subprocess.SubprocessError):
        import platform

        return platform.processor() or platform.machine()


def _plot(frame, path) -> None:
    """Time against L, one panel per pattern; colour = method, solid = fwd, dashed = fwd+bwd."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = frame[(frame["status"] == "ok") & frame.get("sweep", frame["status"]).ne("scaling")]
    pats = list(dict.fromkeys(ok["pattern"]))
    colors = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, axes = plt.subplots(1, max(len(pats), 1), figsize=(4 * max(len(pats), 1), 3.5), squeeze=False)
    for ax, pat in zip(axes[0], pats):
        for (method, mode), g in ok[ok["pattern"] == pat].groupby(["method", "mode"]):
            g = g.sort_values("L")
            ax.loglog(g["L"], g["time_s"], marker="o", color=colors[method], ls="-" if mode == "fwd" else "--",
                      label=f"{method} {mode}")
        ax.set_title(pat)
        ax.set_xlabel("L (nodes)")
        ax.set_ylabel("time (s)")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args, cases: list[dict] | None = None) -> int:
    """Run the grid (or ``cases``), print the table and the targets, write the files; 0, or 2 on a bad device."""
    import torch

    try:
        device = torch.device(args.device)
    except RuntimeError:
        print(f"graphattn bench: Expected '--device' to be a torch device such as cpu or cuda (got {args.device!r})",
              file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print("graphattn bench: '--device cuda' asked for, but this torch build sees no CUDA device", file=sys.stderr)
        return 2
    cases = grid(args) if cases is None else cases
    load = os.getloadavg()[0]
    matmul = matmul_gflops(args.device, args.dtype, threads=args.threads)
    rows = measure(cases, args)
    add_ratios(rows)
    args.load = (load, os.getloadavg()[0])  # other jobs on the machine distort every number: recorded
    report(rows, matmul, args)
    return 0
