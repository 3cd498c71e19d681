"""Errata: the claims of the book this project teaches from that do not hold, each in the book's scope, measured.

:func:`errata` returns one row per claim: the claim as the book states it, one
computed line naming the actual error, and the numbers behind it. ``graphattn
steps`` prints them (``--minilm`` adds the four that need the pretrained
model), notebook 1 shows them, and ``docs/learn.md`` holds
:func:`errata_markdown`'s table, which a test regenerates.

``book`` measures the claims that need no model, ``minilm`` those about a
pretrained model (all-MiniLM-L6-v2, eager).
"""

from __future__ import annotations

from graphattn.errata import book
from graphattn.errata.minilm import ERRATA_SENTENCE, OTHER_SENTENCE
from graphattn.steps import BOOK_SCALED, BOOK_WEIGHTS

__all__ = [
    "BOOK_SCALED",
    "BOOK_WEIGHTS",
    "ERRATA_SENTENCE",
    "OTHER_SENTENCE",
    "errata",
    "errata_lines",
    "errata_markdown",
]


def errata(model: bool = False) -> list[dict]:
    """The claims of the book that do not hold, each with one line computed here.

    Parameters
    ----------
    model : bool, default False
        Also measure the four claims about a pretrained model (over-smoothing,
        [CLS], "the same query", "irrelevant pairs") on the packaged
        all-MiniLM-L6-v2 (a few seconds; needs the ``hf`` extra). False: the
        seven claims that need no model.

    Returns
    -------
    list of dict
        One per claim: ``claim`` (what the book says, in its scope),
        ``measured`` (one computed line naming the actual error) and
        ``values`` (the numbers in it, Python floats, for checks).

    Raises
    ------
    ImportError
        If ``model`` is True and the model package or transformers is missing.

    Examples
    --------
    >>> rows = errata()
    >>> len(rows), rows[0]["measured"][:31]
    (7, 'the division is right (1.05 / 0')
    """
    rows = [
        book.softmax_worked(),
        book.learnable_edges(),
        book.square(),
        book.very_negative(),
        book.mask_after(),
        book.encoder(),
        book.diagonal(),
    ]
    if model:
        from graphattn.errata.minilm import errata_minilm

        rows += errata_minilm()
    return rows


def errata_lines(rows: list[dict]) -> list[str]:
    """``graphattn steps``'s errata section: per claim, the claim and its computed correction."""
    lines = ["", "Errata: claims of the book that do not hold, each measured here"]
    for n, row in enumerate(rows, start=1):
        lines += [f"{n}. claim:    {row['claim']}", f"   measured: {row['measured']}"]
    return lines


def errata_markdown(rows: list[dict]) -> str:
    """The errata as a Markdown table (``docs/learn.md`` holds this text; a test regenerates it)."""
    lines = ["| the book says | measured here |", "|---|---|"]
    cells = [(row["claim"].replace("|", "\\|"), row["measured"].replace("|", "\\|")) for row in rows]
    lines += [f"| {claim} | {measured} |" for claim, measured in cells]
    return "\n".join(lines) + "\n"
