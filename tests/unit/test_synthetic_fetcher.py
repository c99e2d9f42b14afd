"""The synthetic fetcher: parameters, determinism, key choice, sizes, rate, sources."""

from __future__ import annotations

import threading
import time
from collections import Counter
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from databus.checkpoint import Checkpoint
from databus.errors import ConfigError
from databus.event import Event, Op, decode_eow, decode_event, iter_events
from databus.fetchers._api import FetcherContext, fetcher_class
from databus.fetchers.synthetic import (
    SyntheticFetcher,
    SyntheticGenerator,
    SyntheticParams,
    SyntheticSource,
    synthetic_schema,
)
from databus.relay._buffer import EventBuffer
from databus.relay._catalog import RelayCatalog
from databus.schemas import AvroCodec
from tests.waiting import wait_until

pytestmark = pytest.mark.twin("databus.batch")

# -- helpers shared with test_fetcher_host ---------------------------------------------

Window = tuple[int, list[Event]]


def read_windows(buffer: EventBuffer) -> list[Window]:
    """Every window the buffer holds, read back through its serving path; every CRC,
    count and checksum verified."""
    data = b""
    cp = Checkpoint.flexible()
    while True:
        result = buffer.read(cp, max_bytes=1 << 20)
        if not result.data:
            break
        data += result.data
        cp = result.checkpoint
    windows: list[Window] = []
    current: list[Event] = []
    for offset, header in iter_events(data):
        event = decode_event(data, offset)
        assert all(e.scn == header.scn for e in current)
        if header.is_eow:
            assert decode_eow(event).event_count == len(current)
            windows.append((header.scn, current))
            current = []
        else:
            current.append(event)
    assert not current
    return windows


def content(windows: list[Window]) -> list[tuple[Any, ...]]:
    """Everything about the windows except their timestamps (and the CRCs over them)."""
    return [
        (scn, e.header.source_id, e.op, e.key_bytes, e.value, e.header.schema_fingerprint,
         e.header.partition_id)
        for scn, events in windows for e in events
    ]


class Run:
    """One SyntheticFetcher running in a thread into a real buffer."""

    def __init__(self, uri: str, buffer: EventBuffer, catalog: RelayCatalog,
                 start_after: int | None = None) -> None:
        self.reported: list[int] = []
        context = FetcherContext("load", buffer.partition_id,
                                 catalog.for_buffer("load", buffer.partition_id),
                                 report_source_scn=self.reported.append)
        self.fetcher = SyntheticFetcher(uri, context)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(buffer, start_after))
        self.thread.start()

    def _run(self, buffer: EventBuffer, start_after: int | None) -> None:
        try:
            self.fetcher.run(buffer, start_after, self.stop)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(5)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


def produce(tmp_path: Path, name: str, uri: str, until_scn: int,
            start_after: int | None = None) -> list[Window]:
    """Run the fetcher into a fresh buffer until ``until_scn``; the windows it wrote."""
    with EventBuffer(tmp_path / f"{name}.buf", 4 << 20) as buffer:
        catalog = RelayCatalog(tmp_path / f"{name}.json")
        run = Run(uri, buffer, catalog, start_after)
        wait_until(lambda: buffer.state().max_scn == until_scn, f"the buffer at SCN {until_scn}",
                   20)
        run.finish()
        return read_windows(buffer)


def generator(uri: str, first_id: int = 1, partition_id: int = 0) -> SyntheticGenerator:
    params = SyntheticParams.from_uri(uri)
    sources = [SyntheticSource(n, first_id + i, synthetic_schema(n).fingerprint)
               for i, n in enumerate(params.sources)]
    return SyntheticGenerator(params, sources, partition_id)


def notes(uri: str, windows: range) -> list[tuple[str, int]]:
    """(op_note, key) of every event of the given windows, decoded with fastavro."""
    gen = generator(uri)
    codec = AvroCodec(schemas=[synthetic_schema(n) for n in gen.params.sources])
    out = []
    for scn in windows:
        for raw in gen.window(scn):
            event = decode_event(raw)
            value = codec.decode(event.value, event.header.schema_fingerprint)
            assert value["id"] == event.key
            assert (event.op is Op.DELETE) == (value["op_note"] == "delete")
            out.append((value["op_note"], value["id"]))
    return out


