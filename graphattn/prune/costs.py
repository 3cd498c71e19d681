"""What a row costs beside the real baselines: peak memory of a block, and the reference forward passes.

- :class:`PeakMemory`: the extra memory a block needs at its peak, in MiB:
  on CUDA ``torch.cuda.max_memory_allocated`` over the block less what was
  allocated at its start; on Linux CPUs the process's resident high-water
  mark (``VmHWM``, reset through ``/proc/self/clear_refs``) less its resident
  size at the start; None where neither can be read.
- :func:`timed_encode`: one pass of :func:`graphattn.prune.models.encode`
  under an attention implementation (``"sdpa"``, ``"eager"``), with its wall
  time and peak memory: what the graph rows' forward passes are compared with.
"""

from __future__ import annotations

import time

import torch

from graphattn.prune import models

__all__ = ["PeakMemory", "timed_encode"]

_STATUS, _CLEAR = "/proc/self/status", "/proc/self/clear_refs"


def _status_kib(field: str) -> int | None:
    try:
        with open(_STATUS, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _trim() -> None:
    """Hand freed heap memory back to the system (glibc ``malloc_trim``), so that the row's start is low."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """``with PeakMemory(device) as peak: ...``; then ``peak.mib`` (float or None) and ``peak.how`` (str).

    CPU readings are of the whole process (other threads count), at the kernel's page granularity, after
    freed heap memory is handed back (``malloc_trim``); 0 means the row fit in memory the process held.
    """

    def __init__(self, device="cpu"):
        self.device, self.mib, self.how = torch.device(device), None, "unavailable"

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            self._start = None
            _trim()
            try:
                with open(_CLEAR, "w", encoding="ascii") as f:
                    f.write("5")  # resets VmHWM to the current resident size (Linux >= 4.0)
                self._start = _status_kib("VmRSS")
            except OSError:
                pass
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mib = (torch.cuda.max_memory_allocated(self.device) - self._start) / 2**20
            self.how = "CUDA max_memory_allocated over the row, less its start"
        elif self._start is not None and (high := _status_kib("VmHWM")) is not None:
            self.mib = max(0, high - self._start) / 1024
            self.how = "process resident high-water mark (VmHWM) over the row, less its start"
        return False


def timed_encode(model, tokenizer, texts, max_length, batch_size, pooling, implementation, step=None):
    """``(embeddings, nll, seconds, peak MiB)`` of one forward pass over ``texts`` under ``implementation``."""
    with models.attention_implementation(model, implementation), PeakMemory(model.device) as peak:
        t0 = time.perf_counter()
        emb, nll = models.encode(model, tokenizer, texts, max_length, batch_size, pooling, step=step)
        seconds = time.perf_counter() - t0
    return emb, nll, seconds, peak.mib
