"""``databus init mysql|postgres|sqlite --source URI [--dir DIR]``: a first day without
guessing.

It connects to the source as the relay will (the URI's user), checks it (settings,
grants, keys, the dump watermark table, PostgreSQL's publication and slot, SQLite's
trigger capture), prints the SQL an administrator must run as one block, and, once every
check passes, writes ``relay.toml``, ``bootstrap.toml`` and ``replicate.toml`` for that
source, with passwords replaced by ``${NAME}`` references to environment variables.

Layout: ``_model`` (findings and what an inspection returns), ``_mysql``,
``_postgres`` and ``_sqlite`` (one inspector per source kind, each reusing the checks
of the command that already makes them: ``databus pg setup``, ``databus dump setup``,
``databus txlog install``, the binlog fetcher's start-up check), ``_configs`` (the
three files, from the templates in ``databus.deploy``'s ``init/``) and ``_cli`` (the
command).
"""
