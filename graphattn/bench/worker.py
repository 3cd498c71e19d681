"""One benchmark case, measured in a fresh interpreter: inputs, the call, time and peak memory.

See :mod:`graphattn.bench` for what is measured and how.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from graphattn.bench.cases import KEYS, WINDOW, num_edges

__all__ = ["worker", "spawn", "matmul_gflops"]


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
    per-buffer mappings cost page faults on every call.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 65536 if on else 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 0 if on else 64 << 20)  # M_TRIM_THRESHOLD
        if on:
            libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the peak may miss reused freed memory
        pass


MALLOC_STATES = ("steady", "glibc")


def malloc_for_timing(state: str) -> None:
    """Put glibc's allocator in the state every timed step of a benchmark runs in; call once, before any step.

    ``"steady"``: large buffers come from the heap and stay there (``M_MMAP_THRESHOLD`` 32 MiB,
    ``M_TRIM_THRESHOLD`` 64 MiB: what :func:`_malloc_for_memory_run` restores after each memory probe), so
    every row is timed alike whatever ran before it. ``"glibc"``: glibc's defaults left alone. Its
    thresholds then follow the largest buffer freed so far, and the free top of the heap is returned to the
    system after a step, so a process whose buffers are all small (a lean model) faults its pages in again
    on every step: measured 2026-12-02, a compiled two-layer ``ga.TransformerConv`` (sparse graph, D = 8)
    took 3,900 page faults and about 30 % more time per step than in ``"steady"``, PyG's about 300.
    Memory probes change the state, so with ``"glibc"`` the benchmarks skip them.
    """
    if state not in MALLOC_STATES:
        from graphattn.validate import message

        raise ValueError(message("malloc", f"one of {MALLOC_STATES}", repr(state)))
    if state == "steady":
        _malloc_for_memory_run(False)


def cpu_summary() -> str:
    """One line naming the CPU the benchmarks run on: model, family/model numbers, vector width, L3.

    Results from two machines of one kind can differ by 2x (2026-12-03: the fused kernel at D = 8 on an
    AVX2-only AMD EPYC against the AVX-512 one of the day before), so every results file records it.
    """
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return platform.processor() or platform.machine()
    first = info.split("\n\n", 1)[0]
    field = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    field = {k.strip(): v.strip() for k, v in field.items()}
    flags = set(field.get("flags", "").split())
    vector = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "no avx2"
    cpus = info.count("processor\t:")
    l3 = ""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            l3 = f", L3 {f.read().strip()}"
    except OSError:
        pass
    return (
        f"{field.get('model name', platform.processor())}, family {field.get('cpu family', '?')} "
        f"model {field.get('model', '?')}, {cpus} CPUs, {vector}{l3}"
    )


def _topk_table(q, k, keys):
    """Top-``keys`` keys per query of the head-averaged scores, as a bool table (L, S); 1024 rows at a time."""
    import torch

    from graphattn.patterns import topk_mask

    qm, km = q.float().mean(1), k.float().mean(1)  # (L, D), (S, D)
    table = torch.zeros(q.size(0), k.size(0), dtype=torch.bool, device=q.device)  # (L, S)
    for i0 in range(0, q.size(0), 1024):
        table[i0 : i0 + 1024] = topk_mask(qm[i0 : i0 + 1024] @ km.T, keys)  # (c, D) · (D, S) -> (c, S)
    return table


def _pattern(case, q, k):
    """The case's pattern (or, for top-k, its table (L, S) of the head-averaged scores): (Pattern, table)."""
    from graphattn import patterns

    L, pattern = case["L"], case["pattern"]
    if pattern == "complete":
        return patterns.full(), None
    if pattern == "window":
        return patterns.window(WINDOW, WINDOW), None
    if pattern == "random":  # bind (an L x S table for mask_mod) only where a mask is needed
        pat = patterns.random(KEYS, seed=0)
        return (pat.bind(L, L) if case["method"] in ("flex", "sdpa_mask") else pat), None
    return None, _topk_table(q, k, KEYS)  # (L, S)


