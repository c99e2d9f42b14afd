"""The replicator: keep tables in a target database equal to their source (DESIGN
section 16, ``docs/replicator.md``).

``databus replicate --config replicate.toml`` follows relays through the client library
and applies whole windows to a target (PostgreSQL, MariaDB/MySQL, SQLite) together with
the SCN they reach, in one target transaction: a restart resumes from the target's own
record, so the effect is exactly once.

Parts (one concern each):

- ``_model``: the table and column maps and the batches every part exchanges;
- ``_types``: the type mapping, source Avro type -> target column type and value;
- ``targets/``: one writer per target database (state table, staging + merge);
"""
