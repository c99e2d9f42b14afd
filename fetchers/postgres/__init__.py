"""The PostgreSQL logical decoding fetcher (``postgresql://``, docs/postgres-logical.md):
changes read from a replication slot with the built-in ``pgoutput`` plugin, no triggers.

- ``_uri``: the source URI;
- ``_pgoutput``: the pure decoder of pgoutput messages;
- ``_types``: PostgreSQL types to Avro, and which converter each column takes;
- ``_text_values``: the converters: each type's text output -> Python values;
- ``_setup``: ``databus pg setup|teardown``, the planner (pure: facts -> checks, SQL);
- ``_setup_run``: its I/O shell (read the catalog, run the plan);
- ``_changes``: decoded messages -> windows (the protocol steps);
- ``_transcode``: the fast path of a plain insert or update, pgoutput bytes -> key and
  Avro body, in two twins (``_transcode_native`` compiled, ``_transcode_python``);
- ``_fetcher``: the I/O shell (replication connection, confirmed LSN, heartbeats);
- ``_dump``: the ``DumpSource`` (chunks in key order, watermarks);
- ``_cli``: ``databus pg``.
"""

from databus.fetchers.postgres._fetcher import LogicalFetcher
from databus.fetchers.postgres._uri import LogicalSource, TableName, parse_logical_source

__all__ = ["LogicalFetcher", "LogicalSource", "TableName", "parse_logical_source"]
