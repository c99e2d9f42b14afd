"""The MySQL/MariaDB binlog fetcher (``mysql://`` and ``mariadb://`` sources).

``BinlogFetcher`` is the plugin (entry points ``mysql`` and ``mariadb`` in the
``databus.fetchers`` group). The mapping of column types to Avro, SCNs, resume, DDL,
keys, heartbeats and the server settings it needs are described in
``docs/binlog-fetcher.md``.
"""

from databus.fetchers.mysql._avro_writers import encode_row, row_writers
from databus.fetchers.mysql._errors import ScnNotAvailableError, SourceMisconfiguredError
from databus.fetchers.mysql._fetcher import BinlogFetcher
from databus.fetchers.mysql._keys import EPOCH_ORDINAL, row_key_function
from databus.fetchers.mysql._schema import TableShape
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
from databus.fetchers.mysql._server import connect as connect_source
from databus.fetchers.mysql._server import current_position, source_cursor
from databus.fetchers.mysql._types import ColumnSpec, Kind
from databus.fetchers.mysql._uri import BinlogSourceConfig, TableSelector

__all__ = [
    "EPOCH_ORDINAL",
    "BinlogFetcher",
    "BinlogSourceConfig",
    "ColumnSpec",
    "DumpColumn",
    "Kind",
    "ScnNotAvailableError",
    "SourceMisconfiguredError",
    "TableLayout",
    "TableSelector",
    "TableShape",
    "UnmappableTableError",
    "binlog_file_number",
    "connect_source",
    "current_position",
    "dump_column",
    "encode_row",
    "make_scn",
    "partition_column",
    "row_key_function",
    "row_writers",
    "select_sql",
    "source_cursor",
    "split_scn",
    "table_layout",
    "with_precision",
]
