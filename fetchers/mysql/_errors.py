"""Errors of the binlog fetcher: both are ``SourceError`` and not retriable."""

from __future__ import annotations

from databus.errors import SourceError, SourceGapError

__all__ = ["ScnNotAvailableError", "SourceMisconfiguredError"]


class SourceMisconfiguredError(SourceError):
    """The server cannot be captured as configured (binlog format, row image, row
    metadata, privileges, credentials): an operator must change something first."""

    code = "source_misconfigured"
    retriable = False


class ScnNotAvailableError(SourceGapError):
    """The binlog that holds the SCN to resume after is gone (purged) or never existed
    here: the relay cannot continue without a gap. Seed the buffer at the server's
    current position, or let consumers bootstrap."""

    code = "scn_not_available"
    retriable = False