# -- parameters -------------------------------------------------------------------------


def test_defaults_and_full_uri() -> None:
    assert SyntheticParams.from_uri("synthetic://") == SyntheticParams()
    params = SyntheticParams.from_uri(
        "synthetic://?rate=1000&keys=100000&event_bytes=2500&events_per_window=1"
        "&update_ratio=0.5&delete_ratio=0.1&seed=-3&limit=7&source=a.b,%20c.d"
    )
    assert params == SyntheticParams(
        rate=1000.0, keys=100_000, event_bytes=2500, events_per_window=1, update_ratio=0.5,
        delete_ratio=0.1, seed=-3, limit=7, sources=("a.b", "c.d"),
    )
    assert SyntheticParams.from_uri("synthetic:///?rate=0").rate == 0


@pytest.mark.parametrize(
    "query,names",
    [
        ("rat=5", ["rat", "did you mean 'rate'"]),
        ("rate=-1", ["rate"]),
        ("rate=fast", ["rate"]),
        ("rate=nan", ["rate"]),
        ("rate=inf", ["rate"]),
        ("keys=0", ["keys"]),
        ("keys=-5", ["keys"]),
        ("keys=1.5", ["keys"]),
        ("event_bytes=0", ["event_bytes"]),
        ("event_bytes=999999999", ["event_bytes"]),
        ("events_per_window=0", ["events_per_window"]),
        ("update_ratio=1.5", ["update_ratio"]),
        ("update_ratio=-0.1", ["update_ratio"]),
        ("delete_ratio=2", ["delete_ratio"]),
        ("update_ratio=0.7&delete_ratio=0.4", ["update_ratio", "delete_ratio"]),
        ("seed=x", ["seed"]),
        ("seed=99999999999999999999", ["seed"]),
        ("limit=-1", ["limit"]),
        ("source=", ["source"]),
        ("source=a,,b", ["source"]),
        ("source=a,a", ["source"]),
        ("source=a%20b", ["source"]),
        ("rate=1&rate=2", ["rate", "twice"]),
    ],
)
def test_bad_parameters_are_named(query: str, names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        SyntheticParams.from_uri(f"synthetic://?{query}")
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize("uri", ["synthetic://host/?rate=1", "synthetic://?rate=1#frag",
                                 "synthetic:/x", "mysql://h/?rate=1"])
def test_uris_with_more_than_params_are_rejected(uri: str) -> None:
    with pytest.raises(ConfigError):
        SyntheticParams.from_uri(uri)


def test_the_fetcher_validates_at_construction(tmp_path: Path) -> None:
    context = FetcherContext("load", 0, RelayCatalog(tmp_path / "c.json").for_buffer("load", 0))
    with pytest.raises(ConfigError, match="keys"):
        SyntheticFetcher("synthetic://?keys=0", context)


def test_found_by_its_uri_scheme() -> None:
    if not [ep for ep in entry_points(group="databus.fetchers") if ep.name == "synthetic"]:
        pytest.skip("databus.fetchers entry points not installed: run pip install -e .")
    assert fetcher_class("synthetic://?rate=0") is SyntheticFetcher


# -- the generator (pure) ---------------------------------------------------------------


def test_events_have_the_requested_size_and_decode() -> None:
    for size in (100, 128, 129, 300, 2500, 70_000):
        uri = f"synthetic://?event_bytes={size}&events_per_window=5&update_ratio=0.4"
        events = [e for scn in range(1, 40) for e in generator(uri).window(scn)]
        assert {len(e) for e in events} == {size}
    # Below the fixed part (header, key, id, seq, note) events are as small as they get.
    small = generator("synthetic://?event_bytes=1").window(1)
    assert len(small[0]) < 100


def test_windows_are_a_function_of_seed_and_scn() -> None:
    uri = "synthetic://?events_per_window=4&update_ratio=0.3&delete_ratio=0.2&seed=11"
    a, b = generator(uri), generator(uri)
    for scn in (1, 2, 50, 10_000, 1 << 40):
        assert a.window(scn, 1) == b.window(scn, 1)  # byte for byte
    assert a.window(5, 1) != generator(uri.replace("seed=11", "seed=12")).window(5, 1)
    assert a.window(5, 1) != a.window(6, 1)


def test_update_and_delete_ratios_are_honoured() -> None:
    uri = "synthetic://?keys=1000000&events_per_window=10&update_ratio=0.3&delete_ratio=0.1"
    events = notes(uri, range(1, 2001))
    counts = Counter(note for note, _ in events)
    assert counts["insert"] == pytest.approx(12_000, abs=1)  # spread exactly
    assert counts["update"] == pytest.approx(6_000, rel=0.05)
    assert counts["delete"] == pytest.approx(2_000, rel=0.1)
    issued: set[int] = set()
    for note, key in events:
        if note == "insert":
            assert key == len(issued)  # a new key, in order
            issued.add(key)
        else:
            assert key in issued  # an existing key


def test_a_small_key_space_turns_inserts_into_updates() -> None:
    events = notes("synthetic://?keys=50&events_per_window=10&update_ratio=0.2",
                   range(1, 101))
    assert sorted({k for note, k in events if note == "insert"}) == list(range(50))
    assert {k for _, k in events} == set(range(50))
    # With no inserts at all the key space counts as pre-populated.
    updates = notes("synthetic://?keys=20&events_per_window=10&update_ratio=1", range(1, 51))
    assert {note for note, _ in updates} == {"update"}
    assert {k for _, k in updates} == set(range(20))


def test_several_sources_take_events_round_robin() -> None:
    uri = "synthetic://?events_per_window=3&source=shop.orders,shop.items,other.x-y"
    gen = generator(uri, first_id=4, partition_id=2)
    ids = [decode_event(e).source_id for scn in (1, 2) for e in gen.window(scn)]
    assert ids == [4, 5, 6, 4, 5, 6]
    fps = {decode_event(e).header.schema_fingerprint for e in gen.window(1)}
    assert len(fps) == 3  # one schema per source
    assert {decode_event(e).header.partition_id for e in gen.window(1)} == {2}
    # Events per window and sources need not divide: windows then start anywhere.
    gen = generator("synthetic://?events_per_window=2&source=a.x,b.y,c.z")
    ids = [decode_event(e).source_id for scn in (1, 2, 3) for e in gen.window(scn)]
    assert ids == [1, 2, 3, 1, 2, 3]


def test_schema_names_follow_the_source() -> None:
    assert synthetic_schema("synthetic.events").name == "synthetic.events"
    assert synthetic_schema("my-db.9table").name == "my_db._9table"
    assert synthetic_schema("plain").name == "plain"
    assert [f["name"] for f in synthetic_schema("a.b").fields] == [
        "id", "seq", "op_note", "payload",
    ]


# -- the fetcher in a thread ------------------------------------------------------------

DET = "synthetic://?rate=0&keys=300&event_bytes=150&events_per_window=3&update_ratio=0.6" \
      "&delete_ratio=0.1&seed=7"


def test_two_runs_write_the_same_windows(tmp_path: Path) -> None:
    first = produce(tmp_path, "a", DET + "&limit=60", 60)
    second = produce(tmp_path, "b", DET + "&limit=60", 60)
    assert [scn for scn, _ in first] == list(range(1, 61))
    assert all(len(events) == 3 for _, events in first)
    assert content(first) == content(second)
    assert content(first) == content([(s, [decode_event(e) for e in generator(DET).window(s)])
                                      for s in range(1, 61)])


def test_restart_after_the_buffer_max_gives_exactly_the_remaining_windows(
    tmp_path: Path,
) -> None:
    whole = produce(tmp_path, "whole", DET + "&limit=50", 50)
    with EventBuffer(tmp_path / "parts.buf", 4 << 20) as buffer:
        catalog = RelayCatalog(tmp_path / "parts.json")
        run = Run(DET + "&limit=20", buffer, catalog)
        wait_until(lambda: buffer.state().max_scn == 20, "the buffer at SCN 20", 20)
        run.finish()
        run = Run(DET + "&limit=50", buffer, catalog, start_after=buffer.state().max_scn)
        wait_until(lambda: buffer.state().max_scn == 50, "the buffer at SCN 50", 20)
        run.finish()
        parts = read_windows(buffer)
    assert content(parts) == content(whole)


def test_limit_then_idle_until_stopped(tmp_path: Path) -> None:
    with EventBuffer(tmp_path / "l.buf", 1 << 20) as buffer:
        run = Run("synthetic://?rate=0&limit=5", buffer, RelayCatalog(tmp_path / "l.json"))
        wait_until(lambda: buffer.state().max_scn == 5, "the buffer at SCN 5", 20)
        # Reported just after the window is written: waited for, not slept on.
        wait_until(lambda: run.reported and run.reported[-1] == 5, "SCN 5 reported", 20)
        time.sleep(0.1)  # time for a wrong sixth window to show
        assert run.thread.is_alive() and buffer.state().max_scn == 5
        assert run.reported[-1] == 5
        run.finish()  # and it stops: finish() asserts the thread ended (within 5 s)
    # Started beyond its limit, it writes nothing.
    with EventBuffer(tmp_path / "m.buf", 1 << 20) as buffer:
        run = Run("synthetic://?rate=0&limit=5", buffer, RelayCatalog(tmp_path / "m.json"),
                  start_after=9)
        time.sleep(0.1)
        run.finish()
        assert buffer.state().max_scn is None


def test_rate_is_roughly_honoured_and_reported(tmp_path: Path) -> None:
    with EventBuffer(tmp_path / "r.buf", 4 << 20) as buffer:
        started = time.monotonic()  # before the fetcher's schedule starts
        run = Run("synthetic://?rate=400&events_per_window=2&event_bytes=100", buffer,
                  RelayCatalog(tmp_path / "r.json"))
        wait_until(lambda: buffer.state().max_scn is not None, "a first window", 20)
        first = buffer.state().max_scn or 0
        time.sleep(1.0)  # time passing is the point: a rate
        windows = buffer.state().max_scn or 0  # every window since the start (SCN 1 on)
        elapsed = time.monotonic() - started
        run.finish()
    # 400 events/s in windows of 2: 200 windows/s. The fetcher keeps a schedule from its
    # start: after a stall it catches up in a burst, but never gets ahead of it. So counted
    # from before its start the rate is never exceeded, however busy the machine (1.2:
    # the slack the bound always had); counted from a later point, a catch-up burst could
    # exceed it. A busy machine can only make it slower, so the only lower bound is that
    # it goes on producing.
    assert windows <= 1.2 * 200 * elapsed, (windows, elapsed)
    assert windows > first, "no window in a second"
    assert run.reported == sorted(run.reported)
    assert run.reported[-1] >= (buffer.state().max_scn or 0) - 1


def test_stop_is_prompt_while_waiting_for_the_next_window(tmp_path: Path) -> None:
    with EventBuffer(tmp_path / "s.buf", 1 << 20) as buffer:
        # One window every 50 s: stopping must not wait for the next.
        run = Run("synthetic://?rate=0.02", buffer, RelayCatalog(tmp_path / "s.json"))
        wait_until(lambda: buffer.state().max_scn == 1, "the buffer at SCN 1", 20)
        # finish() asserts the thread ended within its 5 s join: long before the next
        # window is due, with slack for a busy machine.
        run.finish()
        assert buffer.state().max_scn == 1


def test_sources_and_schemas_are_registered_in_the_catalog(tmp_path: Path) -> None:
    uri = "synthetic://?rate=0&limit=4&events_per_window=3&source=a.one,b.two"
    with EventBuffer(tmp_path / "c.buf", 1 << 20, partition_id=3) as buffer:
        catalog = RelayCatalog(tmp_path / "c.json")
        catalog.for_buffer("other", 0).source_id("z.first")  # ids are relay-wide
        run = Run(uri, buffer, catalog)
        wait_until(lambda: buffer.state().max_scn == 4, "the buffer at SCN 4", 20)
        run.finish()
        windows = read_windows(buffer)
    entries = {e.name: e for e in catalog.sources()}
    assert (entries["a.one"].id, entries["b.two"].id) == (2, 3)
    assert entries["a.one"].buffer == "load" and entries["a.one"].partition_id == 3
    codec = AvroCodec(catalog.registry)
    seen: Counter[int] = Counter()
    for _, events in windows:
        assert len({e.source_id for e in events}) == 2  # windows span sources
        for e in events:
            assert e.header.schema_fingerprint == catalog.by_id(e.source_id).fingerprint
            assert codec.decode(e.value, e.header.schema_fingerprint)["id"] == e.key
            seen[e.source_id] += 1
    assert seen == {2: 6, 3: 6}
