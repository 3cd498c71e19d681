"""What context a trained model uses: loss per position, and two long-range probes.

A window of W keys per query looks good on local statistics; these probes
catch what it cannot see (with l stacked layers its reach is l W bytes, the
receptive field):

1) :func:`position_loss`: bits per byte at each position t of a window of
   validation text (t bytes of context before the prediction). Dense keeps
   improving with t; a window flattens out beyond its reach.
2) :func:`repeat_probe`: bytes of real text whose best evidence is an earlier
   copy: the ``NGRAM`` bytes before position t followed by byte t occurred
   earlier in the window, its nearest earlier occurrence ``dist`` bytes back.
   Loss is averaged per distance bucket (``BUCKETS``); a bucket beyond a
   pattern's reach shows whether it still predicts repeated identifiers.
3) :func:`copy_probe`: a synthetic recall task. A random lowercase string
   is planted twice in validation text, ``d`` bytes apart; the loss on the
   second copy (after its first quarter, which names it) measures recall at
   distance d; a model that cannot recall pays its prior on a random
   lowercase letter, at least log2(26) = 4.7 bits.

All three use the same windows for every model (fixed positions and seeds),
so models are compared on the same bytes.
"""

from __future__ import annotations

import math

import torch

from graphattn.lm.data import eval_windows

__all__ = ["NGRAM", "BUCKETS", "position_loss", "repeat_probe", "copy_probe", "run_probes"]

NGRAM = 8  # context bytes that must match for a byte to count as a repeat
BUCKETS = (0, 64, 256, 1024, 4096, 1 << 30)  # distance buckets (lo, hi]
LN2 = math.log(2.0)


@torch.no_grad()
def _losses(model, x: torch.Tensor, y: torch.Tensor, device) -> torch.Tensor:
    """Per-byte loss in bits ``(n, T)``, one window at a time."""
    was = model.training
    model.eval()
    out = (
        torch.cat(
            [
                model.loss(x[b : b + 1].to(device), y[b : b + 1].to(device), reduction="none").cpu()
                for b in range(x.size(0))
            ]
        )
        / LN2
    )  # (n, T)
    model.train(was)
    return out


def position_loss(model, data: torch.Tensor, length: int, windows: int, device="cpu") -> list[float]:
    """Mean bits per byte at each position 0..length-1 over ``windows`` validation windows."""
    x, y = eval_windows(data, length, windows)  # (n, T), (n, T)
    return _losses(model, x, y, device).mean(0).tolist()  # (T,)


def repeat_distances(x: torch.Tensor, y: torch.Tensor, ngram: int = NGRAM) -> torch.Tensor:
    """For each target y[t]: the distance back to the nearest earlier occurrence of its (ngram + 1)-gram, else 0.

    The gram is ``x[t - ngram + 1 .. t]`` followed by ``y[t]`` (= x[t + 1]);
    an occurrence ending at target t' < t counts, at distance t - t'.
    Returns a LongTensor of x's shape ``(n, T)``.
    """
    out = torch.zeros_like(x)
    for b in range(x.size(0)):
        seq = bytes(x[b].tolist()) + bytes([int(y[b, -1])])  # the window's T + 1 bytes
        last: dict[bytes, int] = {}
        for t in range(ngram - 1, x.size(1)):
            gram = seq[t - ngram + 1 : t + 2]
            if gram in last:
                out[b, t] = t - last[gram]
            last[gram] = t
    return out


def repeat_probe(model, data: torch.Tensor, length: int, windows: int, device="cpu", bits=None) -> dict:
    """Bits per byte on repeated (ngram + 1)-grams, by distance bucket: ``{"lo-hi": (bpb, count)}``.

    ``bits`` ``(windows, length)``: the per-byte losses on these windows, when already computed.
    """
    x, y = eval_windows(data, length, windows)  # (n, T)
    bits = _losses(model, x, y, device) if bits is None else bits  # (n, T)
    dist = repeat_distances(x, y)  # (n, T)
    out = {}
    for lo, hi in zip(BUCKETS[:-1], BUCKETS[1:]):
        if lo >= length:
            break
        sel = (dist > lo) & (dist <= hi)  # (n, T)
        count = int(sel.sum())
        out[f"{lo}-{min(hi, length)}"] = (float(bits[sel].mean()) if count else float("nan"), count)
    return out


def copy_distances(length: int) -> tuple[int, list[int]]:
    """The planted string's length and the distances probed for sequences of ``length`` bytes."""
    seg = max(8, min(32, length // 8))
    return seg, sorted(
        {d for d in (length // 8, length // 4, length // 2, length - seg - 1) if seg <= d < length - seg}
    )


def copy_probe(model, data: torch.Tensor, length: int, windows: int, device="cpu", seed: int = 1234) -> dict:
    """Bits per byte on the second copy of a planted random string, per distance d: ``{d: bpb}``."""
    seg, distances = copy_distances(length)
    prime = seg // 4  # the first bytes of the copy say which string it is
    x, y = eval_windows(data, length, windows)  # (n, T)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for d in distances:
        seq = torch.cat([x, y[:, -1:]], dim=1).clone()  # (n, T + 1)
        start = length - d - seg  # the second copy ends at the window's end
        for b in range(windows):
            s = torch.randint(ord("a"), ord("z") + 1, (seg,), generator=g)  # (seg,)
            seq[b, start : start + seg] = s
            seq[b, start + d : start + d + seg] = s
        bits = _losses(model, seq[:, :-1], seq[:, 1:], device)  # (n, T)
        # the target at t is byte t + 1: bytes prime..seg-1 of the copy are targets t = start + d + prime - 1 ...
        first = start + d + prime - 1
        out[d] = float(bits[:, first : start + d + seg - 1].mean())
    return out


def run_probes(model, data: torch.Tensor, length: int, windows: int, device="cpu") -> dict:
    """All three probes: ``{"position_bpb": [...], "repeat": {...}, "copy": {...}}``."""
    x, y = eval_windows(data, length, windows)  # (n, T)
    bits = _losses(model, x, y, device)  # (n, T), shared by the first two probes
    return {
        "position_bpb": bits.mean(0).tolist(),
        "repeat": repeat_probe(model, data, length, windows, device, bits=bits),
        "copy": {str(k): v for k, v in copy_probe(model, data, length, windows, device).items()},
    }
