"""A dump's progress and table states as ``/v1/dumps`` reports them (relay/dumps/_state.py,
issue 27 item 8): percent and ETA over every table from the start, rate over the saved
running time, table states after a cancel or a failure, and ``dumps.json`` files written
before these fields existed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from databus.relay.dumps._state import Dump, KeyRange, TableProgress, load_dumps, save_dumps


def _dump(*estimates: int) -> Dump:
    tables = [TableProgress(f"db.t{i}", estimate=e, estimated=True)
              for i, e in enumerate(estimates)]
    return Dump(id="d", buffer="b", tables=tables, chunk_rows=10, delay_ms=0, state="running")


def test_percent_covers_every_table_and_never_goes_back() -> None:
    dump = _dump(100, 50, 50)
    assert dump.progress()["percent"] == 0.0  # before the first row
    seen = []
    first, second, third = dump.tables
    for table, rows in ((first, 40), (first, 90), (second, 30), (third, 60)):
        if table.state == "pending":
            table.state = "running"
        table.rows = rows
        seen.append(dump.progress(now_running=1.0)["percent"])
        if table is first and rows == 90:
            first.state = "done"  # fewer rows than its estimate: the estimate shrinks
            seen.append(dump.progress(now_running=1.0)["percent"])
    assert seen == [20.0, 45.0, 47.4, 63.2, 90.0]  # the third table over its estimate
    assert seen == sorted(seen)


def test_eta_is_over_the_whole_dump() -> None:
    dump = _dump(1000, 1000)
    dump.tables[0].state = "running"
    dump.tables[0].rows = 500
    progress = dump.progress(now_running=1.0)
    assert progress["rows_per_second"] == 500.0
    assert progress["eta_seconds"] == 3.0  # 1,500 rows to go, the second table included


def test_rate_is_rows_over_the_saved_running_time() -> None:
    dump = _dump(1000)
    dump.tables[0].rows = 600
    dump.run_seconds = 10.0  # saved before a restart
    assert dump.progress(now_running=2.0)["rows_per_second"] == 50.0


def test_cancel_and_failure_settle_every_table() -> None:
    dump = _dump(10, 10, 10)
    done, running, _pending = dump.tables
    done.state, done.started, done.ended = "done", True, True
    running.state, running.started = "running", True
    dump.settle_tables("cancelled")
    assert [t.state for t in dump.tables] == ["done", "cancelled", "cancelled"]
    assert [t.owes_end for t in dump.tables] == [False, True, False]
    assert dump.owes_ends
    failed = _dump(10, 10)
    failed.tables[0].state = "running"
    failed.settle_tables("failed", "the source is gone")
    assert [(t.state, t.error) for t in failed.tables] == [
        ("failed", "the source is gone"), ("failed", "the source is gone")]


def test_a_state_file_from_before_is_read(tmp_path: Path) -> None:
    path = tmp_path / "dumps.json"
    old_table = {"source": "db.t", "state": "running", "cursor": [5], "key_index": 0,
                 "chunks": 1, "rows": 5, "overtaken": 0, "estimate": 10, "started": True,
                 "last_scn": 7, "error": None}
    old_dump = {"id": "d", "buffer": "b", "tables": [old_table], "chunk_rows": 5,
                "delay_ms": 0, "keys": None, "reason": "request", "state": "running",
                "created_at": 1.0, "started_at": 1.0, "finished_at": None, "error": None,
                "run_seconds": 2.0}
    path.write_text(json.dumps({"format": 1, "dumps": [old_dump]}))
    (dump,) = load_dumps(path)
    table = dump.tables[0]
    assert (table.estimated, table.ended) == (False, False)
    assert dump.progress()["percent"] == 50.0  # a running table has its estimate
    save_dumps(path, [dump])
    assert load_dumps(path)[0].tables[0].estimate == 10


@pytest.mark.parametrize(("value", "ok"), [(1, True), (64, True), (0, False), (65, False),
                                           (True, False), ("2", False), (2.0, False)])
def test_parallelism_in_a_dump_request(value: object, ok: bool) -> None:
    from databus._http import BadRequest
    from databus.relay._dump_api import parse_dump_request

    body = {"sources": ["db.t"], "parallelism": value}
    if ok:
        assert parse_dump_request(body).parallelism == value
    else:
        with pytest.raises(BadRequest, match="parallelism"):
            parse_dump_request(body)


def test_parallelism_defaults_to_the_cores_giving_way_to_writers(tmp_path: Path) -> None:
    import os

    from databus.relay._dump_api import parse_dump_request
    from databus.relay.dumps import DumpManager

    manager = DumpManager(tmp_path / "dumps.json")
    by_default = manager.start_dump(parse_dump_request({"sources": ["db.t"]}),
                                    buffer_of=lambda _: "b")
    assert by_default.parallelism == max(1, min(64, os.cpu_count() or 1))
    assert by_default.gives_way and by_default.to_json()["gives_way"] is True
    chosen = manager.start_dump(parse_dump_request({"sources": ["db.u"], "parallelism": 3}),
                                buffer_of=lambda _: "b")
    assert (chosen.parallelism, chosen.gives_way) == (3, False)
    manager.close()


def test_a_state_file_without_ranges_resumes_its_one_cursor(tmp_path: Path) -> None:
    """A dumps.json written before key ranges existed: its table's cursor is kept, and
    the dump (no parallelism recorded) reads with one reader."""
    path = tmp_path / "dumps.json"
    path.write_text(json.dumps({"format": 1, "dumps": [{
        "id": "abc", "buffer": "b", "chunk_rows": 10, "delay_ms": 0, "state": "running",
        "tables": [{"source": "db.t", "state": "running", "cursor": [41], "chunks": 4,
                    "rows": 40}]}]}))
    (dump,) = load_dumps(path)
    assert dump.parallelism == 1
    (table,) = dump.tables
    assert table.cursor == [41] and table.ranges is None
    table.ranges = [KeyRange(cursor=[41]), KeyRange(lo=[50], hi=None)]
    save_dumps(path, [dump])
    (again,) = load_dumps(path)
    assert again.tables[0].ranges == [KeyRange(cursor=[41]), KeyRange(lo=[50])]
    assert again.tables[0].ranges[0].after == [41] and again.tables[0].ranges[1].after == [50]
