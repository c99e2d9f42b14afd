"""The MySQL/MariaDB binlog fetcher (``mysql://`` and ``mariadb://`` sources).

``BinlogFetcher`` is the plugin (entry points ``mysql`` and ``mariadb`` in the
``databus.fetchers`` group). The mapping of column types to Avro, SCNs, resume, DDL,
keys, heartbeats and the server settings it needs are described in
``docs/binlog-fetcher.md``.
"""

from databus.fetchers.mysql._errors import ScnNotAvailableError, SourceMisconfiguredError
from databus.fetchers.mysql._fetcher import BinlogFetcher
from databus.fetchers.mysql._scn import binlog_file_number, make_scn, split_scn
from databus.fetchers.mysql._select import (
    DumpColumn,
    TableLayout,
    UnmappableTableError,
    dump_column,
    partition_column,
    select_sql,
    table_layout,
    with_precision,
)
from databus.fetchers.mysql._server import source_cursor
from databus.fetchers.mysql._uri import BinlogSourceConfig, TableSelector

__all__ = [
    "BinlogFetcher",
    "BinlogSourceConfig",
    "DumpColumn",
    "ScnNotAvailableError",
    "SourceMisconfiguredError",
    "TableLayout",
    "TableSelector",
    "UnmappableTableError",
    "binlog_file_number",
    "dump_column",
    "make_scn",
    "partition_column",
    "select_sql",
    "source_cursor",
    "split_scn",
    "table_layout",
    "with_precision",
]
