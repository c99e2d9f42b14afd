"""What a consumer app writes: a ``Consumer`` subclass and its callbacks' results.

The callbacks are the paper's (section 3.6) in snake_case. Every one has a default
that returns SUCCESS, so a consumer overrides only what it needs. A callback may
return None (taken as SUCCESS) or a ``CallbackResult``; raising an exception, or
running past the client's per-callback time budget, counts as ``ERROR``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from databus.client._events import DataEvent, Window
    from databus.schemas import Schema


class CallbackResult(IntEnum):
    """Ordered by severity: when several consumers answer, the worst one wins."""

    SUCCESS = 0
    # Persist a checkpoint at the end of this window even if the policy would not.
    CHECKPOINT = 1
    # Do not persist a checkpoint at the end of this window.
    SKIP_CHECKPOINT = 2
    # Recoverable: roll back to the last checkpoint and replay from there.
    ERROR = 3
    # Stop the client; ``on_error`` is called.
    ERROR_FATAL = 4


class Consumer:
    """Base class of consumers; override the callbacks you need.

    Two styles (docs/client.md, "Batch API"): the paper's callbacks, one call per window
    boundary, source run and event; or the batch callbacks ``on_window`` (one call per
    whole window) and ``on_events`` (one call per batch of whole windows, with their
    events in one list). A consumer that overrides a batch callback gets its data through
    it only: ``on_start_data_event_sequence``, ``on_start_source``, ``on_data_event``,
    ``on_end_source``, ``on_end_data_event_sequence`` and ``on_dump_start`` /
    ``on_dump_end`` are not called for it (dump markers are in ``Window.markers``);
    ``on_checkpoint``, ``on_rollback``, ``on_error`` and the bootstrap and partition
    callbacks are, as for any consumer.
    """

    def on_window(self, window: Window) -> CallbackResult | None:
        """Batch API: one whole window, its events in ``window.events``. The answer is
        the window's, as ``on_end_data_event_sequence``'s is: ERROR rolls back to the
        last committed window and replays from there."""
        return CallbackResult.SUCCESS

    def on_events(self, events: list[DataEvent]) -> CallbackResult | None:
        """Batch API: the events of one or more whole windows (all the windows of a
        relay response the client has received), in commit order, in one call. The
        answer is every one of those windows': ERROR replays them all from the last
        committed window; SUCCESS commits them (one checkpoint, after the last)."""
        return CallbackResult.SUCCESS

    def on_start_data_event_sequence(self, scn: int) -> CallbackResult | None:
        """A window (one source transaction) with SCN ``scn`` begins."""
        return CallbackResult.SUCCESS

    def on_start_source(self, source: str, schema: Schema | None) -> CallbackResult | None:
        """A run of events of logical source ``source`` begins."""
        return CallbackResult.SUCCESS

    def on_data_event(self, event: DataEvent) -> CallbackResult | None:
        """One row change."""
        return CallbackResult.SUCCESS

    def on_end_source(self, source: str) -> CallbackResult | None:
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult | None:
        """The window ends: every event of the transaction has been delivered."""
        return CallbackResult.SUCCESS

    def on_checkpoint(self, scn: int) -> CallbackResult | None:
        """The client is about to persist a checkpoint at ``scn``; SKIP_CHECKPOINT vetoes."""
        return CallbackResult.SUCCESS

    def on_rollback(self, scn: int) -> CallbackResult | None:
        """Events after the checkpoint ``scn`` will be delivered again (undo partial work)."""
        return CallbackResult.SUCCESS

    def on_error(self, error: BaseException) -> CallbackResult | None:
        """The client stops because of ``error`` (fatal, or the retry budget is spent)."""
        return CallbackResult.SUCCESS

    def on_dump_start(self, source: str) -> CallbackResult | None:
        """A dump of ``source`` begins (docs/dumps.md): its rows follow, with
        ``event.from_dump`` true, interleaved with the table's changes. May come again
        after a rollback or a restart (at-least-once, like every callback)."""
        return None

    def on_dump_end(self, source: str, outcome: str = "done") -> CallbackResult | None:
        """The dump of ``source`` ended. ``outcome`` ``"done"``: it is complete, and with
        the changes before and after it the consumer has every row of the table;
        ``"failed"`` or ``"cancelled"``: it stopped part-way, the rows it delivered are
        true but the table may lack others until a new dump completes. An override
        that takes ``source`` alone (written before outcomes) is called as before."""
        return None

    def on_start_bootstrap(self) -> CallbackResult | None:
        """Bootstrap events (``event.from_bootstrap``) follow until ``on_end_bootstrap``."""
        return CallbackResult.SUCCESS

    def on_end_bootstrap(self) -> CallbackResult | None:
        return CallbackResult.SUCCESS

    def on_partitions_assigned(self, partitions: tuple[int, ...]) -> None:
        """Consumer groups (``DatabusClient(group=...)``): this member now runs these
        partitions; their events come from their own checkpoints on. Called before
        the first window that holds any of them."""

    def on_partitions_revoked(self, partitions: tuple[int, ...]) -> None:
        """Consumer groups: this member no longer runs these partitions. Every window
        of theirs it was given has finished (and committed) or was rolled back
        (``on_rollback``) before this call; another member starts them after it."""
