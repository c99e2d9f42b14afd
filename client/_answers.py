"""The one check every reader of relay answers runs (pure, no I/O).

A relay answer is a body of whole events and the checkpoint after it (a polling
response's ``X-Databus-Checkpoint``, or a streaming write and the CHECKPOINT event that
follows it). Whoever reads relay answers (``DatabusClient``, the chained relay's
``relay+http://`` fetcher, the bootstrap producer, and through the client the replicator
and ``databus tail``) gets them from ``RelayPuller``, which runs this check on each one
before handing it out. An answer that fails it is refused whole and asked for again
(``EventFormatError``, retriable: the puller fails over), never stored or delivered in
part, so a relay that serves windows out of order or lies in its checkpoint can cause a
retry but never a gap or a repeat::

    asked for                  the body must                    the checkpoint after it
    --------------------------  -------------------------------  ---------------------------
    after window S (S >= 0)     begin after S                    (see "ends" below)
    inside window W, k events   go on with W (its next event)
    flexible / latest           (no lower bound)

    every window                have an SCN above the previous window's, be ended by an
                                EOW of its own SCN (the torn-window check is each reader's:
                                it knows the window carried over from earlier bodies)
    ends with the EOW of X      -                                after X: (X, -1)
    ends inside window Y        -                                (Y, n): n = Y's data events
                                                                 so far (k + those in the
                                                                 body when Y = W)
    is empty                    -                                the one asked for (a
                                                                 "latest" one: any whole-
                                                                 window online checkpoint)

    at most ``max_bytes`` (a poll); a streaming write may pass its limit by its last event
    only (a single event larger than the limit travels alone, as the relay sends it).

The cost is one pass over the body's EOWs in Python (the scan and the window framing are
the compiled event core's); the scan is handed on with the batch, so the reader does not
scan the body again.
"""

from __future__ import annotations

from databus.batch import Scan, eow_order, frame_windows, scan
from databus.checkpoint import FLEXIBLE_SCN, LATEST_SCN, WHOLE_WINDOW, Checkpoint, Mode
from databus.errors import EventFormatError
from databus.event import EOW_SOURCE_ID

__all__ = ["check_relay_answer", "refused"]

OUT_OF_ORDER = "out of order"
BAD_CHECKPOINT = "bad checkpoint"
OVERSIZE = "oversize answer"


def refused(message: str, reason: str) -> EventFormatError:
    """An answer refused whole: retriable (asked again, maybe of another relay)."""
    error = EventFormatError(message, reason=reason)
    error.retriable = True
    return error


def check_relay_answer(position: Checkpoint, body: bytes, checkpoint: Checkpoint, *,
                       relay: str, limit: int | None = None,
                       found: Scan | None = None) -> Scan | None:
    """Check one answer to a read at ``position`` (module docstring); return the body's
    scan (None for an empty body) or raise ``EventFormatError`` (retriable).

    ``limit`` is what was asked for (``max_bytes``): the body's events before its last
    one must fit in it. ``found`` is the body's scan when the caller has one."""
    if not body:
        _check_empty(position, checkpoint, relay)
        return None
    s = found if found is not None else scan(body)
    if s.error is not None:
        error = s.error
        error.retriable = True
        raise error
    n = s.count
    if limit is not None and len(body) > limit and s.offset[n - 1] >= limit:
        raise refused(f"relay {relay} sent {len(body)} bytes in answer to max_bytes={limit}",
                      OVERSIZE)
    scns, sids = s.scn, s.source_id
    first = scns[0]
    if position.mode is Mode.ONLINE and position.window_scn >= 0:
        inside = position.window_offset >= 0
        if inside and first != position.window_scn:
            raise refused(f"relay {relay} answered a read inside window "
                          f"{position.window_scn} with window {first}", OUT_OF_ORDER)
        if not inside and first <= position.window_scn:
            raise refused(f"relay {relay} answered a read after window "
                          f"{position.window_scn} with window {first}, which is not after "
                          "it", OUT_OF_ORDER)
    frames = frame_windows(s)
    if frames.broken >= 0:
        # A torn window: every reader refuses it with its own rule (it knows the window
        # carried over from earlier bodies, and asks for that window again from its
        # start when the earlier part may be the bad one).
        return s
    eows = frames.eows
    bad, previous, start = eow_order(s, eows)  # one C pass over the EOWs
    if bad >= 0:
        scn = scns[eows[bad]]
        if previous is not None and scn <= previous:
            raise refused(f"relay {relay} served window {scn} after window {previous}: its "
                          "SCNs go back", OUT_OF_ORDER)
        raise refused(f"relay {relay} ended window {scns[start]} with the EOW of window "
                      f"{scn}", OUT_OF_ORDER)
    if sids[n - 1] == EOW_SOURCE_ID:
        expected = Checkpoint(scns[n - 1], WHOLE_WINDOW)
    else:
        tail = scns[n - 1]
        if previous is not None and scns[start] <= previous:
            raise refused(f"relay {relay} served window {scns[start]} after window "
                          f"{previous}: its SCNs go back", OUT_OF_ORDER)
        base = 0
        if not len(eows) and position.window_offset >= 0 and position.window_scn == tail:
            base = position.window_offset
        expected = Checkpoint(tail, base + frames.count)
    if checkpoint != expected:
        raise refused(f"relay {relay} sent checkpoint {checkpoint.dumps()} with a body that "
                      f"ends at {expected.dumps()}: it does not stand where the body ends",
                      BAD_CHECKPOINT)
    return s


def _check_empty(position: Checkpoint, checkpoint: Checkpoint, relay: str) -> None:
    if checkpoint == position:
        return
    # "latest" comes back as the concrete point it stood for; "flexible" as where the
    # buffer's history starts when it holds nothing yet.
    open_ended = (position.mode is Mode.ONLINE
                  and position.window_scn in (LATEST_SCN, FLEXIBLE_SCN))
    if (open_ended and checkpoint.mode is Mode.ONLINE
            and checkpoint.window_offset == WHOLE_WINDOW
            and checkpoint.window_scn >= FLEXIBLE_SCN):
        return
    raise refused(f"relay {relay} sent checkpoint {checkpoint.dumps()} with an empty body "
                  f"for a read at {position.dumps()}: an empty answer moves nothing",
                  BAD_CHECKPOINT)
