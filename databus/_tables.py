"""The tables of the ``status`` commands (``databus status``, ``databus cluster
status``, ``databus group status``, ``databus dump status``): plain text for the small
ones, rich tables that fit the terminal for the others, and a cell that carries its
style without ever being parsed as rich markup (a message that came from a service may
hold ``[...]``).

Fitting a width (``FitTable``; ``fit_table`` builds the rich table for one width). Each
column says what it holds (``Col``): a number or SCN (``num``, right-aligned), a URL
(``url``), a short label (``label``: a state, a buffer's name) or free text (``text``:
an error, a fix, a client id). The rule, applied in this order until the table fits:

1. everything as it is;
2. URLs as ``host:port`` (scheme, user and a root path dropped; a path kept);
3. a URL column whose rows all name the same service goes into the title
   ("Buffers of relay-01:11190");
4. columns hidden by priority (``Col.priority``: 0 is never hidden, the highest number
   goes first, the rightmost first among equals), counting free text at its minimum
   (``Col.min_width``, then wrapped); the title names what was hidden. A hidden column
   marked ``below`` (an error, a message, a fix: what a reader needs whatever the
   width) is not lost: its values are listed under the table, one line per row, after
   the row's shown labels, wrapped at the width.

Numbers, SCNs, URLs and labels are never wrapped nor cut: when even the columns of
priority 0 do not fit, labels, URLs and text fold onto more lines (the widest first;
every character stays; numbers stay whole), never end in "...". A table printed on an
unlimited width (``databus status --wide``) is always at step 1: everything unabridged.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.table import Table
    from rich.text import Text

__all__ = ["ALERT", "STALE", "Col", "FitTable", "Styled", "fit_table", "rich_table",
           "short_url", "text_table"]

ALERT = "bold red"
STALE = "yellow"
# Free text is not squeezed below this many characters before columns are hidden.
TEXT_MIN = 12
# What hiding columns says, after their names (a command may name its own option).
WIDE_HINT = "--wide shows them"

Kind = Literal["num", "url", "label", "text"]


class Styled(str):
    """A cell with a rich style (``"bold red"``), still equal to its plain text: the
    row functions stay testable as strings."""

    style: str

    def __new__(cls, text: str, style: str) -> Styled:
        cell = super().__new__(cls, text)
        cell.style = style
        return cell


@dataclass(frozen=True)
class Col:
    """A column: its header, what it holds (see the module docstring) and its
    priority (0: never hidden; higher numbers are hidden first)."""

    header: str
    kind: Kind = "label"
    priority: int = 0
    min_width: int = TEXT_MIN
    below: bool = False  # when hidden, listed under the table (text columns)


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
    """A plain rich table (rich's own squeezing: cells may end in "..." on a narrow
    terminal); the columns whose index is in ``right`` are right-aligned. The status
    views use ``FitTable`` instead."""
    from rich.table import Table

    t = Table(title=title, title_justify="left", expand=False)
    aligned = set(right)
    for i, column in enumerate(columns):
        t.add_column(column, justify="right" if i in aligned else "left")
    for row in rows:
        t.add_row(*(_text(cell) for cell in row))
    return t


def short_url(text: str) -> str:
    """``http://user:***@host:port/`` as ``host:port`` (a path other than ``/`` kept:
    ``host:port/relay``). Text after the URL (``"http://h:1 (stale 5 s)"``) is kept; text
    that is not a URL is returned as it is."""
    url, sep, rest = text.partition(" ")
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return text
    host = parts.netloc.rpartition("@")[2]
    path = parts.path.rstrip("/")
    short = host + path
    return Styled(short + sep + rest, text.style) if isinstance(text, Styled) \
        else short + sep + rest


def _cell_width(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in text.split("\n")), default=0)


@dataclass(frozen=True)
class _Layout:
    shown: tuple[int, ...]  # column indexes kept, in order
    short_urls: bool
    fits: bool = True  # False: even the columns of priority 0 are too wide (folded)
    titled: tuple[int, ...] = ()  # URL columns of one value, shown in the title


def _natural(cols: Sequence[Col], rows: Sequence[Sequence[str]], short_urls: bool
             ) -> list[int]:
    widths = []
    for i, col in enumerate(cols):
        cells = [row[i] for row in rows]
        if short_urls and col.kind == "url":
            cells = [short_url(c) for c in cells]
        widths.append(max([_cell_width(col.header), *(_cell_width(c) for c in cells)]))
    return widths


def _table_width(widths: Iterable[int]) -> int:
    """A rich table's width with the default box and padding: each column is its
    content, one space each side and a border, plus the closing border."""
    widths = list(widths)
    return sum(widths) + 3 * len(widths) + 1


def layout(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int | None
           ) -> _Layout:
    """Which columns to show and whether URLs are shortened, for ``width`` (None: no
    limit); the rule of the module docstring."""
    everything = tuple(range(len(cols)))
    if width is None:
        return _Layout(everything, False)
    for short in (False, True):
        if _table_width(_natural(cols, rows, short)) <= width:
            return _Layout(everything, short)
    natural = _natural(cols, rows, True)
    least = [min(n, max(c.min_width, 1)) if c.kind == "text" else n
             for c, n in zip(cols, natural, strict=True)]
    titled = tuple(i for i in everything if cols[i].kind == "url" and rows
                   and len({str(row[i]) for row in rows}) == 1)
    if titled and _table_width(natural[i] for i in everything if i not in titled) <= width:
        return _Layout(tuple(i for i in everything if i not in titled), True, True, titled)
    shown = [i for i in everything if i not in titled]
    # Hidden first: the highest priority number, then the rightmost.
    order = sorted((i for i in everything if cols[i].priority > 0),
                   key=lambda i: (-cols[i].priority, -i))
    for i in order:
        if _table_width(least[j] for j in shown) <= width:
            break
        shown.remove(i)
    return _Layout(tuple(shown), True, _table_width(least[j] for j in shown) <= width,
                   titled)


def fit_table(title: str, cols: Sequence[Col], rows: Sequence[Sequence[str]],
              width: int | None, hint: str = WIDE_HINT) -> Table:
    """The rich table of ``rows`` for ``width`` columns (None: its natural width),
    by the rule of the module docstring (without the lines of ``below`` columns:
    ``FitTable`` prints those)."""
    return _fit(title, cols, rows, width, hint)[0]


def _fit(title: str, cols: Sequence[Col], rows: Sequence[Sequence[str]],
         width: int | None, hint: str) -> tuple[Table, list[Text]]:
    from rich.table import Table
    from rich.text import Text

    plan = layout(cols, rows, width)
    hidden = [i for i in range(len(cols)) if i not in plan.shown]
    listed = [i for i in hidden if cols[i].below]
    gone = [cols[i].header for i in hidden if not cols[i].below and i not in plan.titled]
    for i in plan.titled:
        title += f" of {short_url(str(rows[0][i]))}"
    notes = []
    if gone:
        notes.append(f"{len(gone)} column(s) hidden at this width: {', '.join(gone)}"
                     + (f"; {hint}" if hint else ""))
    if listed:
        notes.append(f"{', '.join(cols[i].header for i in listed)} below the table")
    if notes:
        title += f" ({'; '.join(notes)})"
    t = Table(title=title, title_justify="left", expand=False)
    for i in plan.shown:
        col = cols[i]
        # When even the essential columns do not fit, every cell may fold onto more
        # lines (the widest columns first): characters move, none is cut.
        t.add_column(col.header, justify="right" if col.kind == "num" else "left",
                     no_wrap=col.kind == "num" or (plan.fits and col.kind != "text"),
                     overflow="fold")
    for row in rows:
        cells = []
        for i in plan.shown:
            cell = row[i]
            if plan.short_urls and cols[i].kind == "url":
                cell = short_url(cell)
            cells.append(_text(cell))
        t.add_row(*cells)
    lines = []
    for row in rows:
        values = [(cols[i].header, row[i]) for i in listed if row[i]]
        if not values:
            continue
        labels = [row[i] for i in plan.shown if cols[i].kind != "num" and row[i]]
        line = Text("  ")
        line.append(" ".join(short_url(c) if plan.short_urls else c for c in labels),
                    style="bold")
        for n, (header, value) in enumerate(values):
            line.append(f"; {header}: " if n else (f" - {header}: " if labels
                                                   else f"{header}: "))
            line.append_text(_text(value))
        lines.append(line)
    return t, lines


def _text(cell: str) -> Text:
    from rich.text import Text

    return Text(cell, style=cell.style) if isinstance(cell, Styled) else Text(cell)


class FitTable:
    """A table that fits the width it is printed at (``fit_table`` at print time):
    put it in a ``rich.console.Group`` like any renderable."""

    def __init__(self, title: str, cols: Sequence[Col], rows: Sequence[Sequence[Any]],
                 hint: str = WIDE_HINT) -> None:
        if any(len(row) != len(cols) for row in rows):
            raise ValueError(f"{title}: every row has {len(cols)} cells")
        self.title = title
        self.cols = tuple(cols)
        # Cells are text; None is "-" (as in ``text_table``), anything else its str().
        self.rows = [tuple(c if isinstance(c, str) else "-" if c is None else str(c)
                           for c in row) for row in rows]
        self.hint = hint

    def table(self, width: int | None) -> Table:
        return fit_table(self.title, self.cols, self.rows, width, self.hint)

    def __rich_console__(self, console: Console, options: ConsoleOptions
                         ) -> RenderResult:
        table, lines = _fit(self.title, self.cols, self.rows, options.max_width, self.hint)
        yield table
        yield from lines
