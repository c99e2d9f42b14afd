"""The tables of the ``status`` commands (``databus status``, ``databus cluster
status``, ``databus group status``): plain text for the small ones, rich for
``databus status``, and a cell that carries its style without ever being parsed as rich
markup (a message that came from a service may hold ``[...]``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["ALERT", "Styled", "rich_table", "text_table"]

ALERT = "bold red"


class Styled(str):
    """A cell with a rich style (``"bold red"``), still equal to its plain text: the
    row functions stay testable as strings."""

    style: str

    def __new__(cls, text: str, style: str) -> Styled:
        cell = super().__new__(cls, text)
        cell.style = style
        return cell


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
               indent: str = "  ") -> str:
    """Aligned columns, ``-`` for None, one line per row (pure)."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row]
                                           for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "".join(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                   .rstrip() + "\n" for row in cells)


def rich_table(title: str, columns: Iterable[str], rows: Sequence[tuple[str, ...]],
               right: Iterable[int] = ()) -> Table:
    """A rich table; the columns whose index is in ``right`` are right-aligned."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, title_justify="left", expand=False)
    aligned = set(right)
    for i, column in enumerate(columns):
        t.add_column(column, justify="right" if i in aligned else "left")
    for row in rows:
        t.add_row(*(Text(cell, style=cell.style) if isinstance(cell, Styled)
                    else Text(cell) for cell in row))
    return t
