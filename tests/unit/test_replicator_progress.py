"""The initial copy's progress (replicator/_progress.py): how a copy began, its lines,
when a printer writes them on a terminal and elsewhere, the stats that count the copy,
and the status and metrics that show it."""

from __future__ import annotations

import io
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from databus.checkpoint import Checkpoint, Mode
from databus.replicator._progress import (
    CopyView,
    ProgressPrinter,
    final_line,
    format_duration,
    progress_line,
    start_kind,
    status_fields,
)
from databus.replicator._status import ReplicationStats, metrics_page, status_document


def view(rows: dict[str, int], estimated: dict[str, int | None] | None = None, *,
         state: str = "running", elapsed: float = 10.0, start: str = "empty",
         copy: int = 1) -> CopyView:
    return CopyView(copy=copy, state=state, start=start, rows=rows,  # type: ignore[arg-type]
                    estimated=estimated or {}, elapsed_s=elapsed)


# -- how a copy began ----------------------------------------------------------------


def test_start_kind() -> None:
    assert start_kind(None) == "empty"
    assert start_kind(Checkpoint.flexible()) == "empty"
    assert start_kind(Checkpoint(1200)) == "delta"
    snapshot = Checkpoint(-1, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=10,
                          bootstrap_source_index=0)
    assert start_kind(snapshot) == "resumed"
    # A full copy's catch-up has a window SCN, but no SCN its delta started from.
    catchup = Checkpoint(15, mode=Mode.BOOTSTRAP_CATCHUP, bootstrap_start_scn=10,
                         bootstrap_target_scn=20, bootstrap_source_index=0)
    assert start_kind(catchup) == "resumed"
    delta = Checkpoint(900, mode=Mode.BOOTSTRAP_SNAPSHOT, bootstrap_start_scn=950,
                       bootstrap_source_index=0, bootstrap_since_scn=900)
    assert start_kind(delta) == "delta"


# -- the numbers and the lines ------------------------------------------------------------


def test_rate_eta_and_totals() -> None:
    v = view({"shop.orders": 1200, "shop.items": 300},
             {"shop.orders": 4000, "shop.items": 1000}, elapsed=10)
    assert v.total_rows == 1500 and v.total_estimated == 5000
    assert v.rows_per_second == 150
    assert v.eta_s == pytest.approx(3500 / 150)
    # One table without an estimate: no total, so no ETA.
    partial = view({"a.x": 10, "a.y": 10}, {"a.x": 100}, elapsed=1)
    assert partial.total_estimated is None and partial.eta_s is None
    assert partial.rows_per_second == 20
    # Past the estimate (rows added meanwhile): ETA 0, never negative.
    assert view({"a.x": 120}, {"a.x": 100}).eta_s == 0
    # Nothing copied yet: no rate, no ETA.
    assert view({"a.x": 0}, {"a.x": 100}, elapsed=0).eta_s is None
    # A finished copy has a rate, no ETA.
    done = view({"a.x": 100}, {"a.x": 100}, state="done", elapsed=4)
    assert done.rows_per_second == 25 and done.eta_s is None
    assert CopyView().rows_per_second is None and CopyView().total_estimated is None


def test_progress_line_with_estimates() -> None:
    v = view({"shop.orders": 1200}, {"shop.orders": 4000}, elapsed=2)
    assert progress_line(v) == ("initial copy: shop.orders 1,200 of ~4,000 rows (30%); "
                                "600 rows/s; 2 s elapsed, ETA 5 s")


def test_progress_line_of_several_tables_and_unknown_estimates() -> None:
    v = view({"shop.orders": 1200, "shop.items": 5}, {"shop.orders": 4000}, elapsed=65)
    assert progress_line(v) == ("initial copy: shop.orders 1,200 of ~4,000 rows (30%), "
                                "shop.items 5 rows; total 1,205 rows; 19 rows/s; "
                                "1m05s elapsed")
    both = view({"a.x": 1, "a.y": 1}, {"a.x": 4, "a.y": 4}, elapsed=1)
    assert "; total 2 of ~8 rows (25%);" in progress_line(both)
    assert "a.x 1 of ~4 rows (25%), a.y 1 of ~1 row (100%);" in progress_line(
        view({"a.x": 1, "a.y": 1}, {"a.x": 4, "a.y": 1}))


