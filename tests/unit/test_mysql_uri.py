"""Parsing the mysql:// source URI."""

from __future__ import annotations

import random

import pytest

from databus.errors import ConfigError
from databus.fetchers.mysql import BinlogSourceConfig


def test_full_uri() -> None:
    config = BinlogSourceConfig.from_uri(
        "mysql://repl:p%40ss@db.example:3307/?server_id=1001&tables=shop.orders,shop.items"
        "&heartbeat_ms=250&connect_timeout_s=3&read_timeout_s=9"
    )
    assert (config.host, config.port, config.user, config.password) == (
        "db.example", 3307, "repl", "p@ss")
    assert config.server_id == 1001
    assert config.heartbeat_s == 0.25
    assert (config.connect_timeout_s, config.read_timeout_s) == (3, 9)
    assert config.selector.matches("shop", "orders")
    assert config.selector.matches("shop", "items")
    assert not config.selector.matches("shop", "other")
    assert config.selector.schemas() == ["shop"]
    assert "p@ss" not in repr(config) and "p%40ss" not in config.redacted_uri
    kwargs = config.connect_kwargs()
    assert kwargs["password"] == "p@ss" and kwargs["port"] == 3307


def test_defaults_and_mariadb_scheme() -> None:
    config = BinlogSourceConfig.from_uri("mariadb://u@[::1]", rng=random.Random(1))
    assert (config.host, config.port, config.password) == ("::1", 3306, "")
    assert (1 << 31) <= config.server_id < (1 << 32) - 1
    assert config.selector.everything
    assert config.selector.matches("shop", "orders")
    assert not config.selector.matches("mysql", "user")
    assert config.selector.schemas() is None


def test_path_is_the_default_database() -> None:
    config = BinlogSourceConfig.from_uri("mysql://u:p@h/shop")
    assert config.selector.matches("shop", "anything")
    assert not config.selector.matches("other", "anything")
    config = BinlogSourceConfig.from_uri("mysql://u:p@h/shop?tables=orders,crm.*")
    assert config.selector.matches("shop", "orders")
    assert not config.selector.matches("shop", "items")
    assert config.selector.matches("crm", "x")
    assert config.selector.describe() == "crm.*, shop.orders"


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("postgres://u:p@h/", "not a mysql:// URI"),
        ("mysql://u:secret@/", "no host"),
        ("mysql://h:3306/", "no user"),
        ("mysql://u:secret@h:99999/", "malformed"),
        ("mysql://u:secret@h/?table=a.b", "did you mean 'tables'"),
        ("mysql://u:secret@h/?tables=a.b&tables=c.d", "given twice"),
        ("mysql://u:secret@h/?tables=orders", "needs a database"),
        ("mysql://u:secret@h/?tables=a.b,,c.d", "comma-separated"),
        ("mysql://u:secret@h/?server_id=0", "server_id must be in"),
        ("mysql://u:secret@h/?server_id=x", "must be an integer"),
        ("mysql://u:secret@h/?heartbeat_ms=5", "heartbeat_ms must be in"),
        ("mysql://u:secret@h/?heartbeat_ms=2000&read_timeout_s=3", "two heartbeats"),
        ("mysql://u:secret@h/#frag", "fragment"),
    ],
)
def test_bad_uris(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        BinlogSourceConfig.from_uri(uri)
    assert "secret" not in str(info.value)
