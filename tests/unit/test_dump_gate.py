"""A parallel dump gives way to the source's writers (relay/dumps/_readers.Gate): while
the log carries writes, one chunk at a time, each followed by a pause as long as it
took; on an idle source, or when the operator chose the parallelism, no gate at all."""

from __future__ import annotations

import threading
import time

from databus.relay.dumps._readers import Gate


def _turns(gate: Gate, readers: int, work_s: float) -> tuple[int, float]:
    """Most readers inside a turn at once, and the time all of them took."""
    inside = [0, 0]
    lock = threading.Lock()

    def reader() -> None:
        with gate.turn():
            with lock:
                inside[0] += 1
                inside[1] = max(inside[1], inside[0])
            time.sleep(work_s)
            with lock:
                inside[0] -= 1

    started = time.monotonic()
    threads = [threading.Thread(target=reader) for _ in range(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return inside[1], time.monotonic() - started


def _all_inside_at_once(gate: Gate, readers: int) -> bool:
    """Do ``readers`` threads all get inside a turn together? (Each waits inside for
    the others, however slowly the machine starts them; a gate that let one in at a
    time would break the barrier.)"""
    barrier = threading.Barrier(readers, timeout=10)
    broken = []

    def reader() -> None:
        with gate.turn():
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                broken.append(True)

    threads = [threading.Thread(target=reader) for _ in range(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return not broken


def test_an_idle_source_lets_every_reader_go() -> None:
    gate = Gate(True, lambda: 7, threading.Event())
    assert _all_inside_at_once(gate, 4) and gate.turns_given_way == 0


def test_writers_in_the_log_make_the_dump_give_way() -> None:
    events = [0]
    gate = Gate(True, lambda: events[0], threading.Event())
    events[0] = 5  # the log carried writes
    most, took = _turns(gate, 3, 0.05)
    assert most == 1 and gate.turns_given_way == 3
    assert took >= 3 * 2 * 0.05  # each turn paced by a pause as long as itself
    # A second without writes: every reader goes again.
    gate._busy_until = time.monotonic()
    assert _all_inside_at_once(gate, 3)


def test_an_operators_parallelism_is_never_gated() -> None:
    events = [0]
    gate = Gate(False, lambda: events[0], threading.Event())
    events[0] = 9
    assert _all_inside_at_once(gate, 3) and gate.turns_given_way == 0
