"""``databus status`` at any terminal width: real-looking documents rendered at 60, 80
and 120 columns (and ``--wide``) keep every SCN, lag and number whole, never end a cell
in "...", show URLs as host:port when full ones do not fit, hide columns by priority and
say so, list hidden errors and fixes under their table, and mark stale rows."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console

from databus import _status_view as sv
from databus._status_render import STALE_AFTER_S, keep_last_answers
from databus._status_services import replicator_entry
from databus._tables import Col, FitTable, fit_table, short_url
from databus.cli import main
from tests.relay_harness import relay_config, running_relay

NOW = 1_800_000_000.0
RELAY = "https://ops:pa55@relay-01.eu-west-1.prod.example.com:11190"
BOOT = "https://bootstrap-01.eu-west-1.prod.example.com:11191"
REPL = "http://replicator-01.eu-west-1.prod.example.com:9464"
# Binlog SCNs: file number << 32 | position, the longest figures the view shows.
SCN_MIN, SCN_MAX, SOURCE_SCN = 73014444032, 77309411327, 77309415123


def fetcher(**kw: Any) -> dict[str, Any]:
    return {"state": "running", "restarts": 0, "last_error": None, "source_scn": SOURCE_SCN,
            "lag_scn": SOURCE_SCN - SCN_MAX, "lag_seconds": 0.84,
            "last_window_at": NOW - 0.4, **kw}


def relay_status() -> dict[str, Any]:
    buffer = {"partition_id": 0, "prev_scn": SCN_MIN - 1, "min_scn": SCN_MIN,
              "max_scn": SCN_MAX, "used_bytes": 3_221_225_472, "capacity_bytes": 4 << 30,
              "events": 48_213_377, "windows": 9_120_004,
              "input_bytes_per_second": 5_832_110.0, "fetcher": fetcher(), "dumps": []}
    failing = {**buffer, "fetcher": fetcher(
        state="backoff", restarts=12, lag_seconds=None,
        last_error="(2013, 'Lost connection to MySQL server during query "
                   "([Errno 104] Connection reset by peer)')"),
        "dumps": [{"id": "20260101-0001", "state": "running", "reason": "initial_dump",
                   "progress": {"rows": 1_250_000, "estimate": 9_800_000,
                                "percent": 12.8, "table": "inventory.stock_movements",
                                "rows_per_second": 41_200.0}}]}
    return {"event_loop": "uvloop", "buffers": {"orders": buffer, "inventory": failing}}


def consumer(client_id: str, **kw: Any) -> dict[str, Any]:
    return {"client_id": client_id, "buffer": "orders", "address": "10.20.30.40:51234",
            "filter": None, "sources": [], "streaming": True, "checkpoint_scn": SCN_MAX - 7,
            "window_offset": -1, "lag_scn": 7, "lag_ms": 312.0, "lag_seconds": 1.31,
            "events_per_second": 18_250.5, "bytes_per_second": 4_500_000.0,
            "events_total": 123_456_789, "bytes_total": 987_654_321_000,
            "first_seen": NOW - 86_400, "last_seen": NOW - 0.2, "idle_s": 0.2, **kw}


CONSUMERS = {"consumers": [
    consumer("billing-indexer@app-7f9c.eu-west-1.prod.example.com"),
    consumer("search-sync@worker-3", streaming=False, idle_s=STALE_AFTER_S * 5,
             checkpoint_scn=SCN_MIN + 5, lag_scn=SCN_MAX - SCN_MIN - 5,
             lag_seconds=8_123.4),
], "tracked": 2, "max_tracked": 1000, "expiry_s": 300.0, "evicted_total": 0}

BOOT_STATUS = {
    "event_loop": "asyncio", "storage": "postgresql://boot@db-boot-01.prod.example.com/boot",
    "producer_scn": SCN_MAX, "applied_scn": SCN_MAX - 1_000_000, "applier_lag_scn": 1_000_000,
    "applier_lag_seconds": 42.5, "producer_lag_seconds": 0.5, "log_floor_scn": SCN_MIN,
    "log_windows": 12_000_000, "log_bytes": 88_000_000_000,
    "snapshot_rows": {"shop.orders": 41_000_000}, "update_ratio": 0.12,
    "components": {"producer": {"state": "running", "errors": 0, "last_error": None},
                   "applier": {"state": "failed", "errors": 3,
                               "last_error": "could not extend file: No space left"}}}

REPL_STATUS = {"replication": "orders-to-warehouse", "state": "applying",
               "target": "postgresql://wh@warehouse/dw", "applied_scn": SCN_MAX - 40,
               "relay_max_scn": SCN_MAX, "lag_scn": 40, "lag_ms": 900.0,
               "lag_seconds": 0.9, "batches": 1_234_567, "errors": 0, "last_error": None,
               "tables": {"shop.orders": {}}}


def document() -> dict[str, Any]:
    return sv.build_document(
        [sv.relay_entry(RELAY, sv.Answer(relay_status()), sv.Answer(CONSUMERS), NOW)],
        [sv.bootstrap_entry(BOOT, sv.Answer(BOOT_STATUS))], NOW,
        [replicator_entry(REPL, sv.Answer(REPL_STATUS))])


def rendered(doc: dict[str, Any], width: int) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(sv.render(doc))
    return console.export_text()


# Values that must appear whole, each on one line, at every width.
WHOLE = [f"{SCN_MIN:,}..{SCN_MAX:,}", f"{SCN_MAX - 7:,}", f"{SCN_MIN + 5:,}",
         f"{SCN_MAX - 1_000_000:,}", f"{SCN_MAX:,}", f"{SCN_MAX - 40:,}",
         "0.8 s", "1.3 s", "8,123 s", "42.5 s", "0.9 s", "unknown"]
HOSTS = ["relay-01.eu-west-1.prod.example.com:11190",
         "bootstrap-01.eu-west-1.prod.example.com:11191",
         "replicator-01.eu-west-1.prod.example.com:9464"]


@pytest.mark.parametrize("width", [60, 80, 120])
def test_nothing_essential_is_cut_at_any_width(width: int) -> None:
    text = rendered(document(), width)
    lines = text.splitlines()
    assert max(cell_len(line) for line in lines) <= width
    assert "\u2026" not in text and "..." not in text.replace(f"{SCN_MIN:,}..", "")
    for value in WHOLE:
        assert value in text, (width, value)
    # The password never shows; the stale consumer is marked in words.
    assert "pa55" not in text
    assert "search-sync@worker-3 (stale)" in text.replace("\n", " ") or \
        "(stale)" in text
    # What is wrong and how to fix it is there, in a column (wrapped) or under the
    # table: every word of it.
    for words in ("could not extend file: No space left",
                  "(2013, 'Lost connection to MySQL server during query ([Errno 104] "
                  "Connection reset by peer)')",
                  "fix the cause in the message, then restart the bootstrap service"):
        for word in words.split():
            assert word in text, (width, word)
    if width >= 80:
        for host in HOSTS:  # host:port, whole
            assert host in text, (width, host)
        assert "https://" not in text.split("\n", 2)[2]  # the URLs are shortened


def test_at_80_columns_the_least_needed_columns_are_hidden_and_named() -> None:
    text = rendered(document(), 80)
    flat = " ".join(text.split())
    assert re.search(r"Consumers( of \S+)? \(\d column\(s\) hidden at this width: "
                     r"[^)]*lag SCN", flat)
    assert "--wide shows them" in flat
    # The essential columns stay: SCN and lag of every consumer.
    consumers = text[text.index("Consumers"):text.index("Dumps")]
    for header in ("client id", "SCN", "lag"):
        assert header in consumers


def test_wide_shows_everything_unabridged() -> None:
    text = rendered(document(), 10_000)
    assert "hidden" not in text and "below the table" not in text
    assert RELAY.replace("ops:pa55@", "ops:***@") in text and BOOT in text and REPL in text
    for header in ("lag SCN", "events/s", "last seen", "mode", "snapshot rows", "fix",
                   "message", "last error", "components", "batches"):
        assert header in text, header
    assert "5 min ago" in text  # the stale consumer's last seen


def test_stale_consumers_are_marked_only_when_polling_and_not_seen() -> None:
    rows = {r[1]: r for r in sv.consumer_rows(document())}
    assert "billing-indexer@app-7f9c.eu-west-1.prod.example.com" in rows  # streaming: fine
    stale = rows["search-sync@worker-3 (stale)"]
    assert stale[1].style == stale[7].style == "yellow"  # type: ignore[attr-defined]
    assert stale[7] == "5 min ago"


def test_a_service_gone_in_watch_keeps_its_last_answer_marked_stale() -> None:
    last: dict[Any, Any] = {}
    first = document()
    keep_last_answers(first, last, now=NOW)
    assert "stale" not in first["relays"][0]
    gone = sv.build_document(
        [sv.relay_entry(RELAY, sv.Answer(error="no answer to /v1/status within 5 s"),
                        sv.Answer(), NOW + 12)],
        [sv.bootstrap_entry(BOOT, sv.Answer(BOOT_STATUS))], NOW + 12)
    assert sv.exit_status(gone) == 1
    keep_last_answers(gone, last, now=NOW + 12)
    assert sv.exit_status(gone) == 1  # still down: the old rows change no verdict
    relay = gone["relays"][0]
    assert relay["stale"] == {"age_s": 12.0, "error": "no answer to /v1/status within 5 s"}
    text = rendered(gone, 10_000)
    assert "1 service(s) down" in text and "DOWN" in text
    assert "no answer to /v1/status within 5 s; its rows below are its answer of 12 s " \
        "ago" in text
    assert f"{RELAY.replace('pa55', '***')} (answer 12 s old)" in text
    assert f"{SCN_MIN:,}..{SCN_MAX:,}" in text  # its buffers are still shown
    narrow = " ".join(rendered(gone, 80).split())
    assert "relay-01.eu-west-1.prod.example.com:11190 (answer 12 s old)" in narrow
    # It answers again: fresh rows, unmarked.
    again = document()
    keep_last_answers(again, last, now=NOW + 20)
    assert "stale" not in again["relays"][0] and "old)" not in rendered(again, 120)


def test_the_table_helper_for_other_status_tables() -> None:
    cols = [Col("url", "url"), Col("member", "text"), Col("SCN", "num"),
            Col("note", "text", 1, below=True), Col("extra", "num", 2)]
    rows = [("http://zk-01.example.com:2181/", "relay-a", "77,309,411,327",
             "leader since 3 h", "1")]
    assert short_url("http://u:***@h:1/") == "h:1" and short_url("http://h:1/r") == "h:1/r"
    assert short_url("not a url") == "not a url"
    natural = fit_table("t", cols, rows, None)
    assert [c.header for c in natural.columns] == [c.header for c in cols]
    narrow = Console(record=True, width=36, color_system=None)
    narrow.print(FitTable("Members", cols, rows))
    text = narrow.export_text()
    assert "77,309,411,327" in text and "zk-01.example.com:2181" in text
    assert "leader since 3 h" in text and "below the table" in text
    with pytest.raises(ValueError):
        FitTable("bad", cols, [("one cell",)])
    # Cells that are not text: None is "-", numbers their text.
    assert FitTable("t", cols, [("http://h:1", None, 12, "x", 1.5)]).rows == \
        [("http://h:1", "-", "12", "x", "1.5")]


def test_status_command_at_80_columns_and_wide(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    load = "synthetic://?rate=0&keys=1000&event_bytes=300&events_per_window=3&limit=40&seed=1"

    def run_cli(*argv: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main(["--log-level", "ERROR", *argv])
        return code, out.getvalue()

    async def main_() -> None:
        async with running_relay(relay_config(tmp_path, {"load": load})) as r:
            await r.wait_for_scn("load", 40)
            host = r.url.removeprefix("http://")
            monkeypatch.setenv("COLUMNS", "80")
            code, out = await asyncio.to_thread(run_cli, "status", "--relay", r.url)
            assert code == 0, out
            assert max(cell_len(line) for line in out.splitlines()) <= 80
            assert host in out and r.url not in out
            code, out = await asyncio.to_thread(run_cli, "status", "--relay", r.url,
                                                "--wide")
            assert code == 0 and r.url in out and "hidden" not in out
            code, out = await asyncio.to_thread(run_cli, "status", "--json", "--relay",
                                                r.url)
            assert json.loads(out)["relays"][0]["url"] == r.url  # the document: unchanged

    asyncio.run(main_())
