"""A relay's stream narrowed to a reader's grant (relay/_access.py, relay/_subscription.py
``subscription``) on a real ``EventBuffer``: tables created after the request began, the
in-band markers of ungranted sources, what a buffer may hold for a grant; and what a
cluster member presents to its leader (relay/cluster)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from databus.checkpoint import Checkpoint
from databus.config import RelayClusterConfig, TLSConfig, redact_uri
from databus.errors import ForbiddenError, UnknownSourceError
from databus.event import (
    HEARTBEAT_SOURCE_ID,
    Op,
    encode_dump_marker,
    encode_eow,
    encode_event,
    iter_events,
)
from databus.fetchers._api import ConfiguredSources
from databus.relay._access import may_hold, strip_markers
from databus.relay._buffer import EventBuffer, ReadResult
from databus.relay._subscription import subscription
from databus.relay.cluster._member import chain_uri
from databus.relay.quarantine._record import QuarantineMarker, encode_quarantine_marker
from databus.security import ClientCredentials, Grant, Reader

ORDERS, ITEMS, LATER, OTHER = 1, 2, 3, 4


@dataclass
class Entry:
    name: str
    id: int
    buffer: str = "shop"


@dataclass
class Catalog:
    entries: list[Entry] = field(default_factory=list)

    def sources(self) -> list[Entry]:
        return list(self.entries)

    def by_id(self, source_id: int) -> Entry:
        for e in self.entries:
            if e.id == source_id:
                return e
        raise UnknownSourceError(f"no source {source_id}")

    def source(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise UnknownSourceError(f"unknown source {name!r}")


class Fetchers:
    def __init__(self, configured: ConfiguredSources) -> None:
        self.configured = configured

    def configured_sources(self) -> dict[str, ConfiguredSources]:
        return {"shop": self.configured}

    def configured_buffer(self, name: str) -> str | None:
        return "shop" if self.configured.matches(name) else None

    def unlisted(self, buffer: str) -> frozenset[str]:
        return frozenset()


@dataclass
class View:
    catalog: Catalog
    fetchers: Fetchers
    buffers: dict[str, EventBuffer]


def window(buffer: EventBuffer, scn: int, sources: list[int]) -> None:
    buffer.start_window(scn)
    for i, source in enumerate(sources):
        buffer.append(encode_event(scn=scn, source_id=source, op=Op.UPSERT, key=i,
                                   value=b"v"))
    buffer.end_window()


def served(view: View, who: Reader, **query: str) -> tuple[list[int], bool]:
    path = "/v1/stream?" + "&".join(f"{k}={v}" for k, v in query.items())
    name, select, _, narrowed = subscription(view, make_mocked_request("GET", path), who)
    got = view.buffers[name].read(Checkpoint.flexible(),
                                  max_bytes=1 << 20, select=select)
    return [h.source_id for _, h in iter_events(got.data) if h.source_id >= 0], narrowed


@pytest.fixture
def view(tmp_path: Path) -> View:
    buffer = EventBuffer(tmp_path / "shop.buf", 1 << 20)
    catalog = Catalog([Entry("shop.orders", ORDERS), Entry("shop.items", ITEMS),
                       Entry("misc.other", OTHER)])
    return View(catalog, Fetchers(ConfiguredSources(databases=frozenset({"shop", "misc"}))),
                {"shop": buffer})


def test_no_sources_is_narrowed_to_the_grant_tables_created_later_included(
        view: View) -> None:
    buffer = view.buffers["shop"]
    window(buffer, 1, [ORDERS, ITEMS, OTHER])
    orders = Reader("o", Grant(("shop.orders",)))
    shop = Reader("s", Grant(("shop.*",)))
    # The request's filter is built before shop.later exists (its id unknown).
    got, narrowed = served(view, shop)
    assert narrowed and got == [ORDERS, ITEMS]
    view.catalog.entries.append(Entry("shop.later", LATER))
    window(buffer, 2, [LATER, ORDERS, OTHER])
    assert served(view, shop)[0] == [ORDERS, ITEMS, LATER, ORDERS]
    assert served(view, orders)[0] == [ORDERS, ORDERS]
    everyone = Reader("all", Grant.all())
    assert served(view, everyone) == ([ORDERS, ITEMS, OTHER, LATER, ORDERS, OTHER], False)
    # Naming sources is not narrowed: what is not granted is refused.
    assert served(view, orders, sources="shop.orders") == ([ORDERS, ORDERS], False)
    with pytest.raises(ForbiddenError):
        served(view, orders, sources="shop.orders,shop.items")
    with pytest.raises(ForbiddenError):
        served(view, orders, filter='{"shop.items":{"type":"hash","n":2,"buckets":[0]}}')
    with pytest.raises(ForbiddenError):
        served(view, Reader("x", Grant(("elsewhere.*",))))


def test_a_pattern_subscription_is_narrowed_to_the_grant(view: View) -> None:
    """``sources=shop.*``: every table of shop, now and later, that the reader may read;
    ungranted ones are left out, not refused (DESIGN 18)."""
    buffer = view.buffers["shop"]
    window(buffer, 1, [ORDERS, ITEMS, OTHER])
    orders = Reader("o", Grant(("shop.orders",)))
    everyone = Reader("all", Grant.all())
    got, by_name = served(view, orders, sources="shop.*")
    assert by_name and got == [ORDERS]
    assert served(view, everyone, sources="shop.*")[0] == [ORDERS, ITEMS]
    assert served(view, everyone, sources="*")[0] == [ORDERS, ITEMS, OTHER]
    assert served(view, orders, sources="*")[0] == [ORDERS]
    # A pattern beside a name: both; a table created later under the pattern too.
    view.catalog.entries.append(Entry("shop.later", LATER))
    window(buffer, 2, [LATER, OTHER, ITEMS])
    assert served(view, everyone, sources="shop.*,misc.other")[0] == [
        ORDERS, ITEMS, OTHER, LATER, OTHER, ITEMS]
    assert served(view, orders, sources="shop.*")[0] == [ORDERS]
    # A pattern of a database the reader has nothing of: 403; of none at all: 404.
    with pytest.raises(ForbiddenError):
        served(view, orders, sources="misc.*")
    with pytest.raises(UnknownSourceError):
        served(view, everyone, sources="nowhere.*")


def test_the_filter_of_a_late_table_sees_it_once_it_exists(view: View) -> None:
    """The compiled filter of one request, reused over reads (as a stream does): a
    table created under the grant's pattern after the request began is served."""
    buffer = view.buffers["shop"]
    shop = Reader("s", Grant(("shop.*",)))
    _, select, _, _ = subscription(view, make_mocked_request("GET", "/v1/stream"), shop)
    view.catalog.entries.append(Entry("shop.later", LATER))
    window(buffer, 1, [LATER, OTHER, ITEMS])
    got = buffer.read(Checkpoint.flexible(),
                      max_bytes=1 << 20, select=select)
    assert [h.source_id for _, h in iter_events(got.data) if h.source_id >= 0] == [
        LATER, ITEMS]


