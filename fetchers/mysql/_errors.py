"""Errors of the binlog fetcher: both are ``SourceError`` and not retriable."""

from __future__ import annotations

from databus.errors import SourceGapError, SourceMisconfiguredError

__all__ = ["ScnNotAvailableError", "SourceMisconfiguredError"]


class ScnNotAvailableError(SourceGapError):
    """The binlog that holds the SCN to resume after is gone (purged) or never existed
    here: the relay cannot continue without a gap. Seed the buffer at the server's
    current position, or let consumers bootstrap."""

    code = "scn_not_available"
    retriable = False