def test_percent_is_floored_and_capped() -> None:
    assert "(99%)" in progress_line(view({"a.x": 999}, {"a.x": 1000}))
    assert "(100%)" in progress_line(view({"a.x": 1500}, {"a.x": 1000}))
    assert "0 of ~0 rows (100%)" in progress_line(view({"a.x": 0}, {"a.x": 0}))


def test_labels_say_how_the_copy_began() -> None:
    assert progress_line(view({"a.x": 1}, start="resumed")).startswith(
        "initial copy (resumed): a.x 1 row;")
    assert progress_line(view({"a.x": 1}, start="delta")).startswith("bootstrap catch-up:")


def test_final_lines() -> None:
    done = view({"shop.orders": 4000, "shop.items": 1000},
                {"shop.orders": 4000, "shop.items": 1000}, state="done", elapsed=5)
    assert final_line(done) == ("initial copy done in 5 s: shop.orders 4,000 rows, "
                                "shop.items 1,000 rows; 1,000 rows/s")
    stopped = view({"shop.orders": 100}, {"shop.orders": 400}, elapsed=3725)
    assert final_line(stopped, stopped=True) == (
        "initial copy stopped after 1h02m: shop.orders 100 of ~400 rows (25%); 0 rows/s")


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 0.4, 59.4, 60, 3599, 3600, 86400 + 61)] == [
        "0 s", "0 s", "59 s", "1m00s", "59m59s", "1h00m", "24h01m"]
    assert format_duration(-3) == "0 s"


def test_status_fields() -> None:
    assert status_fields(CopyView()) == {
        "state": None, "start": None, "elapsed_s": None, "rows": 0, "estimated_rows": None,
        "rows_per_second": None, "eta_s": None, "tables": {}}
    fields = status_fields(view({"shop.orders": 1200}, {"shop.orders": 4000}, elapsed=2))
    assert fields == {
        "state": "running", "start": "empty", "elapsed_s": 2.0, "rows": 1200,
        "estimated_rows": 4000, "rows_per_second": 600.0, "eta_s": pytest.approx(4.7),
        "tables": {"shop.orders": {"rows": 1200, "estimated_rows": 4000}}}


# -- the printer ------------------------------------------------------------------------


def test_plain_printer_writes_a_line_at_most_every_interval_and_a_final_line() -> None:
    out = io.StringIO()
    p = ProgressPrinter(out.write, tty=False, interval_s=5)
    p.update(CopyView(), 0)  # no copy yet: nothing
    rows = {"a.x": 0}
    for t in range(0, 13):  # one reading a second
        rows = {"a.x": t * 10}
        p.update(view(rows, {"a.x": 200}, elapsed=t), 100 + t)
    p.update(view({"a.x": 200}, {"a.x": 200}, state="done", elapsed=14), 114)
    p.update(view({"a.x": 200}, {"a.x": 200}, state="done", elapsed=14), 115)
    p.finish(view({"a.x": 200}, {"a.x": 200}, state="done", elapsed=14))
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    # Seconds 5 and 10 of the copy, then the final line, once.
    assert lines == [
        "initial copy: a.x 50 of ~200 rows (25%); 10 rows/s; 5 s elapsed, ETA 15 s",
        "initial copy: a.x 100 of ~200 rows (50%); 10 rows/s; 10 s elapsed, ETA 10 s",
        "initial copy done in 14 s: a.x 200 rows; 14 rows/s",
    ]


def test_a_short_copy_writes_only_its_final_line_even_when_missed_running() -> None:
    out = io.StringIO()
    p = ProgressPrinter(out.write, tty=False, interval_s=5)
    p.update(view({"a.x": 3}, state="done", elapsed=0.5), 10)
    assert out.getvalue() == "initial copy done in 0 s: a.x 3 rows; 6 rows/s\n"


