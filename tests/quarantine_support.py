"""A real SQLite TxLog source whose fetcher quarantines a table on a "poison" row
(an upsert of key 666), as the fetchers do for a row their schema cannot hold (DESIGN 17), and the
helpers the quarantine tests share."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

from databus.event import HEADER_SIZE, KEY_KIND_MASK, KeyKind, Op
from databus.fetchers._api import FetcherContext, SourceFailure, WindowSink
from databus.fetchers.txlog import SqliteTxlogFetcher
from databus.relay._catalog import RelayCatalog
from tests.unit.test_txlog_support import BUFFER, SqliteSource

TABLES = "items,tags"
DDL = ("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
       "CREATE TABLE tags (word TEXT PRIMARY KEY, n INTEGER)")
POISON = 666
REASON = "row 666 cannot be held by the table's schema"
FIX = "delete row 666, then run: databus relay heal --relay URL --source shop.items"


def _poisoned(event: bytes) -> bool:
    key_length = int.from_bytes(event[52:56], "big")
    return (event[2] == Op.UPSERT and event[3] & KEY_KIND_MASK == KeyKind.INT
            and key_length == 8
            and int.from_bytes(event[HEADER_SIZE:HEADER_SIZE + 8], "big", signed=True)
            == POISON)


class PoisonSink:
    """Holds each window's events until its end; a poisoned row quarantines its source
    (``context.quarantine``, while the window is open) and that source's events are
    left out of this window and every later one."""

    def __init__(self, sink: WindowSink, context: FetcherContext, names: dict[int, str]
                 ) -> None:
        self.sink = sink
        self.context = context
        self.names = names
        self.quarantined = set(context.quarantined())
        self.scn: int | None = None
        self.events: list[bytes] = []

    def start_window(self, scn: int) -> None:
        self.sink.start_window(scn)
        self.scn, self.events = scn, []

    def watermark(self, token: str) -> None:
        self.sink.watermark(token)

    def append(self, event: bytes) -> None:
        self.events.append(event)

    def end_window(self, timestamp_ns: int | None = None) -> int:
        assert self.scn is not None
        for event in self.events:
            name = self.names.get(int.from_bytes(event[34:36], "big", signed=True), "")
            if name and name not in self.quarantined and _poisoned(event):
                self.quarantined.add(name)
                self.context.quarantine(SourceFailure(name, self.scn, REASON, FIX))
        for event in self.events:
            if self.names.get(int.from_bytes(event[34:36], "big", signed=True)) \
                    not in self.quarantined:
                self.sink.append(event)
        self.events = []
        return self.sink.end_window(timestamp_ns)

    def rollback(self) -> None:
        self.events = []
        self.sink.rollback()


class PoisonFetcher(SqliteTxlogFetcher):
    """The SQLite TxLog fetcher, quarantining a table on a row with key 666."""

    scheme: ClassVar[str] = "sqlite"

    def run(self, sink: WindowSink, start_after_scn: int | None, stop: threading.Event) -> None:
        names = {self.context.catalog.source_id(n): n
                 for n in sorted(self.configured_sources().names)}
        super().run(PoisonSink(sink, self.context, names), start_after_scn, stop)  # type: ignore[arg-type]


def use_poison_fetcher(monkeypatch: Any) -> None:
    """Make every relay started in this test resolve ``sqlite://`` to ``PoisonFetcher``
    (other schemes as usual: a chained relay's ``relay+http://``)."""
    import databus.relay._fetcher_host as host

    real = host.fetcher_class
    monkeypatch.setattr(host, "fetcher_class",
                        lambda uri: PoisonFetcher if uri.startswith("sqlite:") else real(uri))


def shop_source(tmp_path: Path, *, dumpable: bool = True) -> SqliteSource:
    """The tests' SQLite source (``shop.items``, ``shop.tags``) with its capture
    installed and, when ``dumpable``, the dump watermark table that a heal's dump needs."""
    db = SqliteSource(tmp_path / "shop.db", *DDL)
    db.install(TABLES)
    if dumpable:
        context = FetcherContext(BUFFER, 0, RelayCatalog(tmp_path / "scratch.json")
                                 .for_buffer(BUFFER, 0))
        dump = SqliteTxlogFetcher(db.uri(TABLES), context).open_dump_source()
        assert dump is not None
        dump.setup()
    return db