def _structure(case, pat, table, device):
    """What the method needs besides q, k, v, built once (timed as ``prep_s``): edges, a mask or a BlockMask."""
    import torch

    from graphattn import graphs, ops

    L, method = case["L"], case["method"]
    if method in ("graphattn", "pyg"):
        if case["pattern"] == "complete" and method == "graphattn":
            return pat  # the dense path, no edges built
        edges = graphs.mask_to_edge_index(table).to(device) if table is not None else pat.edge_index(L).to(device)
        if method == "graphattn":
            ops.prepare(edges, L, device=device).tiles()
        return edges
    if method == "sdpa_mask":
        return table if table is not None else pat.mask(L).to(device)  # (L, S)
    if method == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if table is not None:

            def mask_mod(b, h, q_idx, kv_idx):
                return table[q_idx, kv_idx]
        else:
            mask_mod = pat.mask_mod
        block_mask = (
            None if case["pattern"] == "complete" else create_block_mask(mask_mod, None, None, L, L, device=device)
        )
        return torch.compile(flex_attention, dynamic=False), block_mask
    return None


def _call(case, q, k, v, structure, grad: bool):
    """The timed call and the tensors whose gradients it computes: (call, inputs)."""
    import torch
    import torch.nn.functional as F

    from graphattn import ops

    method, (L, H, D) = case["method"], q.shape
    if method == "pyg":
        from torch_geometric.nn import TransformerConv

        layer = TransformerConv(H * D, D, heads=H, root_weight=False).to(device=q.device, dtype=q.dtype)
        layer.lin_query = layer.lin_key = layer.lin_value = torch.nn.Identity()  # the attention part only
        x = torch.randn(L, H * D, device=q.device, dtype=q.dtype, requires_grad=grad)  # q = k = v = x (L, H*D)
        return (lambda: layer(x, structure)), [x]
    if method == "graphattn":
        inputs = [t.requires_grad_(grad) for t in (q, k, v)]
        return (lambda: ops.attention(q, k, v, structure, need_weights=False)[0]), inputs
    qd, kd, vd = (t.transpose(0, 1).unsqueeze(0).contiguous().requires_grad_(grad) for t in (q, k, v))  # (1, H, L, D)
    if method == "sdpa":
        return (lambda: F.scaled_dot_product_attention(qd, kd, vd)), [qd, kd, vd]
    if method == "sdpa_mask":
        return (lambda: F.scaled_dot_product_attention(qd, kd, vd, attn_mask=structure)), [qd, kd, vd]
    flex, block_mask = structure
    return (lambda: flex(qd, kd, vd, block_mask=block_mask)), [qd, kd, vd]


def _setup(case):
    """Inputs, structure and the call for one case; returns (run, prep_s, flops)."""
    import torch

    torch.manual_seed(0)
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    L, H, D = case["L"], case["heads"], case["dim"]
    grad = case["mode"] == "fwdbwd"
    q, k, v = (torch.randn(L, H, D, device=device, dtype=dtype) for _ in range(3))  # (L, H, D)
    pat, table = _pattern(case, q, k)
    flops = 4 * num_edges(case["pattern"], L) * H * D * (3 if grad else 1)
    t0 = time.perf_counter()
    structure = _structure(case, pat, table, device)
    prep_s = time.perf_counter() - t0
    call, inputs = _call(case, q, k, v, structure, grad)

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
    return dict(
        time_s=median,
        time_min_s=min(times),
        runs=len(times),
        prep_s=prep_s,
        compile_s=max(first - median, 0.0) if case["method"] == "flex" else None,
        peak_bytes=peak,
        gflops=flops / median / 1e9,
    )


def _worker_main() -> None:
    """Measure the cases given as a JSON list on stdin, printing one ``RESULT`` line per case."""
    for case in json.loads(sys.stdin.read()):
        print("RESULT " + json.dumps(worker(case)), flush=True)


def spawn(cases: list[dict], timeout: float) -> list[dict]:
    """Run ``worker`` on ``cases`` in a fresh interpreter; a crash or timeout becomes the ``status``
    of the case it hit, and the cases after it run in a new interpreter.
    """
    env = dict(os.environ)
    code = "from graphattn.bench.worker import _worker_main; _worker_main()"
    results: list[dict] = []
    while len(results) < len(cases):
        todo = cases[len(results) :]
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code],
                input=json.dumps(todo),
                capture_output=True,
                text=True,
                timeout=timeout * len(todo),
                env=env,
            )
            stdout, error = proc.stdout, None
            if proc.returncode:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                error = f"failed (rc {proc.returncode}): {tail[:120]}"
        except subprocess.TimeoutExpired as err:
            stdout = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
            error = f"timeout > {timeout:.0f} s"
        done = [dict(status="ok", **json.loads(line[7:])) for line in stdout.splitlines() if line.startswith("RESULT ")]
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
    return 2 * n**3 / sorted(times)[2] / 1e9
