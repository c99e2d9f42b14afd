"""``databus status``: the pure functions on hand-made documents, then the command
against a real relay, a relay without ``/v1/consumers`` and a dead address."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from rich.console import Console

from databus import _status_view as sv
from databus.cli import main
from databus.errors import ConfigError
from tests.relay_harness import free_port, relay_config, running_relay

NOW = 1_700_000_000.0

RELAY_STATUS: dict[str, Any] = {
    "event_loop": "uvloop",
    "workers": [{"pid": 11, "state": "running", "restarts": 0},
                {"pid": 12, "state": "restarting", "restarts": 2}],
    "buffers": {
        "shop": {
            "partition_id": 0, "prev_scn": 9, "min_scn": 10, "max_scn": 250,
            "used_bytes": 1 << 20, "capacity_bytes": 4 << 20, "events": 900,
            "windows": 240, "input_bytes_per_second": 2048.0,
            "fetcher": {"buffer": "shop", "source": "mysql://repl:***@db/", "state": "running",
                        "restarts": 1, "last_error": None, "last_error_at": None,
                        "source_scn": 260, "buffer_max_scn": 250, "lag_scn": 10,
                        "lag_seconds": 1.25,
                        "last_window_at": NOW - 3.0, "source_gaps": []},
            "dumps": [{"id": "d1", "buffer": "shop", "state": "running",
                       "reason": "initial_dump",
                       "progress": {"rows": 500, "estimate": 1000, "percent": 50.0,
                                    "table": "shop.orders", "rows_per_second": 250.0}}],
        },
        "idle": {
            "partition_id": 1, "prev_scn": None, "min_scn": None, "max_scn": None,
            "used_bytes": 0, "capacity_bytes": 1 << 20, "events": 0, "windows": 0,
            "input_bytes_per_second": 0.0,
            "fetcher": {"state": "failed", "restarts": 7, "last_error": "boom [x]",
                        "source_scn": None, "lag_scn": None, "lag_seconds": None,
                        "last_window_at": None},
            "dumps": [],
        },
    },
}

CONSUMER = {
    "client_id": "billing-1", "buffer": "shop", "address": "10.0.0.7",
    "filter": None, "sources": ["shop.orders"], "streaming": True, "checkpoint_scn": 240,
    "window_offset": -1, "lag_scn": 10, "lag_ms": 1500.0, "lag_seconds": 4.5,
    "events_per_second": 42.5,
    "bytes_per_second": 9000.0, "events_total": 1234, "bytes_total": 99999,
    "first_seen": NOW - 600, "last_seen": NOW - 2, "idle_s": 2.0,
    "something_newer": "ignored",
}
CONSUMERS = {"consumers": [CONSUMER], "tracked": 1, "max_tracked": 10000, "expiry_s": 3600,
             "evicted_total": 0}

BOOT_STATUS = {
    "event_loop": "asyncio",
    "storage": "sqlite:///var/lib/boot.db", "producer_scn": 250, "applied_scn": 200,
    "applier_lag_scn": 50, "applier_lag_seconds": 12.0, "producer_lag_seconds": None,
    "log_floor_scn": 0, "log_windows": 250, "log_bytes": 123456,
    "snapshot_rows": {"shop.orders": 70, "shop.items": 30}, "update_ratio": 0.25,
    "components": {"producer": {"state": "running", "errors": 0, "last_error": None},
                   "applier": {"state": "failed", "errors": 3, "last_error": "disk full"}},
}


# -- the pure functions -------------------------------------------------------------------


def test_relay_entry_carries_buffers_fetchers_dumps_and_consumers() -> None:
    entry = sv.relay_entry("http://127.0.0.1:11190", sv.Answer(RELAY_STATUS),
                           sv.Answer(CONSUMERS), NOW)
    assert entry["url"] == "http://127.0.0.1:11190" and entry["event_loop"] == "uvloop"
    shop, idle = entry["buffers"]
    assert (shop["name"], shop["min_scn"], shop["max_scn"], shop["fill"]) == ("shop", 10, 250,
                                                                              0.25)
    assert shop["fetcher"] == {"state": "running", "source_scn": 260, "lag_scn": 10,
                               "lag_seconds": 1.25, "last_window_age_s": 3.0,
                               "restarts": 1, "last_error": None}
    assert shop["dumps"][0]["percent"] == 50.0 and shop["dumps"][0]["table"] == "shop.orders"
    assert idle["min_scn"] is None and idle["fill"] == 0.0
    assert idle["fetcher"]["state"] == "failed" and idle["fetcher"]["last_window_age_s"] is None
    # Consumers: exactly the documented keys, whatever else a relay adds.
    [consumer] = entry["consumers"]
    assert tuple(consumer) == sv.CONSUMER_KEYS
    assert consumer["client_id"] == "billing-1" and consumer["lag_ms"] == 1500.0
    assert entry["consumer_registry"] == {"tracked": 1, "max_tracked": 10000,
                                          "expiry_s": 3600, "evicted_total": 0}
    assert entry["consumers_error"] is None
    assert entry["workers"] == [{"pid": 11, "state": "running", "restarts": 0},
                                {"pid": 12, "state": "restarting", "restarts": 2}]


def test_a_relay_without_the_consumer_endpoint_is_up_with_consumers_not_available() -> None:
    missing = sv.Answer(error="/v1/consumers answered 404 not_found: no route", status=404)
    entry = sv.relay_entry("http://r:1", sv.Answer(RELAY_STATUS), missing, NOW)
    assert "error" not in entry
    assert entry["consumers"] is None and entry["consumers_error"] == "not available"
    document = sv.build_document([entry], [], NOW)
    # Up, but its "idle" buffer's fetcher failed and a worker restarts: not ready (what
    # its /readyz says).
    assert document["ok"] and not document["ready"] and sv.exit_status(document) == 1
    assert [(c["component"], c.get("buffer"), c["error"]) for c in entry["not_ready"]] == [
        ("fetcher", "idle", "fetcher_failed"), ("worker", None, "worker_restarting")]
    rows = sv.consumer_rows(document)
    assert rows == [("http://r:1", "consumers: not available", *("",) * 7)]


def test_other_consumer_failures_are_reported_but_the_relay_stays_up() -> None:
    failed = sv.Answer(error="no answer to /v1/consumers within 5 s")
    entry = sv.relay_entry("http://r:1", sv.Answer(RELAY_STATUS), failed, NOW)
    assert entry["consumers_error"] == "no answer to /v1/consumers within 5 s"
    odd = sv.relay_entry("http://r:1", sv.Answer(RELAY_STATUS), sv.Answer({"x": 1}), NOW)
    assert odd["consumers"] is None and "not a consumer list" in odd["consumers_error"]


def test_a_relay_that_does_not_answer_is_down_without_its_password() -> None:
    entry = sv.relay_entry("http://ops:pa55word-x@10.1.1.1:11190",
                           sv.Answer(error="cannot connect: refused"), sv.Answer(), NOW)
    assert entry == {"url": "http://ops:***@10.1.1.1:11190", "error": "cannot connect: refused"}
    not_a_relay = sv.relay_entry("http://r:1", sv.Answer({"status": "ok"}), sv.Answer(), NOW)
    assert set(not_a_relay) == {"url", "error"}
    document = sv.build_document([entry, not_a_relay], [], NOW)
    assert document["down"] == 2 and not document["ok"] and sv.exit_status(document) == 1


def test_bootstrap_entry() -> None:
    entry = sv.bootstrap_entry("http://b:11191", sv.Answer(BOOT_STATUS))
    assert entry["log_scn"] == 250 and entry["applied_scn"] == 200
    assert entry["applier_lag_scn"] == 50 and entry["snapshot_rows"] == 100
    assert entry["components"]["applier"] == {"state": "failed", "errors": 3,
                                              "last_error": "disk full"}
    assert entry["event_loop"] == "asyncio"
    [row] = sv.bootstrap_rows(sv.build_document([], [entry], NOW))
    assert row[1:4] == ("250", "200", "12.0 s")
    assert entry["producer_lag_seconds"] is None  # unknown stays unknown
    assert isinstance(row[6], sv.Styled) and row[6].style == sv.ALERT
    assert row[6] == "producer running, applier failed (disk full)"
    down = sv.bootstrap_entry("http://b:1", sv.Answer({"buffers": {}}))
    assert "not a bootstrap service" in down["error"]


def test_rows_and_render() -> None:
    entry = sv.relay_entry("http://r:1", sv.Answer(RELAY_STATUS), sv.Answer(CONSUMERS), NOW)
    down = sv.relay_entry("http://r:2", sv.Answer(error="cannot connect: [Errno 111] x"),
                          sv.Answer(), NOW)
    boot = sv.bootstrap_entry("http://b:1", sv.Answer(BOOT_STATUS))
    document = sv.build_document([entry, down], [boot], NOW)
    assert sv.buffer_rows(document) == [
        ("http://r:1", "shop", "10..250", "25.0% (1.0 MiB/4.0 MiB)", "2.0 KiB/s", "240", "900"),
        ("http://r:1", "idle", "empty", "0.0% (0 B/1.0 MiB)", "0 B/s", "0", "0"),
    ]
    fetchers = sv.fetcher_rows(document)
    assert fetchers[0][2:7] == ("running", "1.2 s", "260", "10", "3 s ago")
    assert fetchers[1][2] == "failed" and isinstance(fetchers[1][2], sv.Styled)
    # Lag in seconds the relay cannot give is "unknown", never 0 (DESIGN 17).
    assert fetchers[1][3] == "unknown"
    assert sv.consumer_rows(document) == [
        ("http://r:1", "billing-1", "shop", "240", "10", "4.5 s", "42.5", "2 s ago",
         "stream")]
    [dump] = sv.dump_rows(document)
    assert "50.0% running: 500/1,000 rows, shop.orders" in dump[3]
    console = Console(record=True, width=250, color_system=None)
    console.print(sv.render(document))
    text = console.export_text()
    for expected in ("1 service(s) down", "DOWN", "[Errno 111]", "boom [x]", "billing-1",
                     "Bootstrap services", "Dumps", "event loop uvloop",
                     "3 processes (1/2 workers running, 2 restart(s))"):
        assert expected in text, expected


def test_urls() -> None:
    assert sv.normalize_url("127.0.0.1:11190") == "http://127.0.0.1:11190"
    assert sv.normalize_url("https://h/relay/?x=1#f") == "https://h/relay"
    with pytest.raises(ConfigError):
        sv.normalize_url("ftp://h/")
    assert sv.display_url("http://u:p4ss-word@h:1") == "http://u:***@h:1"


# -- the command ----------------------------------------------------------------------------

LOAD = "synthetic://?rate=0&keys=100&event_bytes=200&events_per_window=2&limit=20&seed=1"


@contextlib.asynccontextmanager
async def fake_old_relay(hits: list[float] | None = None) -> AsyncIterator[str]:
    """A relay from before the consumer registry: /v1/status, and JSON 404 for the rest.
    ``hits`` gets the time of each /v1/status request."""

    async def status(request: web.Request) -> web.Response:
        if hits is not None:
            hits.append(time.monotonic())
        return web.json_response({"buffers": {"old": RELAY_STATUS["buffers"]["idle"]}})

    async def not_found(request: web.Request) -> web.Response:
        return web.json_response({"error": "not_found", "message": "no such endpoint"},
                                 status=404)

    app = web.Application()
    app.router.add_get("/v1/status", status)
    app.router.add_route("*", "/{tail:.*}", not_found)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--log-level", "ERROR", *argv])
    return code, out.getvalue(), err.getvalue()


def test_status_json_against_a_real_relay_an_old_one_and_a_dead_address(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # the tables' width when not on a terminal
    dead = f"http://127.0.0.1:{free_port()}"

    async def main_() -> None:
        async with running_relay(relay_config(tmp_path, {"load": LOAD})) as r, \
                fake_old_relay() as old:
            await r.wait_for_scn("load", 20)
            # A consumer with an id, for a relay that has the consumer registry.
            async with await r.get("/v1/stream", client_id="status-test") as resp:
                assert resp.status == 200
                await resp.read()
            real = r.url.replace("http://", "http://ops:pa55-s3cret@")
            code, out, err = await asyncio.to_thread(
                run_cli, "status", "--json", "--timeout", "3", "--relay", real, old,
                "--relay", dead)
            assert code == 1, err
            assert "pa55-s3cret" not in out + err
            doc = json.loads(out)
            assert set(doc) == {"version", "generated_at", "ok", "down", "ready",
                                "not_ready", "relays", "bootstraps", "replicators"}
            assert doc["version"] == 1 and doc["ok"] is False and doc["down"] == 1
            assert doc["bootstraps"] == []
            live, older, gone = doc["relays"]
            assert live["url"] == r.url.replace("http://", "http://ops:***@")
            [load] = live["buffers"]
            assert (load["name"], load["min_scn"], load["max_scn"]) == ("load", 1, 20)
            assert load["windows"] == 20 and load["events"] == 40
            assert load["capacity_bytes"] == 4 << 20 and 0 < load["fill"] < 1
            assert load["fetcher"]["state"] in {"running", "idle", "stopped"}
            if live["consumers"] is None:  # a relay before the consumer registry
                assert live["consumers_error"] == "not available"
            else:
                assert "status-test" in [c["client_id"] for c in live["consumers"]]
            assert older["consumers"] is None and older["consumers_error"] == "not available"
            assert [b["name"] for b in older["buffers"]] == ["old"]
            assert set(gone) == {"url", "error"} and gone["url"] == dead
            assert gone["error"].startswith("cannot connect")

            # The tables: once, the same services.
            code, out, _ = await asyncio.to_thread(
                run_cli, "status", "--timeout", "3", "--relay", r.url)
            assert code == 0, out
            assert "all services up and ready" in out
            # The old relay's fetcher failed: up, but not ready, and the exit status says so.
            code, out, _ = await asyncio.to_thread(
                run_cli, "status", "--timeout", "3", "--relay", r.url, old)
            assert code == 1
            assert "1 component(s) not ready" in out and "consumers: not available" in out
            assert "fetcher_failed" in out and "restart the relay" in out

    asyncio.run(main_())


def test_status_with_no_service_or_a_bad_url_is_an_error() -> None:
    code, _, err = run_cli("status")
    assert code == 1 and "--relay" in err
    code, _, err = run_cli("status", "--bootstrap", "ftp://x")
    assert code == 1 and "http(s)" in err


def test_watch_refreshes_until_ctrl_c() -> None:
    exe = Path(sys.executable).with_name("databus")

    async def main_() -> None:
        hits: list[float] = []
        async with fake_old_relay(hits) as old:
            proc = await asyncio.create_subprocess_exec(
                str(exe), "status", "--relay", old, "--watch", "0.2",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "COLUMNS": "200"})
            try:
                # Three refreshes: the loop runs (and the child is past its imports, so
                # Ctrl-C lands in the watch, not in Python's start-up).
                for _ in range(300):
                    if len(hits) >= 3 or proc.returncode is not None:
                        break
                    await asyncio.sleep(0.05)
                assert len(hits) >= 3
                assert hits[2] - hits[1] >= 0.15  # every 0.2 s, not in a busy loop
                proc.send_signal(signal.SIGINT)
                out, err = await asyncio.wait_for(proc.communicate(), 20)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            # Ctrl-C ends it with the status of the last refresh (up, but its fetcher
            # failed: not ready).
            assert proc.returncode == 1, err.decode()
            assert "consumers: not available" in out.decode()
            assert "Traceback" not in err.decode()

    asyncio.run(main_())


# -- readiness (DESIGN 17): the same verdict as each service's /readyz --------------------


def test_anything_not_ready_makes_the_exit_status_1() -> None:
    running = {"buffers": {"shop": RELAY_STATUS["buffers"]["shop"]}}
    relay = sv.relay_entry("http://r:1", sv.Answer(running), sv.Answer(CONSUMERS), NOW)
    assert relay["ready"] and relay["not_ready"] == []
    assert sv.exit_status(sv.build_document([relay], [], NOW)) == 0
    backoff = json.loads(json.dumps(running))
    backoff["buffers"]["shop"]["fetcher"].update(state="backoff", last_error="refused")
    entry = sv.relay_entry("http://r:1", sv.Answer(backoff), sv.Answer(CONSUMERS), NOW)
    assert sv.exit_status(sv.build_document([entry], [], NOW)) == 1
    # A fenced producer of a bootstrap service.
    fenced = {**BOOT_STATUS, "components": {
        "producer": {"state": "fenced", "errors": 0, "last_error": "token 1 is no longer"},
        "applier": {"state": "running", "errors": 0, "last_error": None}}}
    boot = sv.bootstrap_entry("http://b:1", sv.Answer(fenced))
    [down] = boot["not_ready"]
    assert (down["component"], down["error"]) == ("producer", "producer_fenced")
    assert "fencing token" in down["fix"]
    document = sv.build_document([relay], [boot], NOW)
    assert document["ok"] and not document["ready"] and sv.exit_status(document) == 1
    assert [r[2] for r in sv._service_rows(document)] == ["up", "NOT READY"]


def test_replicators_in_the_view_and_their_readiness() -> None:
    from databus._status_services import not_ready_rows, replicator_entry, replicator_rows

    doc = {"replication": "copy", "state": "running", "target": "sqlite:///t.db",
           "applied_scn": 90, "relay_max_scn": 100, "lag_scn": 10, "lag_ms": 250.0,
           "batches": 5, "errors": 0, "last_error": None, "tables": {"shop.orders": {}}}
    applying = replicator_entry("http://rep:1", sv.Answer(doc))
    assert applying["ready"] and applying["lag_scn"] == 10 and applying["tables"] == 1
    assert sv.exit_status(sv.build_document([], [], NOW, [applying])) == 0
    retrying = replicator_entry("http://rep:1", sv.Answer(
        {**doc, "state": "retrying", "last_error": "target down"}))
    document = sv.build_document([], [], NOW, [retrying])
    assert sv.exit_status(document) == 1
    [row] = not_ready_rows(document)
    assert row[:5] == ("replicator", "http://rep:1", "replicator", "retrying",
                       "replicator_retrying") and row[5] == "target down"
    assert replicator_rows(document)[0][2] == "retrying"
    gone = replicator_entry("http://rep:1", sv.Answer(error="cannot connect"))
    assert sv.exit_status(sv.build_document([], [], NOW, [gone])) == 1
    console = Console(record=True, width=250, color_system=None)
    console.print(sv.render(sv.build_document([], [], NOW, [applying])))
    assert "Replicators" in console.export_text()


def test_a_quarantined_source_is_shown_not_ready_and_in_red() -> None:
    """DESIGN 17: a buffer's quarantined sources (its /v1/status ``quarantined``)."""
    status = json.loads(json.dumps(RELAY_STATUS))
    buffer = next(iter(status["buffers"].values()))
    buffer["quarantined"] = [{"source": "shop.items", "scn": 230, "reason": "bad row",
                              "fix": "databus relay heal", "since": NOW - 60}]
    entry = sv.relay_entry("http://r:1", sv.Answer(status), sv.Answer(CONSUMERS), NOW)
    (q,) = entry["buffers"][0]["quarantined"]
    assert q == {"source": "shop.items", "scn": 230, "reason": "bad row",
                 "fix": "databus relay heal", "since": NOW - 60, "age_s": 60.0,
                 "state": "quarantined", "ready": False}
    document = sv.build_document([entry], [], NOW)
    (row,) = sv.quarantine_rows(document)
    assert row[2] == "shop.items" and row[3] == "QUARANTINED"
    assert isinstance(row[3], sv.Styled) and row[3].style == sv.ALERT
    out = io.StringIO()
    Console(file=out, width=200).print(sv.render(document))
    assert "Quarantined sources" in out.getvalue() and "QUARANTINED" in out.getvalue()
    plain = sv.relay_entry("http://r:1", sv.Answer(RELAY_STATUS), sv.Answer(CONSUMERS), NOW)
    assert plain["buffers"][0]["quarantined"] == []
    assert sv.quarantine_rows(sv.build_document([plain], [], NOW)) == []
