"""Attention records in bertviz's interactive head and model views (an optional extra: ``pip install bertviz``).

bertviz (Vig 2019) draws the weights of every layer and head as lines between
two columns of tokens, in a notebook. It takes dense weights, so a sparse
record is exported with 0 on its missing edges; :func:`bertviz_attention`
also returns which cells are missing, since bertviz draws a missing edge like
an edge of weight 0 (``viz.attention_heatmap(..., mask=...)`` shows the difference).
"""

from __future__ import annotations

from graphattn.validate import message

__all__ = ["bertviz_attention", "bertviz_view"]

VIEWS = ("head", "model")


def bertviz_attention(record) -> dict:
    """An attention record in the format of ``bertviz.head_view`` and ``bertviz.model_view``.

    Parameters
    ----------
    record : graphattn.interop.records.AttentionRecord
        One sequence's per-layer graphs (anything with ``tokens``, ``dense()``
        and ``mask(layer)``).

    Returns
    -------
    dict
        ``"attention"``: tuple of one Tensor per layer, shape (1, H, N, N),
        queries on rows (bertviz's layout: a batch of one); ``"tokens"``: list
        of N str; ``"missing"``: tuple of one bool Tensor (N, N) per layer, True
        where the record has no edge (the weight exported there is 0).
    """
    dense = record.dense()  # (layers, H, N, N)
    attention = tuple(dense[layer][None] for layer in range(dense.size(0)))  # (1, H, N, N) each
    missing = tuple(~record.mask(layer) for layer in range(dense.size(0)))  # (N, N) each
    return {"attention": attention, "tokens": list(record.tokens), "missing": missing}


def bertviz_view(record, view: str = "head", **kwargs):
    """Bertviz's interactive head or model view of a record, returned as an HTML object (never displayed).

    Parameters
    ----------
    record : graphattn.interop.records.AttentionRecord
    view : {"head", "model"}, default "head"
    **kwargs
        Passed to ``bertviz.head_view`` / ``bertviz.model_view`` (e.g. ``layer``, ``heads``).

    Returns
    -------
    IPython.display.HTML
        Show it in a notebook by making it a cell's last expression.

    Raises
    ------
    ValueError
        If ``view`` is not "head" or "model".
    ImportError
        If bertviz is not installed (the message holds the install command).
    """
    if view not in VIEWS:
        raise ValueError(message("view", f"one of {VIEWS}", repr(view)))
    try:
        import bertviz
    except ImportError as err:
        raise ImportError(
            "bertviz's views need the optional package bertviz; install it with: pip install bertviz"
        ) from err
    data = bertviz_attention(record)
    draw = bertviz.head_view if view == "head" else bertviz.model_view
    return draw(attention=data["attention"], tokens=data["tokens"], html_action="return", **kwargs)
