"""The pure parts of relay chaining (databus.fetchers.relay): the relay+http:// URI,
whole windows out of bodies cut anywhere, and source ids remapped by name."""

from __future__ import annotations

import re

import pytest

from databus.batch import encode_event
from databus.errors import ConfigError, EventFormatError
from databus.event import (
    EOW_SOURCE_ID,
    Op,
    WindowChecksum,
    decode_event,
    encode_dump_marker,
    encode_eow,
    verify_event,
)
from databus.fetchers._api import FetcherContext, fetcher_class
from databus.fetchers.relay import (
    ChainURI,
    RelayChainFetcher,
    SourceIdMap,
    WindowAssembler,
    remap_event,
)

# -- the URI ---------------------------------------------------------------------------


def test_uri_one_upstream_with_sources_and_filter() -> None:
    uri = ChainURI.parse('relay+http://relay1:11190/?sources=shop.orders,shop.items'
                         '&filter={"shop.orders":{"type":"mod","n":2,"buckets":"[0]"}}')
    assert uri.upstreams == ("http://relay1:11190",)
    assert uri.sources == ("shop.orders", "shop.items")
    assert uri.filter_json == '{"shop.orders":{"buckets":"[0]","n":2,"type":"mod"}}'
    assert uri.follow is True


def test_uri_several_upstreams_in_order_default_port_and_ipv6() -> None:
    uri = ChainURI.parse("relay+http://b:1,A:2,[::1]:3,c/?sources=a.b")
    assert uri.upstreams == ("http://b:1", "http://a:2", "http://[::1]:3", "http://c:11190")


def test_uri_options() -> None:
    uri = ChainURI.parse("relay+http://h:1?sources=a.b&follow=false&heartbeat_ms=200"
                         "&wait_ms=100&max_bytes=65536&backoff_max_s=0.5")
    assert (uri.follow, uri.heartbeat_ms, uri.wait_ms, uri.max_bytes, uri.backoff_max_s) == (
        False, 200, 100, 65536, 0.5)


