"""Provenance of a result: package versions, the git commit of graphattn, date, load and threads."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata

__all__ = ["environment"]


def environment(packages: tuple[str, ...] = ("torch", "numpy")) -> dict:
    """Versions of ``packages``, graphattn's git commit (when a checkout), date, load average and threads.

    Parameters
    ----------
    packages : tuple of str, default ("torch", "numpy")
        Distribution names whose installed versions shape the numbers (None when not installed).

    Returns
    -------
    dict
        ``versions`` (name -> version, with ``python`` and ``graphattn``), ``git_commit`` (or None),
        ``date_utc``, ``load_average`` (1, 5 and 15 minutes), ``torch_threads``, ``cpu_count``, ``cuda``.
    """
    import torch

    import graphattn

    versions = {"python": platform.python_version(), "graphattn": graphattn.__version__}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                cwd=os.path.dirname(graphattn.__file__),
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "versions": versions,
        "git_commit": commit,
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_average": list(os.getloadavg()),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.is_available(),
    }
