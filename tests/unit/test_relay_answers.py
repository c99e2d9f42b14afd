"""The one check of relay answers (``databus.client._answers``, issue 27 items 1, 2, 14):
windows that go back, checkpoints that do not stand where the body ends, bodies larger
than asked for, and the streaming framer's bound on what it holds."""

from __future__ import annotations

import pytest

from databus.checkpoint import Checkpoint, Mode
from databus.client._answers import (
    BAD_CHECKPOINT,
    OUT_OF_ORDER,
    OVERSIZE,
    check_relay_answer,
)
from databus.client._answers import refused as refused_error
from databus.client._failover import describe_failure
from databus.client._relay_stream import StreamFramer
from databus.errors import EventFormatError
from databus.event import (
    CHECKPOINT_SOURCE_ID,
    Op,
    encode_control,
    encode_dump_marker,
    encode_eow,
    encode_event,
)
from tests.event_forging import fix_windows

pytestmark = pytest.mark.twin("databus.batch")


def data(scn: int, i: int = 0, size: int = 10) -> bytes:
    return encode_event(scn=scn, source_id=1, op=Op.UPSERT, key=i, value=b"v" * size)


def window(scn: int, n: int = 2, size: int = 10) -> bytes:
    events = [data(scn, i, size) for i in range(n)]
    return b"".join(fix_windows([*events, encode_eow(scn=scn, event_count=0, checksum=0)]))


def check(position: Checkpoint, body: bytes, checkpoint: Checkpoint,
          limit: int | None = None) -> None:
    check_relay_answer(position, body, checkpoint, relay="http://r", limit=limit)


def refused(position: Checkpoint, body: bytes, checkpoint: Checkpoint, reason: str,
            limit: int | None = None) -> EventFormatError:
    with pytest.raises(EventFormatError) as info:
        check(position, body, checkpoint, limit)
    assert info.value.retriable, "a refused answer is asked for again"
    assert info.value.reason == reason
    return info.value


def test_windows_in_order_with_the_checkpoint_after_the_last_pass() -> None:
    body = window(11) + window(12) + window(15)
    assert check_relay_answer(Checkpoint(10), body, Checkpoint(15), relay="r") is not None
    check(Checkpoint.flexible(), body, Checkpoint(15))
    check(Checkpoint.latest(), body, Checkpoint(15))


def test_swapped_windows_are_refused_whole() -> None:
    # Item 1: the downstream stored 12, then skipped 11 as "served again": a gap.
    error = refused(Checkpoint(10), window(12) + window(11) + window(13), Checkpoint(13),
                    OUT_OF_ORDER)
    assert "window 11 after window 12" in str(error)
    refused(Checkpoint(10), window(11) + window(11), Checkpoint(11), OUT_OF_ORDER)


def test_a_body_that_begins_at_or_before_the_position_is_refused() -> None:
    refused(Checkpoint(12), window(12) + window(13), Checkpoint(13), OUT_OF_ORDER)
    refused(Checkpoint(12), window(9), Checkpoint(9), OUT_OF_ORDER)


def test_a_window_opened_after_the_last_eow_must_go_forward() -> None:
    body = window(11) + data(10, 5)
    refused(Checkpoint(10), body, Checkpoint(10, 1), OUT_OF_ORDER)


def test_a_read_inside_a_window_goes_on_with_that_window() -> None:
    rest = b"".join(fix_windows([data(12, 3), encode_eow(scn=12, event_count=0,
                                                         checksum=0)]))
    check(Checkpoint(12, 3), rest, Checkpoint(12))
    refused(Checkpoint(12, 3), window(13), Checkpoint(13), OUT_OF_ORDER)
    # Partial again: the offset counts on from the position's.
    check(Checkpoint(12, 3), data(12, 3) + data(12, 4), Checkpoint(12, 5))
    refused(Checkpoint(12, 3), data(12, 3) + data(12, 4), Checkpoint(12, 2), BAD_CHECKPOINT)


def test_a_checkpoint_ahead_of_the_body_is_refused() -> None:
    # Item 2: a header 1,000 SCNs past the body's last window skipped 1,000 windows.
    body = window(11) + window(12)
    error = refused(Checkpoint(10), body, Checkpoint(1012), BAD_CHECKPOINT)
    assert "does not stand where the body ends" in str(error)
    for wrong in (Checkpoint(11), Checkpoint(12, 0), Checkpoint(13, 1),
                  Checkpoint(12, mode=Mode.BOOTSTRAP_CATCHUP, bootstrap_start_scn=1,
                             bootstrap_source_index=0, bootstrap_target_scn=20)):
        refused(Checkpoint(10), body, wrong, BAD_CHECKPOINT)


def test_a_body_that_ends_inside_a_window_needs_that_window_and_its_count() -> None:
    body = window(11) + data(12, 0) + data(12, 1)
    check(Checkpoint(10), body, Checkpoint(12, 2))
    for wrong in (Checkpoint(12), Checkpoint(12, 1), Checkpoint(12, 3), Checkpoint(11)):
        refused(Checkpoint(10), body, wrong, BAD_CHECKPOINT)


