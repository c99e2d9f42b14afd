"""The dashboard's history: the last minutes of a few figures of every status document,
kept in the server so that a page opened now draws its sparklines at once.

Pure (no I/O): ``History.add(document)`` takes the figures of one ``databus status``
document at its ``generated_at``; ``History.since(t)`` gives the points after ``t``
(everything: ``t`` = 0), which the page merges into its own copy on every poll.

A series is named by a key the page computes from the same document, the JSON array
``[kind, *identity, figure]`` written compactly (``series_key``)::

    ["buffer", relay url, buffer, "input_bytes_per_second" | "lag_seconds" | "max_scn"]
    ["consumer", relay url, client id, buffer, "lag_seconds" | "events_per_second"
                                                | "checkpoint_scn"]
    ["bootstrap", url, "applier_lag_seconds"]
    ["replicator", url, "lag_seconds"]
    ["group", group, member, "lag_seconds"]

A point is ``[t, value]``; ``value`` is null when the figure was unknown then (a gap
in the line, never a 0). Memory is bounded: a point older than ``window_s`` is dropped,
a series holds at most ``max_points`` points, and at most ``max_series`` series are
kept (the ones not updated for the longest time go first: consumers that left).
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["History", "samples", "series_key"]

DEFAULT_WINDOW_S = 600.0


def series_key(*parts: Any) -> str:
    """``["buffer","http://r:1","src","lag_seconds"]``: as the page's
    ``JSON.stringify`` writes it."""
    return json.dumps([str(p) for p in parts], separators=(",", ":"), ensure_ascii=False)


def _figure(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def samples(document: Mapping[str, Any]) -> Iterator[tuple[str, float | None]]:
    """(series key, value) of every figure of ``document`` the history keeps."""
    for relay in document.get("relays") or ():
        if "error" in relay:
            continue
        url = relay.get("url")
        for b in relay.get("buffers") or ():
            fetcher = b.get("fetcher") or {}
            for name, value in (("input_bytes_per_second", b.get("input_bytes_per_second")),
                                ("lag_seconds", fetcher.get("lag_seconds")),
                                ("max_scn", b.get("max_scn"))):
                yield series_key("buffer", url, b.get("name"), name), _figure(value)
        for c in relay.get("consumers") or ():
            for name in ("lag_seconds", "events_per_second", "checkpoint_scn"):
                yield (series_key("consumer", url, c.get("client_id"), c.get("buffer"), name),
                       _figure(c.get(name)))
    for b in document.get("bootstraps") or ():
        if "error" not in b:
            yield (series_key("bootstrap", b.get("url"), "applier_lag_seconds"),
                   _figure(b.get("applier_lag_seconds")))
    for r in document.get("replicators") or ():
        if "error" not in r:
            yield series_key("replicator", r.get("url"), "lag_seconds"), _figure(
                r.get("lag_seconds"))
    for g in document.get("groups") or ():
        for m in g.get("members") or ():
            yield (series_key("group", g.get("group"), m.get("member"), "lag_seconds"),
                   _figure(m.get("lag_seconds")))


class History:
    """The rings of points, per series (module docstring)."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, *, max_points: int = 1200,
                 max_series: int = 2000) -> None:
        if window_s <= 0 or max_points < 2 or max_series < 1:
            raise ValueError("window_s > 0, max_points >= 2 and max_series >= 1")
        self.window_s = window_s
        self.max_points = max_points
        self.max_series = max_series
        self._series: dict[str, deque[tuple[float, float | None]]] = {}

    def __len__(self) -> int:
        return len(self._series)

    def add(self, document: Mapping[str, Any]) -> None:
        """The figures of ``document`` at its ``generated_at``; older points dropped."""
        t = _figure(document.get("generated_at"))
        if t is None:
            return
        for key, value in samples(document):
            ring = self._series.pop(key, None)  # re-inserted: the dict stays in update order
            if ring is None:
                ring = deque(maxlen=self.max_points)
            if ring and ring[-1][0] == t:
                ring.pop()  # the same sample again: replaced
            elif ring and ring[-1][0] > t:
                ring.clear()  # the clock went back: the old points would be misdrawn
            ring.append((t, value))
            self._series[key] = ring
        self.prune(t)

    def prune(self, now: float) -> None:
        """Drop the points older than the window, then the empty series and the
        least recently updated ones beyond ``max_series``."""
        floor = now - self.window_s
        for key in list(self._series):
            ring = self._series[key]
            while ring and ring[0][0] < floor:
                ring.popleft()
            if not ring:
                del self._series[key]
        while len(self._series) > self.max_series:
            del self._series[next(iter(self._series))]

    def since(self, t: float = 0.0) -> dict[str, Any]:
        """``{"window_s", "series": {key: [[t, value], ...]}}``: the points after ``t``
        (the series without any left out)."""
        out: dict[str, list[list[float | None]]] = {}
        for key, ring in self._series.items():
            if not ring or ring[-1][0] <= t:
                continue
            out[key] = [[pt, value] for pt, value in ring if pt > t]
        return {"window_s": self.window_s, "series": out}
