"""The MySQL/MariaDB binlog fetcher (``mysql://`` and ``mariadb://`` sources).

``BinlogFetcher`` is the plugin (entry points ``mysql`` and ``mariadb`` in the
``databus.fetchers`` group). The mapping of column types to Avro, SCNs, resume, DDL,
keys, heartbeats and the server settings it needs are described in
``docs/binlog-fetcher.md``.
"""

from databus.fetchers.mysql._errors import ScnNotAvailableError, SourceMisconfiguredError
from databus.fetchers.mysql._fetcher import BinlogFetcher
from databus.fetchers.mysql._scn import binlog_file_number, make_scn, split_scn
from databus.fetchers.mysql._uri import BinlogSourceConfig, TableSelector

__all__ = [
    "BinlogFetcher",
    "BinlogSourceConfig",
    "ScnNotAvailableError",
    "SourceMisconfiguredError",
    "TableSelector",
    "binlog_file_number",
    "make_scn",
    "split_scn",
]