@pytest.mark.parametrize(("uri", "message"), [
    ("relay+http://h:1/", "needs sources="),
    ("relay+http:///?sources=a.b", "names no upstream"),
    ("relay+http://h:1/?sources=ab", "not database.table"),
    ("relay+http://h:1/?sources=a.b,a.b", "listed twice"),
    ("relay+http://h:1,h:1/?sources=a.b", "listed twice"),
    ("relay+http://h:1,,g:2/?sources=a.b", "empty host"),
    ("relay+http://h:99999/?sources=a.b", "bad port"),
    ("relay+http://h:x/?sources=a.b", "bad port"),
    ("relay+http://u:p@h:1/?sources=a.b", "user info"),
    ("relay+http://h:1/path?sources=a.b", "no path"),
    ("relay+http://h:1/?sources=a.b&sorces=c.d", "unknown parameter 'sorces'"),
    ("relay+http://h:1/?sources=a.b&follow=maybe", "true or false"),
    ("relay+http://h:1/?sources=a.b&heartbeat_ms=1", "heartbeat_ms"),
    ("relay+http://h:1/?sources=a.b&filter={bad", "bad filter"),
    ('relay+http://h:1/?sources=a.b&filter={"x.y":{"type":"mod","n":2,"buckets":"[0]"}}',
     "x.y"),
    ("http://h:1/?sources=a.b", "relay+http"),
])
def test_uri_errors(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ChainURI.parse(uri)


def test_fetcher_found_by_scheme_and_names_its_sources() -> None:
    uri = "relay+http://h:1/?sources=shop.orders,shop.items"
    cls = fetcher_class(uri)
    assert cls is RelayChainFetcher
    fetcher = cls(uri, FetcherContext("b", 0, catalog=_Catalog()))
    configured = fetcher.configured_sources()
    assert configured is not None
    assert configured.names == {"shop.orders", "shop.items"}
    assert configured.matches("shop.orders") and not configured.matches("shop.other")


class _Catalog:
    def source_id(self, name: str) -> int:
        return 7

    def register_schema(self, name: str, schema: object) -> object:
        return schema


# -- windows -------------------------------------------------------------------------


def window(scn: int, keys: list[int], source_id: int = 1, ts: int = 0) -> list[bytes]:
    events = [encode_event(scn, Op.UPSERT, source_id, k, b"v%d" % k, 0, ts + i, 0, False)
              for i, k in enumerate(keys)]
    check = WindowChecksum()
    for e in events:
        check.add_event(e)
    return [*events, encode_eow(scn=scn, event_count=check.count, checksum=check.crc,
                                timestamp_ns=ts + 99)]


def test_assembler_gives_whole_windows_from_bodies_cut_anywhere() -> None:
    stream = b"".join([*window(5, [1, 2, 3], ts=1000), *window(7, [], ts=2000),
                       *window(9, [4], ts=3000)])
    for cut_every in (1, 13, 56, 70, 500, len(stream)):
        # A relay cuts bodies at event boundaries; emulate cuts after every n-th byte by
        # rounding to the next event end.
        ends = _event_ends(stream)
        pieces, start = [], 0
        for end in ends:
            if end - start >= cut_every or end == ends[-1]:
                pieces.append(stream[start:end])
                start = end
        assembler = WindowAssembler()
        got = [w for piece in pieces for w in assembler.feed(piece)]
        assert [w.scn for w in got] == [5, 7, 9]
        assert [len(w.events) for w in got] == [3, 0, 1]
        assert [w.timestamp_ns for w in got] == [1099, 2099, 3099]
        assert all(w.complete and w.checksum == w.eow_checksum for w in got)
        assert b"".join(raw for w in got for _, raw in w.events) == b"".join(
            e for e in (*window(5, [1, 2, 3], ts=1000)[:3], window(9, [4], ts=3000)[0]))
        assert assembler.open_scn is None


def _event_ends(stream: bytes) -> list[int]:
    ends, pos = [], 0
    while pos < len(stream):
        pos += verify_event(stream, pos).total_length
        ends.append(pos)
    return ends


def test_assembler_holds_an_open_window_and_reset_drops_it() -> None:
    events = window(5, [1, 2, 3])
    assembler = WindowAssembler()
    assert assembler.feed(b"".join(events[:2])) == []
    assert assembler.open_scn == 5
    assembler.reset()
    assert assembler.open_scn is None
    # Read again from its start: whole, once.
    got = assembler.feed(b"".join(events))
    assert [(w.scn, len(w.events)) for w in got] == [(5, 3)]


def test_assembler_keeps_dump_markers_in_order_and_sees_filtered_windows() -> None:
    marker = encode_dump_marker(scn=5, kind="start", source="a.b", dump_id="d1")
    data = window(5, [1, 2])
    # A filtered window: one data event of two, the upstream's own EOW.
    body = b"".join([marker, data[0], data[2]])
    (got,) = WindowAssembler().feed(body)
    assert [sid for sid, _ in got.events] == [-6, 1]
    assert got.events[0][1] == marker
    assert (got.count, got.eow_count, got.complete) == (1, 2, False)


@pytest.mark.parametrize("damage", ["crc", "torn", "control", "cut_eow"])
def test_assembler_refuses_bad_bodies_and_keeps_its_state(damage: str) -> None:
    first = window(5, [1, 2])
    assembler = WindowAssembler()
    assembler.feed(first[0])
    if damage == "crc":
        bad = bytearray(first[1])
        bad[-1] ^= 1
        body = bytes(bad)
    elif damage == "torn":
        body = window(6, [3])[0]  # window 6 begins before window 5 ended
    elif damage == "control":
        body = encode_eow(scn=5, event_count=0, checksum=0)[:0] + _heartbeat(5)
    else:
        body = first[1] + first[2][:30]  # cut inside the EOW
    with pytest.raises(EventFormatError) as info:
        assembler.feed(body)
    assert info.value.retriable
    assert assembler.open_scn == 5
    got = assembler.feed(b"".join(first[1:]))  # the state is as before the bad body
    assert [(w.scn, w.count, w.complete) for w in got] == [(5, 2, True)]


def _heartbeat(scn: int) -> bytes:
    from databus.event import HEARTBEAT_SOURCE_ID, encode_control

    return encode_control(scn=scn, source_id=HEARTBEAT_SOURCE_ID, payload=b"{}")


# -- source ids ----------------------------------------------------------------------


def test_remap_rewrites_only_the_source_id_and_header_crc() -> None:
    raw = window(5, [42], source_id=3, ts=77)[0]
    out = remap_event(raw, 3, 9)
    event, before = decode_event(out), decode_event(raw)  # both verify their CRCs
    assert event.header.source_id == 9
    assert event.header._replace(source_id=3, header_crc=0) == before.header._replace(
        header_crc=0)
    assert (event.key_bytes, event.value) == (before.key_bytes, before.value)
    assert out[8:34] == raw[8:34] and out[36:] == raw[36:]
    assert remap_event(raw, 3, 3) is raw


def test_source_id_map_by_name_per_upstream() -> None:
    allocated: list[str] = []

    def local_id(name: str) -> int:
        allocated.append(name)
        return {"shop.orders": 1, "shop.items": 2}[name]

    ids = SourceIdMap(local_id, frozenset({"shop.orders", "shop.items"}))
    a = {5: "shop.orders", 6: "shop.items", 7: "shop.other"}
    b = {1: "shop.items", 2: "shop.orders"}
    assert ids.local("http://a", a, 5) == 1
    assert ids.local("http://a", a, 6) == 2
    assert ids.local("http://b", b, 1) == 2
    assert ids.local("http://b", b, 2) == 1
    assert ids.local("http://a", a, 5) == 1
    assert allocated == ["shop.orders", "shop.items", "shop.items", "shop.orders"]
    with pytest.raises(EventFormatError, match="does not hold") as info:
        ids.local("http://a", a, 7)
    assert info.value.retriable
    with pytest.raises(EventFormatError, match="does not list"):
        ids.local("http://a", a, 8)
    # A new map of an upstream (it restarted, say) is used from then on.
    assert ids.local("http://a", {5: "shop.items"}, 5) == 2


def test_eow_is_not_an_event_of_the_window() -> None:
    (got,) = WindowAssembler().feed(b"".join(window(3, [1])))
    assert EOW_SOURCE_ID not in [sid for sid, _ in got.events]
