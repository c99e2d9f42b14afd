"""TxLog source URIs: parsing, defaults, logical source names and errors (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from databus.errors import ConfigError
from databus.fetchers._api import fetcher_class
from databus.fetchers.txlog import OracleTxlogFetcher, PostgresTxlogFetcher, SqliteTxlogFetcher
from databus.fetchers.txlog._model import TableRef
from databus.fetchers.txlog._uri import TableSpec, parse_source, parse_tables


def test_sqlite_uri() -> None:
    s = parse_source("sqlite:///data/shop.db?tables=orders,main.items&batch=50&poll_ms=250")
    assert s.dialect == "sqlite"
    assert s.path == Path("/data/shop.db")
    assert s.refs == (TableRef("main", "orders"), TableRef("main", "items"))
    assert (s.batch, s.poll_s, s.start, s.busy_timeout_s) == (50, 0.25, "earliest", 5.0)
    assert s.source_name(TableRef("main", "orders")) == "shop.orders"  # the file's stem
    named = parse_source("sqlite:///data/x-1.db?tables=t&database=shop&start=latest")
    assert named.source_name(TableRef("main", "t")) == "shop.t"
    assert named.start == "latest"
    spaced = parse_source("sqlite:///data/my%20shop.db?tables=t&database=shop")
    assert spaced.path == Path("/data/my shop.db")


def test_postgres_and_oracle_uris() -> None:
    s = parse_source("postgresql+txlog://repl:p%40ss@db.example:5433/shop?"
                     "tables=orders,sales.items&txlog_schema=databus&sslmode=require")
    assert (s.dialect, s.host, s.port, s.user, s.password, s.dbname) == (
        "postgresql", "db.example", 5433, "repl", "p@ss", "shop")
    assert s.refs == (TableRef("public", "orders"), TableRef("sales", "items"))
    assert s.source_name(TableRef("sales", "items")) == "sales.items"
    assert (s.txlog_schema, s.sslmode) == ("databus", "require")
    assert "p%40ss" not in s.redacted and "***" in s.redacted
    assert parse_source("postgres://u@h/db?tables=t").port == 5432
    o = parse_source("oracle+txlog://shop:pw@ora/ORCL?tables=ORDERS,HR.EMP(ID)")
    assert (o.dialect, o.port, o.txlog_schema) == ("oracle", 1521, "SHOP")
    assert o.tables == (TableSpec(TableRef("SHOP", "ORDERS")),
                        TableSpec(TableRef("HR", "EMP"), ("ID",)))


def test_tables_with_keys_and_commas() -> None:
    assert parse_tables("a(x, y), s.b ,c", "postgresql", "public") == (
        TableSpec(TableRef("public", "a"), ("x", "y")),
        TableSpec(TableRef("s", "b")),
        TableSpec(TableRef("public", "c")),
    )


@pytest.mark.parametrize(("uri", "message"), [
    ("sqlite:///d/shop.db", "tables= is required"),
    ("sqlite://relative.db?tables=t", "sqlite:/// followed by the absolute path"),
    ("sqlite:///d/shop.db?tables=other.t", "live in schema 'main'"),
    ("sqlite:///d/shop.db?tables=t,t", "listed twice"),
    ("sqlite:///d/shop.db?tables=t&bacth=3", "did you mean 'batch'"),
    ("sqlite:///d/shop.db?tables=t&batch=0", "batch must be in"),
    ("sqlite:///d/shop.db?tables=t&poll_ms=x", "poll_ms must be an integer"),
    ("sqlite:///d/shop.db?tables=t&start=now", "start must be"),
    ("sqlite:///d/sh.op.db?tables=t", "set database=NAME"),
    ("sqlite:///d/shop.db?tables=a(,b)", "empty key column"),
    ("sqlite:///d/shop.db?tables=a.b.c", "bad table"),
    ("postgresql+txlog://u@h?tables=t", "/DBNAME"),
    ("postgresql+txlog://h/db?tables=t", "no user"),
    ("postgresql+txlog://u:secret@h/db?tables=t&sslmode=x&foo=1", "unknown parameter 'foo'"),
    ("mysql://u@h/db?tables=t", "unknown scheme 'mysql'"),
])
def test_bad_uris(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_source(uri)
    assert "secret" not in str(info.value)


def test_fetcher_classes_by_scheme() -> None:
    assert fetcher_class("sqlite:///x.db?tables=t") is SqliteTxlogFetcher
    assert fetcher_class("postgresql+txlog://u@h/d?tables=t") is PostgresTxlogFetcher
    assert fetcher_class("oracle+txlog://u@h/s?tables=T") is OracleTxlogFetcher
    with pytest.raises(ConfigError, match="a sqlite URI was expected"):
        parse_source("postgresql://u@h/d?tables=t", expect="sqlite")
