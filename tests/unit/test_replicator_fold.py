"""The replicator's pure parts: folding windows into batches, DDL plans, table maps."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from databus.config import ReplicatedTableConfig
from databus.replicator._ddl import plan_ddl, widens
from databus.replicator._fold import Folder, TableFold, UnusableEventError
from databus.replicator._model import ColumnMap, TableMap


def table(columns: list[tuple[str, str, bool]], key: tuple[str, ...] = ("id",),
          fp: int = 1) -> TableMap:
    return TableMap("shop.orders", None, "orders", key,
                    tuple(ColumnMap(n, n, "long", t, nullable) for n, t, nullable in columns),
                    fp)


ORDERS = table([("id", "BIGINT", False), ("amount", "NUMERIC(10,2)", True),
                ("note", "TEXT", True)])


def fold(t: TableMap = ORDERS) -> TableFold:
    return TableFold(t, [lambda v: v] * len(t.columns))


def test_latest_change_per_key_over_whole_windows() -> None:
    f = Folder({"shop.orders": fold()})
    f.start_window()
    f.event("shop.orders", delete=False, key=1, value={"id": 1, "amount": Decimal("1.50")},
            scn=10)
    f.event("shop.orders", delete=False, key=2, value={"id": 2, "note": "x"}, scn=10)
    f.end_window(10)
    f.start_window()
    f.event("shop.orders", delete=False, key=1, value={"id": 1, "amount": Decimal("2")},
            scn=11)
    f.event("shop.orders", delete=True, key=2, value=None, scn=11)
    f.event("other.table", delete=False, key=5, value={"id": 5}, scn=11)
    f.end_window(11)
    batch = f.take()
    changes = batch.changes["shop.orders"]
    assert changes[(1,)].row == (1, Decimal("2"), None) and changes[(1,)].scn == 11
    assert changes[(2,)].row is None
    assert (batch.scn, batch.windows, batch.events, batch.rows) == (11, 2, 4, 2)
    assert f.skipped == 1 and f.take().windows == 0


def test_a_rollback_drops_only_the_window_in_progress() -> None:
    f = Folder({"shop.orders": fold()})
    f.start_window()
    f.event("shop.orders", delete=False, key=1, value={"id": 1}, scn=10)
    f.end_window(10)
    f.start_window()
    f.event("shop.orders", delete=False, key=3, value={"id": 3}, scn=11)
    f.rollback()
    batch = f.take()
    assert list(batch.changes["shop.orders"]) == [(1,)] and batch.scn == 10


def test_deletes_take_their_key_from_the_row_or_the_event_key() -> None:
    two = table([("a", "INT", False), ("b", "INT", False), ("v", "TEXT", True)],
                key=("a", "b"))
    tf = fold(two)
    assert tf.change(delete=True, key=(1, 2), value=None, scn=5).key == (1, 2)
    assert tf.change(delete=True, key="ignored", value={"a": 7, "b": 8, "v": "x"},
                     scn=5).key == (7, 8)
    with pytest.raises(UnusableEventError, match="key columns a, b"):
        tf.change(delete=True, key=3, value=None, scn=5)
    with pytest.raises(UnusableEventError, match="without a row"):
        tf.change(delete=False, key=3, value=None, scn=5)


def test_a_value_the_converter_refuses_names_the_key_and_scn() -> None:
    def refuse(v: Any) -> Any:
        raise ValueError("too long")

    tf = TableFold(ORDERS, [lambda v: v, refuse, lambda v: v])
    with pytest.raises(UnusableEventError, match=r"key 9 \(SCN 42\).*too long"):
        tf.change(delete=False, key=9, value={"id": 9, "amount": 1}, scn=42)


def test_ddl_plans() -> None:
    new = table([("id", "BIGINT", False), ("amount", "NUMERIC(12,2)", True),
                 ("added", "INT", True)], fp=2)
    plan = plan_ddl(ORDERS, new)
    assert [c.target for c in plan.added] == ["added"]
    assert plan.dropped == ["note"] and [c.target for c in plan.widened] == ["amount"]
    assert not plan.incompatible
    # A column gone and a new one of its type in its place: renamed, or dropped and
    # added; either guess may lose values, so neither is applied.
    renamed = table([("id", "BIGINT", False), ("amount", "NUMERIC(10,2)", True),
                     ("memo", "TEXT", True)], fp=6)
    plan = plan_ddl(ORDERS, renamed, table="public.orders")
    assert [str(p) for p in plan.incompatible] == [
        "column note is gone and memo (TEXT) is new in its place (renamed, or dropped and "
        "added)"]
    assert "RENAME COLUMN note TO memo" in plan.incompatible[0].fix
    assert not plan.added and not plan.dropped
    narrowed = table([("id", "BIGINT", False), ("amount", "NUMERIC(8,2)", True)], fp=3)
    assert "amount changed" in str(plan_ddl(ORDERS, narrowed).incompatible[0])
    rekeyed = table([("id", "BIGINT", False), ("amount", "NUMERIC(10,2)", False)],
                    key=("amount",), fp=4)
    assert any("key changed" in str(r) for r in plan_ddl(ORDERS, rekeyed).incompatible)
    not_null = table([*((c.target, c.target_type, c.nullable) for c in ORDERS.columns),
                      ("must", "TEXT", False)], fp=5)
    assert [str(p) for p in plan_ddl(ORDERS, not_null).incompatible] == [
        "new column must is NOT NULL"]
    assert widens("INT", "BIGINT") and not widens("BIGINT", "INT")
    assert widens("VARCHAR(10)", "VARCHAR(20)") and not widens("VARCHAR(20)", "TEXT")
    assert widens("DECIMAL(10,2)", "DECIMAL(12,3)") and not widens("DECIMAL(10,2)",
                                                                   "DECIMAL(10,3)")


def test_table_config_checks() -> None:
    from databus.errors import ConfigError

    with pytest.raises(ConfigError):
        ReplicatedTableConfig(source="orders")
    with pytest.raises(ConfigError):
        ReplicatedTableConfig(source="shop.orders", include=("a",), exclude=("b",))
    with pytest.raises(ConfigError):
        ReplicatedTableConfig(source="shop.orders", key=("id",), exclude=("id",))
    with pytest.raises(ConfigError):
        ReplicatedTableConfig(source="shop.orders", rename={"a": "x", "b": "x"})


def test_the_example_config_loads() -> None:
    from pathlib import Path

    from databus.config import load_config

    example = Path(__file__).resolve().parents[2] / "deploy" / "replicate.toml"
    config = load_config(example, env={"PG_PASSWORD": "s3cret"}).replicate
    assert config is not None and config.name == "shop-to-warehouse"
    assert [t.source for t in config.tables] == ["shop.orders", "shop.order_items"]
    assert config.tables[1].rename == {"sku": "product_code"}
    assert "s3cret" not in repr(config)


def test_initial_copy_by_dump_needs_the_relay_admin_token(tmp_path: Path) -> None:
    from databus.config import load_config
    from databus.errors import ConfigError

    path = tmp_path / "replicate.toml"
    base = ('[replicate]\nname = "r"\nrelays = ["http://127.0.0.1:1"]\n'
            'target = "sqlite:///x.db"\n[[replicate.tables]]\nsource = "a.b"\n')
    path.write_text(base.replace('name = "r"\n', 'name = "r"\ninitial_copy = "dump"\n'))
    with pytest.raises(ConfigError, match="relay_admin_token"):
        load_config(path)
    path.write_text(base.replace('name = "r"\n', 'name = "r"\ninitial_copy = "dump"\n'
                                 'relay_admin_token = "${TOKEN}"\n'))
    config = load_config(path, env={"TOKEN": "t0ken-value"}).replicate
    assert config is not None and config.initial_copy == "dump"
    assert "t0ken-value" not in repr(config)
    path.write_text(base.replace('name = "r"\n', 'name = "r"\ninitial_copy = "copy"\n'))
    with pytest.raises(ConfigError, match="initial_copy"):
        load_config(path)


def test_relays_or_a_relay_cluster_not_both() -> None:
    from databus.config import ReplicateConfig, ReplicatedTableConfig
    from databus.errors import ConfigError

    tables = (ReplicatedTableConfig(source="a.b"),)
    ok = ReplicateConfig(name="r", target="sqlite:///x.db", tables=tables,
                         zookeeper="127.0.0.1:2181/databus", cluster="shop")
    assert ok.relays == ()
    with pytest.raises(ConfigError, match="not both"):
        ReplicateConfig(name="r", target="sqlite:///x.db", tables=tables,
                        relays=("http://127.0.0.1:1",), zookeeper="127.0.0.1:2181",
                        cluster="shop")
    with pytest.raises(ConfigError, match="needs both"):
        ReplicateConfig(name="r", target="sqlite:///x.db", tables=tables,
                        zookeeper="127.0.0.1:2181")
    with pytest.raises(ConfigError, match="at least one relay"):
        ReplicateConfig(name="r", target="sqlite:///x.db", tables=tables)
    with pytest.raises(ConfigError, match="host:port"):
        ReplicateConfig(name="r", target="sqlite:///x.db", tables=tables,
                        zookeeper="zk;2181", cluster="shop")
