"""The benchmark grid: patterns, methods, sizes, edge counts and memory estimates (no torch needed)."""

from __future__ import annotations

__all__ = [
    "PATTERNS",
    "METHODS",
    "MODES",
    "DEFAULT_SIZES",
    "FULL_SIZES",
    "SCALING",
    "WINDOW",
    "KEYS",
    "num_edges",
    "estimate_bytes",
    "applicable",
    "grid",
]

PATTERNS = ("complete", "window", "random", "topk")
METHODS = ("graphattn", "sdpa", "sdpa_mask", "flex", "pyg")
MODES = ("fwd", "fwdbwd")
DEFAULT_SIZES = (1024, 4096)
FULL_SIZES = (1024, 2048, 4096, 8192, 16384)
SCALING = {"window": (1024, 4096, 16384, 65536), "random": (4096, 16384, 65536, 262144)}  # E = 1.3e5 ... 8.4e6
WINDOW, KEYS = 64, 32  # |i - j| <= 64; 32 keys per query for random and top-k


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
    from graphattn.validate import message  # here: the command's --help imports no torch

    raise ValueError(message("method", f"one of {METHODS}", repr(method)))


def applicable(method: str, pattern: str, mode: str, device: str) -> str | None:
    """None if the method runs this case, else why not."""
    if method == "sdpa" and pattern != "complete":
        return "n/a: no mask (complete graph only)"
    if method == "flex" and mode == "fwdbwd" and device == "cpu":
        return "n/a: FlexAttention has no CPU backward"
    return None


def grid(args) -> list[dict]:
    """All cases of this run, in the order they are measured."""
    sizes = args.sizes or (FULL_SIZES if args.full else DEFAULT_SIZES)
    base = dict(
        heads=args.heads, dim=args.dim, dtype=args.dtype, device=args.device, repeats=args.repeats, threads=args.threads
    )
    cases = [
        dict(base, pattern=p, L=L, method=m, mode=mode)
        for p in args.patterns
        for L in sizes
        for mode in args.modes
        for m in args.methods
    ]
    if args.scaling or args.full:
        cases += [
            dict(base, pattern=p, L=L, method="graphattn", mode="fwd", sweep="scaling")
            for p, Ls in SCALING.items()
            for L in Ls
        ]
    return cases
