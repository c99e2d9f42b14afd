"""Trigger/TxLog fetchers (paper section 4.1): SQLite (the embedded default), PostgreSQL
and Oracle (generated and tested as text only).

``databus txlog install --source URI --tables ...`` adds a TxLog table, a
``databus_txn`` column, a delete log and triggers to a database; the fetchers then pull
committed transactions in commit order, one window per source transaction, with the
current state of every row they touched. ``docs/txlog-fetcher.md`` explains the scheme
of each dialect and why it never misses a transaction.

Public API:

- ``SqliteTxlogFetcher`` (``sqlite://``), ``PostgresTxlogFetcher``
  (``postgresql+txlog://``), ``OracleTxlogFetcher`` (``oracle+txlog://``): the fetcher
  plugins (entry points ``databus.fetchers``);
- ``seal_sqlite_transaction(conn)``: what a SQLite writer runs just before COMMIT to get
  exactly one window per transaction (``SQLITE_SEAL_SQL`` is the statement); without
  it the transactions committed between two polls of the fetcher share one window.
"""

from __future__ import annotations

import sqlite3

from databus.fetchers.txlog._dialects import SqliteDialect
from databus.fetchers.txlog._fetcher import (
    OracleTxlogFetcher,
    PostgresTxlogFetcher,
    SqliteTxlogFetcher,
    TxlogFetcher,
)

__all__ = [
    "SQLITE_SEAL_SQL",
    "OracleTxlogFetcher",
    "PostgresTxlogFetcher",
    "SqliteTxlogFetcher",
    "TxlogFetcher",
    "seal_sqlite_transaction",
]

SQLITE_SEAL_SQL = SqliteDialect.SEAL_SQL


def seal_sqlite_transaction(conn: sqlite3.Connection) -> None:
    """Close the current transaction's TxLog entry; call it right before COMMIT.

    A transaction that sealed itself is delivered as a window of its own. It is safe
    to call when the transaction captured nothing (it then seals nothing, or the entry
    of earlier unsealed transactions, which were committed before this one).
    """
    conn.execute(SQLITE_SEAL_SQL)