def test_a_second_copy_gets_its_own_lines() -> None:
    out = io.StringIO()
    p = ProgressPrinter(out.write, tty=False, interval_s=1)
    p.update(view({"a.x": 3}, state="done", elapsed=1), 10)
    p.update(view({"a.x": 0}, copy=2, start="delta", elapsed=0), 20)
    p.update(view({"a.x": 7}, copy=2, start="delta", elapsed=1), 21)
    p.update(view({"a.x": 9}, copy=2, start="delta", state="done", elapsed=2), 22)
    assert out.getvalue().splitlines() == [
        "initial copy done in 1 s: a.x 3 rows; 3 rows/s",
        "bootstrap catch-up: a.x 7 rows; 7 rows/s; 1 s elapsed",
        "bootstrap catch-up done in 2 s: a.x 9 rows; 4 rows/s",
    ]


def test_tty_printer_redraws_one_line() -> None:
    out = io.StringIO()
    p = ProgressPrinter(out.write, tty=True, width=200)
    p.update(view({"a.x": 1000}, {"a.x": 2000}, elapsed=1), 1)
    p.update(view({"a.x": 1500}, {"a.x": 2000}, elapsed=2), 1.5)
    p.update(view({"a.x": 2000}, {"a.x": 2000}, state="done", elapsed=2), 2)
    text = out.getvalue()
    first = "initial copy: a.x 1,000 of ~2,000 rows (50%); 1,000 rows/s; 1 s elapsed, ETA 1 s"
    second = "initial copy: a.x 1,500 of ~2,000 rows (75%); 750 rows/s; 2 s elapsed, ETA 1 s"
    final = "initial copy done in 2 s: a.x 2,000 rows; 1,000 rows/s"
    # A shorter line is padded over what is left of the longer one before it.
    pad1 = " " * (len(first) - len(second))
    pad2 = " " * (len(second) - len(final))
    assert pad1 and pad2
    assert text == f"\r{first}\r{second}{pad1}\r{final}{pad2}\n"
    # What a terminal shows: the last drawing of each line.
    assert [line.split("\r")[-1].rstrip() for line in text.split("\n")] == [final, ""]


def test_tty_line_is_cut_to_the_terminal_width_and_cleared_for_a_log_line() -> None:
    out = io.StringIO()
    p = ProgressPrinter(out.write, tty=True, width=20)
    p.update(view({"shop.orders": 5}), 1)
    assert out.getvalue() == "\r" + "initial copy: shop.orders 5 rows"[:19]
    p.clear()
    assert out.getvalue().endswith("\r" + " " * 19 + "\r")
    p.clear()  # nothing drawn: nothing written
    assert out.getvalue().count("\r") == 3


def test_finish_in_the_middle_of_a_copy() -> None:
    out = io.StringIO()
    p = ProgressPrinter(out.write, tty=True, width=200)
    running = view({"a.x": 10}, {"a.x": 40}, elapsed=2)
    p.update(running, 1)
    p.finish(running)
    first = "initial copy: a.x 10 of ~40 rows (25%); 5 rows/s; 2 s elapsed, ETA 6 s"
    stopped = "initial copy stopped after 2 s: a.x 10 of ~40 rows (25%); 5 rows/s"
    pad = " " * (len(first) - len(stopped))
    assert out.getvalue() == f"\r{first}\r{stopped}{pad}\n"
    p.finish(running)  # once
    assert out.getvalue().count("stopped") == 1
    plain = io.StringIO()
    ProgressPrinter(plain.write, tty=False).finish(None)
    assert plain.getvalue() == ""


