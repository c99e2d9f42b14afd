"""``databus status`` as text: the rows of its tables, from the command's JSON document
(databus/_status_view.py builds the document and prints these), and the rules that fit
them to the terminal.

Every row function is pure (a document in, tuples of cells out: tested as strings). The
tables are ``databus._tables.FitTable``s: printed at 60, 80 or 200 columns they keep
every SCN, lag and number whole, show URLs as ``host:port`` when full ones do not fit,
and hide the least needed columns first (``COLUMNS``: each header's kind and priority);
``databus status --wide`` prints on an unlimited width, so everything is shown as it is.

Stale rows are marked, in words (not only in colour):

- a polling consumer the relay has not seen for ``STALE_AFTER_S`` seconds gets
  ``(stale)`` after its client id (a streaming one is listed only while its stream is
  open, so it is never stale);
- with ``--watch``, a service that stops answering keeps its last answer on screen,
  marked ``(answer N s old)`` after its URL in every table, while the services table
  says DOWN and why (``keep_last_answers``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from databus._tables import ALERT, STALE, Col, FitTable, Styled

__all__ = [
    "COLUMNS",
    "STALE_AFTER_S",
    "bootstrap_rows",
    "buffer_rows",
    "consumer_rows",
    "dump_cells",
    "dump_rows",
    "fetcher_rows",
    "keep_last_answers",
    "lag_text",
    "quarantine_rows",
    "service_rows",
    "status_table",
    "where",
]

# A polling consumer not seen for this long is marked stale (a live one polls again
# within its long-poll wait, seconds; the relay forgets it after its expiry_s).
STALE_AFTER_S = 60.0

# Every header of the status tables: what it holds and how soon it is hidden when the
# terminal is narrow (databus/_tables.py). Numbers, SCNs, lags and URLs are never cut.
COLUMNS: dict[str, Col] = {c.header: c for c in (
    Col("kind"), Col("url", "url"), Col("relay", "url"), Col("state"),
    Col("detail", "text", 2, below=True),
    Col("service", priority=3), Col("component", "text"),
    Col("error", "label", 2, below=True), Col("message", "text", 1, below=True),
    Col("fix", "text", 1, below=True),
    Col("buffer"), Col("SCN min..max", "num"), Col("fill", "num", 1),
    Col("input", "num", 2), Col("windows", "num", 3), Col("events", "num", 3),
    Col("lag", "num"), Col("source SCN", "num", 1), Col("lag SCN", "num", 3),
    Col("last window", "num", 2), Col("restarts", "num", 2),
    Col("last error", "text", 1, below=True),
    Col("source"), Col("SCN", "num"), Col("since", "num", 2), Col("reason", "text", 1, below=True),
    Col("client id", "text", min_width=16), Col("events/s", "num", 2),
    Col("last seen", "num", 1), Col("mode", priority=2),
    Col("dump"), Col("progress", "text", min_width=20),
    Col("log SCN", "num"), Col("applied SCN", "num"), Col("applier lag", "num"),
    Col("log", "text", 2), Col("snapshot rows", "num", 3),
    Col("components", "text", 1, below=True),
    Col("replication"), Col("batches", "num", 3), Col("errors", "num", 2),
)}


def status_table(title: str, columns: Sequence[str], rows: Sequence[tuple[str, ...]],
                 right: Sequence[int] = ()) -> FitTable:
    """A table of ``databus status`` that fits the width it is printed at, its columns
    described by ``COLUMNS`` (a header not there: a label, never hidden; right-aligned
    when its index is in ``right``)."""
    cols = [COLUMNS.get(name) or Col(name, "num" if i in right else "label")
            for i, name in enumerate(columns)]
    return FitTable(title, cols, rows)


# -- stale answers --------------------------------------------------------------------------


def where(entry: Mapping[str, Any]) -> str:
    """A service's URL as its rows show it: marked when what they show is an old answer
    (``keep_last_answers``)."""
    stale = entry.get("stale")
    if not stale:
        return str(entry["url"])
    return Styled(f"{entry['url']} (answer {stale['age_s']:.0f} s old)", STALE)


def keep_last_answers(document: dict[str, Any],
                      last: MutableMapping[tuple[str, Any], tuple[dict[str, Any], float]],
                      now: float | None = None) -> dict[str, Any]:
    """``--watch``: a service that does not answer this time keeps its last answer on
    screen, marked stale (``"stale": {"age_s", "error"}``, no ``"error"``), instead of
    its rows vanishing; ``last`` (kind, URL) -> (answer, when) is kept between calls.
    The document's ``ok``/``down``/``ready`` (and so the exit status) still count it
    as down."""
    now = time.time() if now is None else now
    for key in ("relays", "bootstraps", "replicators"):
        entries = document.get(key)
        if not isinstance(entries, list):
            continue
        for i, entry in enumerate(entries):
            mark = (key, entry.get("url"))
            if "error" not in entry:
                last[mark] = (entry, now)
                continue
            if mark not in last:
                continue
            answer, when = last[mark]
            entries[i] = {**answer, "stale": {"age_s": round(max(0.0, now - when), 1),
                                              "error": entry["error"]}}
    return document


def _number(value: Any) -> float | None:
    """A JSON number, or None for anything else (null, a string, a bool, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _int(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


# -- values as text ---------------------------------------------------------------------


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _count(n: float | None, suffix: str = "") -> str:
    return "-" if n is None else f"{n:,.0f}{suffix}"


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def lag_text(seconds: float | None) -> str:
    """A lag in seconds as shown: "unknown" when the relay cannot say (never 0)."""
    if seconds is None:
        return "unknown"
    if seconds < 100:
        return f"{seconds:.1f} s"
    return f"{seconds:,.0f} s"


def _scn_range(low: int | None, high: int | None) -> str:
    if low is None and high is None:
        return "empty"
    return f"{_count(low)}..{_count(high)}"


def dump_cells(dump: Mapping[str, Any], width: int = 20) -> str:
    """A dump's progress as one line with a bar (``databus demo`` shows the same)."""
    percent = dump.get("percent") or 0.0
    filled = int(width * percent / 100)
    bar = "\u2588" * filled + "\u2591" * (width - filled)
    where = f", {dump['table']}" if dump.get("table") else ""
    rows, estimate = dump.get("rows") or 0, dump.get("estimate") or 0
    return (f"{bar} {percent:5.1f}% {dump.get('state')}: {rows:,}/{estimate:,} rows{where}, "
            f"{dump.get('rows_per_second') or 0:,.0f} rows/s")




def down_row(kind: str, entry: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The services table's row of a service that did not answer (None: it did)."""
    if "error" in entry:
        return (kind, entry["url"], Styled("DOWN", ALERT), entry["error"])
    stale = entry.get("stale")
    if stale:
        return (kind, entry["url"], Styled("DOWN", ALERT),
                f"{stale['error']}; its rows below are its answer of "
                f"{stale['age_s']:.0f} s ago")
    return None


def service_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """(kind, url, state, detail) for the services table."""
    from databus._status_services import replicator_service_rows, up_cell

    rows: list[tuple[str, ...]] = []
    for kind, key in (("relay", "relays"), ("bootstrap", "bootstraps")):
        for entry in document[key]:
            down = down_row(kind, entry)
            if down is not None:
                rows.append(down)
                continue
            detail = [f"event loop {entry['event_loop']}"] if entry.get("event_loop") else []
            if kind == "relay":
                workers = entry.get("workers")
                if workers:
                    up = sum(1 for w in workers if w["state"] == "running")
                    restarts = sum(w["restarts"] or 0 for w in workers)
                    detail.append(f"{1 + len(workers)} processes ({up}/{len(workers)} "
                                  f"workers running, {restarts} restart(s))")
                detail.append(f"{len(entry['buffers'])} buffer(s)")
                if entry["consumers"] is not None:
                    detail.append(f"{len(entry['consumers'])} consumer(s)")
            elif entry.get("storage"):
                detail.append(entry["storage"])
            rows.append((kind, entry["url"], up_cell(entry), ", ".join(detail)))
    rows += replicator_service_rows(document)
    return rows


def buffer_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """(relay, buffer, SCN range, fill, input rate, windows, events) per buffer."""
    rows: list[tuple[str, ...]] = []
    for relay in document["relays"]:
        for b in relay.get("buffers", ()):
            fill = "-" if b["fill"] is None else (
                f"{100 * b['fill']:.1f}% ({_size(b['used_bytes'])}/{_size(b['capacity_bytes'])})")
            rate = b["input_bytes_per_second"]
            rows.append((where(relay), b["name"], _scn_range(b["min_scn"], b["max_scn"]), fill,
                         "-" if rate is None else f"{_size(rate)}/s",
                         _count(b["windows"]), _count(b["events"])))
    return rows


def fetcher_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """(relay, buffer, state, lag, source SCN, lag SCN, last window, restarts, last
    error); lag is in seconds (the alert figure), lag SCN is only a position distance."""
    rows: list[tuple[str, ...]] = []
    for relay in document["relays"]:
        for b in relay.get("buffers", ()):
            f = b["fetcher"]
            if f is None:
                rows.append((where(relay), b["name"], "none", "-", "-", "-", "-", "-", ""))
                continue
            state = f["state"] or "-"
            if state not in ("running", "caught_up", "-"):
                state = Styled(state, ALERT)
            rows.append((where(relay), b["name"], state, lag_text(f.get("lag_seconds")),
                         _count(f["source_scn"]),
                         _count(f["lag_scn"]), _ago(f["last_window_age_s"]),
                         _count(f["restarts"]), f["last_error"] or ""))
    return rows


def consumer_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """(relay, client id, buffer, SCN, lag SCN, lag (seconds), events/s, last seen,
    mode) per consumer; one row saying why for a relay without a consumer list."""
    rows: list[tuple[str, ...]] = []
    for relay in document["relays"]:
        if "error" in relay:
            continue
        consumers = relay["consumers"]
        if consumers is None:
            rows.append((where(relay), f"consumers: {relay['consumers_error']}",
                         *("",) * 7))
            continue
        if not consumers:
            rows.append((where(relay), "no consumer seen", *("",) * 7))
        for c in consumers:
            rate = _number(c["events_per_second"])
            idle = _number(c["idle_s"])
            client_id, seen = str(c["client_id"]), _ago(idle)
            if consumer_stale(c):
                client_id = Styled(f"{client_id} (stale)", STALE)
                seen = Styled(seen, STALE)
            rows.append((
                where(relay), client_id, str(c["buffer"] or "-"),
                _count(_number(c["checkpoint_scn"])), _count(_number(c["lag_scn"])),
                lag_text(_number(c["lag_seconds"])),
                "-" if rate is None else f"{rate:,.1f}",
                seen,
                "stream" if c["streaming"] else "poll",
            ))
    return rows


def consumer_stale(consumer: Mapping[str, Any]) -> bool:
    """A polling consumer not seen for ``STALE_AFTER_S``: stopped, or stuck (a
    streaming one is listed only while connected)."""
    idle = _number(consumer.get("idle_s"))
    return not consumer.get("streaming") and idle is not None and idle > STALE_AFTER_S


def bootstrap_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """(url, log SCN, applied SCN, applier lag (seconds), log, snapshot rows,
    components)."""
    rows: list[tuple[str, ...]] = []
    for b in document["bootstraps"]:
        if "error" in b:
            continue
        parts = []
        failed = False
        for name, c in b["components"].items():
            failed |= c["state"] not in ("running", "standby")
            text = f"{name} {c['state']}"
            if c["last_error"]:
                text += f" ({c['last_error']})"
            parts.append(text)
        components = ", ".join(parts) or "-"
        rows.append((where(b), _count(b["log_scn"]), _count(b["applied_scn"]),
                     lag_text(b.get("applier_lag_seconds")),
                     f"{_count(b['log_windows'])} windows, {_size(b['log_bytes'])}",
                     _count(b["snapshot_rows"]),
                     Styled(components, ALERT) if failed else components))
    return rows


def quarantine_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """(relay, buffer, source, state, SCN, since, reason, fix) per quarantined source."""
    return [(where(relay), b["name"], q["source"], Styled("QUARANTINED", ALERT),
             _count(q["scn"]), _ago(q["age_s"]), q["reason"], q["fix"])
            for relay in document["relays"] for b in relay.get("buffers", ())
            for q in b.get("quarantined", ())]


def dump_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    return [(where(relay), b["name"], d["id"], dump_cells(d))
            for relay in document["relays"] for b in relay.get("buffers", ())
            for d in b["dumps"]]


