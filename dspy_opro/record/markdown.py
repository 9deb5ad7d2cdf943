"""Markdown building blocks of the run reports: scores on the paper's 0-100 scale, table cells, code and money.

Pure string functions with no knowledge of the run record; :mod:`dspy_opro.record.report` composes them into pages.
"""

from __future__ import annotations

import re
from typing import Any

CELL_CHARS = 200  # longer text is cut in table cells (the full text is in replies.json / the fenced blocks)
DASH = "—"


def pct(score: float | None) -> float | None:
    """A [0, 1] score on the 0-100 scale, rounded to one decimal."""
    return None if score is None else round(score * 100, 1)


def fmt_pct(score: float | None) -> str:
    return DASH if score is None else f"{score * 100:.1f}"


def fmt_row_pct(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f}"


def cell(text: Any, limit: int | None = CELL_CHARS) -> str:
    """Text made safe for one Markdown table cell: cut to ``limit`` characters, ``|``, ``\\`` and ``<`` escaped,
    line breaks as ``<br>``."""
    text = str(text).replace("\r\n", "\n").replace("\r", "\n")
    if limit is not None and len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<")
    return text.replace("\n", "<br>")


def inline(text: Any) -> str:
    """Text for a list item or a paragraph: on one line, with HTML-looking tags kept visible."""
    text = str(text).replace("\\", "\\\\").replace("<", "\\<")
    return " ".join(text.split())


def code(name: Any) -> str:
    """An identifier (a predictor's name) as a code span."""
    name = str(name)
    fence = "``" if "`" in name else "`"
    pad = " " if name.startswith("`") or name.endswith("`") else ""
    return f"{fence}{pad}{name}{pad}{fence}"


def fenced(text: str, info: str = "text") -> str:
    """``text`` in a fenced code block whose fence is longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = text if text.endswith("\n") else text + "\n"
    return f"{fence}{info}\n{body}{fence}"


def table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    align = align or ["---"] * len(header)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def money(cost: float) -> str:
    if cost == 0:
        return "$0.00"
    if cost < 0.01:
        return f"${cost:.6f}"
    if cost < 1:
        return f"${cost:.4f}"
    return f"${cost:,.2f}"


def fmt_cost(cost: float, unpriced_calls: int) -> str:
    """The cost, ``unknown`` when no call was priced, ``≥ $x`` when only some were (the cost is a lower bound)."""
    if unpriced_calls:
        return "unknown" if cost == 0 else f"≥ {money(cost)}"
    return money(cost)