# -- the stats that count a copy, and the status and metrics --------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_stats_count_the_rows_applied_during_a_copy() -> None:
    clock = Clock()
    stats = ReplicationStats("r", clock=clock)
    stats.applied({"shop.orders": 5}, 10)  # before any copy: not counted
    assert stats.copy_view() == CopyView()
    assert stats.copy_to_estimate() is None
    stats.copy_started(["shop.orders", "shop.items"], None)
    assert stats.copy_to_estimate() == 1
    assert stats.copy_to_estimate() is None  # asked once
    stats.set_copy_estimates(1, {"shop.orders": 100, "other.table": 7})
    clock.now += 2
    stats.applied({"shop.orders": 40}, 11)
    # The client bootstraps again after a rollback: the same copy goes on.
    stats.copy_started(["shop.orders", "shop.items"], Checkpoint(11))
    stats.applied({"shop.orders": 60, "shop.items": 3}, 12)
    v = stats.copy_view()
    assert v.copy == 1 and v.state == "running" and v.start == "empty"
    assert v.rows == {"shop.orders": 100, "shop.items": 3}
    assert v.estimated == {"shop.orders": 100, "shop.items": None}
    assert v.elapsed_s == 2
    stats.copy_done()
    clock.now += 50
    stats.applied({"shop.orders": 9}, 13)  # online again: not the copy's
    done = stats.copy_view()
    assert done.state == "done" and done.elapsed_s == 2 and done.rows == v.rows
    # A later fall off the relay: a delta, no estimate asked for.
    stats.copy_started(["shop.orders", "shop.items"], Checkpoint(13))
    assert stats.copy_to_estimate() is None
    stats.set_copy_estimates(1, {"shop.orders": 5})  # a late answer for copy 1: ignored
    again = stats.copy_view()
    assert again.copy == 2 and again.start == "delta"
    assert again.rows == {"shop.orders": 0, "shop.items": 0}
    assert again.estimated == {"shop.orders": None, "shop.items": None}


def test_a_failed_estimate_is_asked_again() -> None:
    stats = ReplicationStats("r", clock=Clock())
    stats.copy_started(["a.x"], None)
    assert stats.copy_to_estimate() == 1
    stats.copy_estimate_failed(1)
    assert stats.copy_to_estimate() == 1
    stats.copy_done()
    stats.copy_estimate_failed(1)
    assert stats.copy_to_estimate() is None  # the copy is over


def test_status_document_and_metrics_show_the_copy() -> None:
    clock = Clock()
    stats = ReplicationStats("shop-copy", clock=clock)

    def document() -> dict[str, Any]:
        return status_document(stats, relay_max_scn=20, lag_ms=0.0, target="sqlite:///x")

    def samples() -> dict[tuple[str, str | None], float]:
        page = metrics_page(document).decode()
        return {(s.name, s.labels.get("table")): s.value
                for f in text_string_to_metric_families(page) for s in f.samples}

    assert document()["initial_copy"] == status_fields(CopyView())
    assert samples()[("databus_replicator_initial_copy_running", None)] == 0
    assert ("databus_replicator_initial_copy_eta_seconds", None) not in samples()

    stats.copy_started(["shop.orders"], None)
    stats.set_copy_estimates(stats.copy_to_estimate() or 0, {"shop.orders": 400})
    clock.now += 4
    stats.applied({"shop.orders": 100}, 12)
    copy = document()["initial_copy"]
    assert copy == {"state": "running", "start": "empty", "elapsed_s": 4.0, "rows": 100,
                    "estimated_rows": 400, "rows_per_second": 25.0, "eta_s": 12.0,
                    "tables": {"shop.orders": {"rows": 100, "estimated_rows": 400}}}
    s = samples()
    assert s[("databus_replicator_initial_copy_running", None)] == 1
    assert s[("databus_replicator_initial_copy_rows", "shop.orders")] == 100
    assert s[("databus_replicator_initial_copy_estimated_rows", "shop.orders")] == 400
    assert s[("databus_replicator_initial_copy_eta_seconds", None)] == 12

    stats.applied({"shop.orders": 300}, 14)
    stats.copy_done()
    copy = document()["initial_copy"]
    assert copy["state"] == "done" and copy["rows"] == 400 and copy["eta_s"] is None
    assert samples()[("databus_replicator_initial_copy_running", None)] == 0