def test_dump_markers_do_not_count_in_the_offset() -> None:
    marker = encode_dump_marker(scn=12, source="db.t", dump_id="d1", kind="start")
    check(Checkpoint(10), window(11) + marker + data(12, 0), Checkpoint(12, 1))


def test_an_empty_answer_moves_nothing() -> None:
    check(Checkpoint(10), b"", Checkpoint(10))
    check(Checkpoint(12, 3), b"", Checkpoint(12, 3))
    for moved in (Checkpoint(1010), Checkpoint(9), Checkpoint(10, 0)):
        refused(Checkpoint(10), b"", moved, BAD_CHECKPOINT)
    # "latest" and "flexible" come back as the concrete point they stood for.
    check(Checkpoint.latest(), b"", Checkpoint(40))
    check(Checkpoint.flexible(), b"", Checkpoint.flexible())
    refused(Checkpoint.latest(), b"", Checkpoint(40, 2), BAD_CHECKPOINT)


def test_a_damaged_body_is_refused_as_retriable() -> None:
    body = bytearray(window(11))
    body[-3] ^= 0xFF
    with pytest.raises(EventFormatError) as info:
        check(Checkpoint(10), bytes(body), Checkpoint(11))
    assert info.value.retriable


def test_a_torn_window_is_left_to_the_reader_that_knows_the_carried_window() -> None:
    # The client asks for such a window again from its start (MISSING_EOW).
    found = check_relay_answer(Checkpoint(10), data(11) + data(12)
                               + encode_eow(scn=12, event_count=2, checksum=0),
                               Checkpoint(12), relay="r")
    assert found is not None


def test_a_poll_body_larger_than_max_bytes_is_refused() -> None:
    body = window(11) + window(12)
    check(Checkpoint(10), body, Checkpoint(12), limit=len(body))
    refused(Checkpoint(10), body, Checkpoint(12), OVERSIZE, limit=len(window(11)))
    # One event larger than the request travels alone (what a streaming relay writes
    # for it; a poll asks again with max_bytes of its size), its EOW in the next answer.
    big = data(11, size=5000)
    check(Checkpoint(10), big, Checkpoint(11, 1), limit=1000)
    refused(Checkpoint(10), window(11, n=1, size=5000), Checkpoint(11), OVERSIZE, limit=1000)


def checkpoint_event(cp: Checkpoint) -> bytes:
    return encode_control(scn=cp.window_scn, source_id=CHECKPOINT_SOURCE_ID,
                          payload=cp.dumps().encode())


def test_the_framer_refuses_a_write_past_its_limit_before_holding_it() -> None:
    # Item 14: 64 MiB to a reader that asked for 4 MiB raised its memory by 64 MiB.
    limit = 4096
    framer = StreamFramer(limit)
    one = window(11, n=1, size=100)
    sent = 0
    with pytest.raises(EventFormatError) as info:
        for k in range(1000):  # 1000 windows of ~200 bytes, with no checkpoint event
            piece = window(11 + k, n=1, size=100)
            framer.feed(piece)
            sent += len(piece)
    assert info.value.reason == OVERSIZE and info.value.retriable
    assert framer.pending_bytes <= limit + 2 * len(one)
    assert sent < 3 * limit


def test_the_framer_lets_a_write_end_with_one_event_over_its_limit() -> None:
    framer = StreamFramer(1000)
    big = data(11, size=5000)
    frames = framer.feed(big + checkpoint_event(Checkpoint(11, 1)))
    assert [f.kind for f in frames] == ["write"] and frames[0].body == big
    # A checkpoint event exactly at the limit is the end of a full write, not more.
    full = window(12, n=3, size=50)
    framer = StreamFramer(len(full))
    frames = framer.feed(full + checkpoint_event(Checkpoint(12)))
    assert frames[0].body == full


def test_the_framer_refuses_an_event_that_begins_past_the_limit_from_its_header() -> None:
    framer = StreamFramer(300)
    head = window(11, n=1, size=200)
    framer.feed(head)
    with pytest.raises(EventFormatError) as info:
        framer.feed(data(12, 0, size=1_000_000)[:200])  # only its start has arrived
    assert info.value.reason == OVERSIZE


def test_a_failover_log_line_says_what_failed() -> None:
    # Long polls that recovered logged "failed ()": aiohttp's timeouts carry no message.
    assert describe_failure(TimeoutError(), 30) == ("no answer within the request timeout "
                                                    "(30 s)")
    assert describe_failure(ConnectionResetError(), 30) == ("ConnectionResetError (no "
                                                            "message)")
    assert describe_failure(OSError("refused"), 30) == "OSError: refused"
    error = refused_error("window 3 after window 4", OUT_OF_ORDER)
    assert describe_failure(error, 30) == str(error)
