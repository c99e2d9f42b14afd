"""The replicator's pure parts: folding windows into batches, DDL plans, table maps."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from databus.checkpoint import Checkpoint
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


# -- fold before decode (issue 30): values of superseded events are never read -------


class LazyEvent:
    """A data event whose value counts its reads (the client decodes on first access)."""

    reads = 0

    def __init__(self, source: str, key: Any, value: dict[str, Any] | None, scn: int,
                 delete: bool = False) -> None:
        self.source, self.key, self._value, self.scn = source, key, value, scn
        self.is_delete = delete

    @property
    def value(self) -> dict[str, Any] | None:
        LazyEvent.reads += 1
        return self._value


def window(f: Folder, scn: int, *events: LazyEvent) -> None:
    f.start_window()
    for e in events:
        f.add(e)
    f.end_window(scn)


def test_only_the_latest_event_of_a_key_is_decoded_and_converted() -> None:
    converted: list[Any] = []

    def conv(v: Any) -> Any:
        converted.append(v)
        return v

    f = Folder({"shop.orders": TableFold(ORDERS, [conv, conv, conv])})
    LazyEvent.reads = 0
    for scn in range(1, 101):  # key 1 updated 100 times, key 2 once, in 100 windows
        window(f, scn, LazyEvent("shop.orders", 1, {"id": 1, "amount": scn}, scn),
               *([LazyEvent("shop.orders", 2, {"id": 2, "note": "x"}, scn)]
                 if scn == 50 else []))
    assert LazyEvent.reads == 0 and sorted(converted) == [1] * 100 + [2]  # keys only
    assert f.pending_rows == 2
    converted.clear()
    batch = f.take()
    assert LazyEvent.reads == 2 and f.decoded == 2
    assert sorted([c for c in converted if c is not None], key=str) == [1, 100, 2, "x"]
    changes = batch.changes["shop.orders"]
    assert changes[(1,)].row == (1, 100, None) and changes[(1,)].scn == 100
    assert changes[(2,)].row == (2, None, "x")
    assert (batch.scn, batch.windows, batch.events, batch.rows) == (100, 100, 101, 2)


def test_a_superseded_row_the_target_cannot_hold_does_not_stop_the_batch() -> None:
    def refuse_nul(v: Any) -> Any:
        if isinstance(v, str) and "\x00" in v:
            raise ValueError("NUL")
        return v

    f = Folder({"shop.orders": TableFold(ORDERS, [lambda v: v, lambda v: v, refuse_nul])})
    window(f, 1, LazyEvent("shop.orders", 1, {"id": 1, "note": "a\x00"}, 1))
    window(f, 2, LazyEvent("shop.orders", 1, {"id": 1, "note": "b"}, 2))
    assert f.take().changes["shop.orders"][(1,)].row == (1, None, "b")
    # The survivor itself is still refused, naming its key and SCN.
    window(f, 3, LazyEvent("shop.orders", 1, {"id": 1, "note": "c\x00"}, 3))
    with pytest.raises(UnusableEventError, match=r"key 1 \(SCN 3\).*NUL"):
        f.materialize()


def test_rollback_deletes_and_keys_folded_on_event_keys() -> None:
    two = table([("a", "INT", False), ("b", "INT", False), ("v", "TEXT", True)],
                key=("a", "b"))
    f = Folder({"shop.orders": fold(two)})
    window(f, 1, LazyEvent("shop.orders", (1, 2), {"a": 1, "b": 2, "v": "x"}, 1),
           LazyEvent("shop.orders", (3, 4), {"a": 3, "b": 4, "v": "y"}, 1))
    f.start_window()
    f.add(LazyEvent("shop.orders", (1, 2), {"a": 1, "b": 2, "v": "rolled back"}, 2))
    f.rollback()
    # A delete without its old row (key from the event), one with it (key from the row).
    window(f, 3, LazyEvent("shop.orders", (3, 4), None, 3, delete=True),
           LazyEvent("shop.orders", (5, 6), {"a": 5, "b": 6}, 3, delete=True),
           LazyEvent("other.table", 9, {"id": 9}, 3))
    batch = f.take()
    changes = batch.changes["shop.orders"]
    assert changes[(1, 2)].row == (1, 2, "x")
    assert changes[(3, 4)].row is None and changes[(5, 6)].row is None
    assert (batch.scn, batch.windows, batch.events, f.skipped) == (3, 2, 4, 1)


def old_way(t: TableMap, events: list[LazyEvent]) -> dict[tuple[Any, ...], Any]:
    """What the fold gave before issue 30: every event converted, folded on its row."""
    tf = fold(t)
    out: dict[tuple[Any, ...], Any] = {}
    for e in events:
        c = tf.change(delete=e.is_delete, key=e.key, value=e._value, scn=e.scn)
        out[c.key] = (c.row, c.scn)
    return out


def test_event_keys_that_are_not_the_row_keys_fold_the_old_way() -> None:
    # The table's key (email) is not the source's (id, in the event key): the same
    # event key stands for two target keys; every event must count, as before.
    by_email = table([("id", "BIGINT", False), ("email", "TEXT", False)], key=("email",))
    events = [LazyEvent("shop.orders", 1, {"id": 1, "email": "a"}, 1),
              LazyEvent("shop.orders", 1, {"id": 1, "email": "b"}, 2),
              LazyEvent("shop.orders", 2, {"id": 2, "email": "a"}, 3)]
    f = Folder({"shop.orders": fold(by_email)})
    window(f, 1, events[0])
    window(f, 2, events[1], events[2])
    got = {k: (c.row, c.scn) for k, c in f.take().changes["shop.orders"].items()}
    assert got == old_way(by_email, events)
    assert got == {("a",): ((2, "a"), 3), ("b",): ((1, "b"), 2)}
    assert not f.folds["shop.orders"].by_event_key  # and so for the rest of the run
    window(f, 4, LazyEvent("shop.orders", 1, {"id": 1, "email": "c"}, 4))
    assert list(f.take().changes["shop.orders"]) == [("c",)]


def test_an_event_key_the_key_converter_refuses_folds_the_old_way_mid_window() -> None:
    def strict_int(v: Any) -> Any:
        if not isinstance(v, int):
            raise TypeError("not an int")
        return v

    tf = TableFold(ORDERS, [strict_int, lambda v: v, lambda v: v])
    f = Folder({"shop.orders": tf})
    events = [LazyEvent("shop.orders", 1, {"id": 1, "note": "a"}, 1),
              LazyEvent("shop.orders", 2, {"id": 2, "note": "b"}, 2),
              LazyEvent("shop.orders", "odd", {"id": 2, "note": "c"}, 2),
              LazyEvent("shop.orders", 1, {"id": 1, "note": "d"}, 2)]
    window(f, 1, events[0])
    window(f, 2, *events[1:])
    got = {k: c.row for k, c in f.take().changes["shop.orders"].items()}
    assert got == {(1,): (1, None, "d"), (2,): (2, None, "c")}
    assert not tf.by_event_key


# -- the consumer's straight copies (issue 30) ------------------------------------------


class StraightTarget:
    """A target that records what each batch may copy straight, and whose table holds
    a key (refusing the straight copy, as PostgreSQL's primary key does) from ``held``."""

    def __init__(self, empty: bool = True) -> None:
        self.empty = empty
        self.asked = 0
        self.applied: list[tuple[int, set[str]]] = []
        self.held: set[Any] = set()

    def accepts_straight_copy(self, t: TableMap) -> bool:
        self.asked += 1
        return self.empty

    def apply(self, replication: str, tables: Any, batch: Any) -> None:
        for source in list(batch.straight):
            if any(k in self.held for k in batch.changes.get(source, {})):
                batch.straight.discard(source)  # rolled back, merged
        self.applied.append((batch.scn, set(batch.straight)))
        for changes in batch.changes.values():
            self.held.update(changes)


def consumer(target: StraightTarget) -> Any:
    from databus.config import ReplicateConfig, ReplicatedTableConfig
    from databus.replicator._replicator import ApplyConsumer, TargetPosition

    config = ReplicateConfig(name="r", target="sqlite:///x.db", relays=("http://x:1",),
                             tables=(ReplicatedTableConfig(source="shop.orders"),),
                             batch_rows=2)
    return ApplyConsumer(config, target, {"shop.orders": ORDERS},  # type: ignore[arg-type]
                         TargetPosition(lambda: None), lambda s, schema: None,
                         lambda t: fold(t))


def feed(c: Any, scn: int, *keys: int) -> None:
    c.on_start_data_event_sequence(scn)
    for k in keys:
        c.on_data_event(LazyEvent("shop.orders", k, {"id": k}, scn))
    c.on_end_data_event_sequence(scn)


def test_a_dump_into_an_empty_table_is_copied_straight_until_a_key_is_met() -> None:
    target = StraightTarget()
    c = consumer(target)
    feed(c, 1, 1, 2)  # before the dump: merged
    c.on_dump_start("shop.orders")
    c.on_dump_start("other.table")  # not replicated: nothing
    feed(c, 2, 3, 4)
    feed(c, 3, 5, 6)
    feed(c, 4, 1, 7)  # key 1 is in the table: that batch merges, and the rest of the copy
    feed(c, 5, 8, 9)
    c.on_start_data_event_sequence(6)
    c.on_data_event(LazyEvent("shop.orders", 10, {"id": 10}, 6))
    c.on_dump_end("shop.orders")
    c.on_end_data_event_sequence(6)
    c.on_dump_start("shop.orders")  # a new dump asks again (and the table is not empty)
    target.empty = False
    feed(c, 7, 11, 12)
    # (windows 6 and 7 are one batch: one row each, batch_rows 2)
    assert target.applied == [(1, set()), (2, {"shop.orders"}), (3, {"shop.orders"}),
                              (4, set()), (5, set()), (7, set())]
    assert target.asked == 2


def test_the_dump_end_lets_its_last_batch_go_straight_then_merges() -> None:
    target = StraightTarget()
    c = consumer(target)
    c.on_dump_start("shop.orders")
    c.on_start_data_event_sequence(1)
    c.on_data_event(LazyEvent("shop.orders", 1, {"id": 1}, 1))
    c.on_dump_end("shop.orders")
    c.on_end_data_event_sequence(1)  # one row: not due yet
    feed(c, 2, 2)  # the batch holding the dump's end: straight
    feed(c, 3, 3, 4)  # after it: merged
    assert target.applied == [(2, {"shop.orders"}), (3, set())]


def test_a_bootstrap_from_nothing_copies_straight_a_resumed_one_merges() -> None:
    target = StraightTarget()
    c = consumer(target)
    c.position.loaded = None
    c.on_start_bootstrap()
    feed(c, 1, 1, 2)
    c.on_end_bootstrap()
    feed(c, 2, 3, 4)
    resumed = consumer(StraightTarget())
    resumed.position.loaded = Checkpoint(5)
    resumed.on_start_bootstrap()
    feed(resumed, 6, 1, 2)
    assert target.applied == [(1, {"shop.orders"}), (2, set())]
    assert resumed.target.applied == [(6, set())]
