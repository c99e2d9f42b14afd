"""The replicator: keep tables in a target database equal to their source
(``docs/replicator.md``).

``databus replicate --config replicate.toml`` follows relays through the client library
and applies whole windows to a target (PostgreSQL, MariaDB/MySQL, SQLite) together with
the SCN they reach, in one target transaction: a restart resumes from the target's own
record, so the effect is exactly once.

Parts (one concern each):

- ``_model``: the table and column maps and the batches every part exchanges;
- ``_classify``: what a source column holds, from its Avro type and hint;
- ``_types``: the type mapping, source Avro type -> target column type and value;
- ``_normalize``: the canonical form that compares a source row with its replica;
- ``targets/``: one writer per target database (state table, staging + merge);

Public API: the type mapping (``column_type``, ``converter``, ``nullable``,
``unmappable``, ``UnmappableTypeError``, ``MYSQL_SESSION_SQL``) and ``normalize``, for
anyone who checks a replica against its source.
"""

from databus.replicator._classify import UnmappableTypeError
from databus.replicator._normalize import normalize
from databus.replicator._types import (
    MYSQL_SESSION_SQL,
    column_type,
    converter,
    nullable,
    unmappable,
)

__all__ = [
    "MYSQL_SESSION_SQL",
    "UnmappableTypeError",
    "column_type",
    "converter",
    "normalize",
    "nullable",
    "unmappable",
]