def _result(parts: list[bytes]) -> ReadResult:
    return ReadResult(data=b"".join(parts), checkpoint=Checkpoint.after(5), events=1, windows=1)


def test_markers_of_ungranted_sources_are_taken_out() -> None:
    orders_start = encode_dump_marker(scn=5, kind="start", source="shop.orders",
                                      dump_id="d1")
    items_end = encode_dump_marker(scn=5, kind="end", source="shop.items", dump_id="d1",
                                   rows=3)
    quarantined = encode_quarantine_marker(window_scn=5, marker=QuarantineMarker(
        "shop.items", "quarantined", 5, "bad row", "fix it"))
    data = encode_event(scn=5, source_id=ORDERS, op=Op.UPSERT, key=1, value=b"x")
    eow = encode_eow(scn=5, event_count=1, checksum=0)
    result = _result([orders_start, items_end, quarantined, data, eow])
    kept = strip_markers(result, Grant(("shop.orders",)))
    assert kept.data == orders_start + data + eow
    assert kept.checkpoint == result.checkpoint and kept.events == result.events
    assert strip_markers(result, Grant(("shop.*",))) is result
    assert strip_markers(result, Grant.all()) is result
    # Other control events (heartbeats, checkpoints) are not markers: kept.
    assert HEARTBEAT_SOURCE_ID not in (
        h.source_id for _, h in iter_events(kept.data))


def test_may_hold() -> None:
    configured = ConfiguredSources(names=frozenset({"shop.orders"}),
                                   databases=frozenset({"misc"}))
    assert may_hold(Grant(("shop.orders",)), [], configured)
    assert may_hold(Grant(("misc.*",)), [], configured)
    assert may_hold(Grant(("misc.t",)), [], configured)
    assert may_hold(Grant(("*",)), [], configured)
    assert not may_hold(Grant(("shop.items",)), [], configured)
    assert not may_hold(Grant(("web.*",)), ["shop.orders"], None)
    assert may_hold(Grant(("web.*",)), ["web.pages"], None)
    everything = ConfiguredSources(everything=True, excluded_databases=frozenset({"mysql"}))
    assert may_hold(Grant(("web.*",)), [], everything)
    assert not may_hold(Grant(("mysql.*",)), [], everything)


def test_a_follower_chains_with_the_cluster_credentials(tmp_path: Path) -> None:
    credentials = ClientCredentials.of(ca_file=tmp_path / "ca.pem",
                                       cert_file=tmp_path / "me.crt",
                                       key_file=tmp_path / "me.key", token="s3cr3t/+tok")
    uri = chain_uri("https://leader:11190/", ["shop.a", "shop.b"], credentials)
    assert uri.startswith("relay+https://leader:11190/?sources=shop.a,shop.b&")
    from urllib.parse import parse_qs, urlsplit

    query = {k: v[0] for k, v in parse_qs(urlsplit(uri).query).items()}
    assert ClientCredentials.from_query(query) == credentials
    assert "s3cr3t" not in redact_uri(uri)
    plain = chain_uri("http://leader:11190", ["shop.a"], ClientCredentials())
    assert plain == "relay+http://leader:11190/?sources=shop.a"


def test_member_url_carries_https_under_tls(tmp_path: Path) -> None:
    from databus.relay.cluster._setup import member_url
    from tests.relay_harness import relay_config

    cluster = RelayClusterConfig(zookeeper="127.0.0.1:2181/x", name="c")
    for tls, scheme in ((None, "http"), (TLSConfig(cert_file=tmp_path / "c",
                                                   key_file=tmp_path / "k"), "https")):
        config = dataclasses.replace(relay_config(tmp_path, {"b": "synthetic://"}),
                                     port=11190, tls=tls, cluster=cluster)

        @dataclass
        class FakeRelay:
            config: Any

        assert member_url(FakeRelay(config)).startswith(f"{scheme}://")  # type: ignore[arg-type]
