"""Source adapters (fetchers): binlog, PostgreSQL logical decoding, trigger/TxLog,
relay chaining and a synthetic load generator.

The plugin API for third-party fetchers is what this package
exports; a fetcher registers its class under the ``databus.fetchers`` entry point
group, named by its URI scheme. Everything else in the subpackages is private.
"""

from databus.fetchers._api import (
    ConfiguredSources,
    DumpChunk,
    DumpRow,
    DumpSource,
    Fetcher,
    FetcherContext,
    SourceCatalog,
    SourceFailure,
    WindowSink,
    fetcher_class,
)

__all__ = [
    "ConfiguredSources",
    "DumpChunk",
    "DumpRow",
    "DumpSource",
    "Fetcher",
    "FetcherContext",
    "SourceCatalog",
    "SourceFailure",
    "WindowSink",
    "fetcher_class",
]
