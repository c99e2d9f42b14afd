"""Errors of the TxLog fetchers and the ``databus txlog`` command.

All are ``DatabusError``s that cannot heal by retrying (``retriable=False``): the fetcher
host marks the fetcher ``failed`` with the message, instead of restarting it forever.
A source that is merely unreachable raises ``databus.errors.SourceError`` (retriable).
"""

from __future__ import annotations

from databus.errors import DatabusError


class TxlogNotInstalledError(DatabusError):
    """A configured table lacks its capture triggers (or the TxLog itself is missing)."""

    code = "txlog_not_installed"
    retriable = False


class TxlogPositionError(DatabusError):
    """The SCN to resume after is not in the TxLog any more (pruned) or not yet (ahead of
    the source: the TxLog was reinstalled, or this is another database)."""

    code = "txlog_position"
    retriable = False


class DriverMissingError(DatabusError):
    """The database driver a dialect needs is not installed (Oracle: ``oracledb``)."""

    code = "driver_missing"
    retriable = False
