"""``databus dump setup|start|status|pause|resume|cancel`` against a real relay reading a
real SQLite TxLog source: what it prints, its exit status, and every error a user can
provoke (no token, a wrong one, an unknown source or id, bad JSON, a relay that is not
there) as one clear line without a traceback or the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.cli import main
from tests.relay_harness import ADMIN_TOKEN, RunningRelay, free_port, relay_config, running_relay
from tests.unit.test_txlog_support import BUFFER, SqliteSource

TABLES = "items,tags"
ROWS = 300


def _source(tmp_path: Path) -> SqliteSource:
    db = SqliteSource(tmp_path / "shop.db",
                      "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
                      "CREATE TABLE tags (word TEXT PRIMARY KEY, n INTEGER)")
    db.run("BEGIN")
    db.conn.executemany("INSERT INTO items VALUES (?, ?)", [(i, f"n{i}") for i in range(ROWS)])
    db.conn.executemany("INSERT INTO tags VALUES (?, ?)", [(f"w{i}", i) for i in range(50)])
    db.run("COMMIT")
    db.install(TABLES)
    return db


@contextlib.contextmanager
def _captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def run_cli(*argv: str) -> tuple[int, str, str]:
    with _captured() as (out, err):
        code = main(["--log-level", "ERROR", *argv])
    return code, out.getvalue(), err.getvalue()


async def arun(*argv: str) -> tuple[int, str, str]:
    # The CLI blocks on HTTP; the in-process relay needs this loop meanwhile. stdout is
    # swapped process-wide, so commands run one at a time.
    return await asyncio.to_thread(run_cli, *argv)


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABUS_ADMIN_TOKEN", ADMIN_TOKEN)


def test_setup_dry_run_check_and_setup(tmp_path: Path) -> None:
    db = _source(tmp_path)
    uri = db.uri(TABLES)
    code, out, err = run_cli("dump", "setup", "--source", uri, "--check")
    assert code == 1 and "databus dump setup" in err and "Traceback" not in err
    code, out, _ = run_cli("dump", "setup", "--source", uri, "--dry-run")
    assert code == 0 and "CREATE TABLE IF NOT EXISTS" in out and "databus_watermark" in out
    tables = {r[0] for r in db.conn.execute("SELECT name FROM sqlite_master")}
    assert "databus_watermark" not in tables
    code, out, err = run_cli("dump", "setup", "--source", uri)
    assert code == 0, err
    assert "ready" in err
    code, out, err = run_cli("dump", "setup", "--source", uri)  # idempotent
    assert code == 0, err
    code, out, err = run_cli("dump", "setup", "--source", uri, "--check")
    assert (code, out.startswith("ok")) == (0, True), err


def test_setup_of_a_source_that_cannot_be_dumped(tmp_path: Path) -> None:
    code, _, err = run_cli("dump", "setup", "--source", "synthetic://?rate=1")
    assert code == 1 and "cannot be dumped" in err
    code, _, err = run_cli("dump", "setup", "--source", "nosuch://x")
    assert code == 1 and "no fetcher for scheme" in err


def _dump_rows(doc: dict[str, Any]) -> int:
    return int(doc["progress"]["rows"])


def test_start_wait_status_and_control(tmp_path: Path) -> None:
    db = _source(tmp_path)
    assert run_cli("dump", "setup", "--source", db.uri(TABLES))[0] == 0

    async def scenario() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: db.uri(TABLES)})) as r:
            code, out, err = await arun("dump", "start", "--relay", r.url, "--chunk-rows",
                                        "40", "--wait")
            assert code == 0, err
            assert "dump " in out and "done" in out
            assert err.strip()  # progress lines (stderr is not a terminal here)
            ident = out.split()[1]
            doc = r.relay.dumps.get(ident)
            assert doc["state"] == "done" and _dump_rows(doc) == ROWS + 50

            code, out, _ = await arun("dump", "status", "--relay", r.url, "--json")
            assert code == 0 and [d["id"] for d in json.loads(out)["dumps"]] == [ident]
            code, out, _ = await arun("dump", "status", "--relay", r.url, ident)
            assert code == 0 and "shop.items" in out and "shop.tags" in out
            code, out, _ = await arun("dump", "status", "--relay", r.url, "--sources",
                                      "shop.nothing", "--json")
            assert code == 0 and json.loads(out) == {"dumps": []}

            # pause / resume / cancel pick the only active dump, or the one of --sources.
            code, _, err = await arun("dump", "pause", "--relay", r.url)
            assert code == 1 and "no active dump" in err
            code, out, err = await arun("dump", "start", "--relay", r.url, "--sources",
                                        "shop.items", "--chunk-rows", "10", "--delay-ms",
                                        "300")
            assert code == 0, err
            second = out.split()[1]
            code, out, err = await arun("dump", "pause", "--relay", r.url, "--sources",
                                        "shop.items")
            assert (code, out.strip()) == (0, f"dump {second}: paused"), err
            code, _, err = await arun("dump", "resume", "--relay", r.url, second)
            assert code == 0, err
            code, _, err = await arun("dump", "resume", "--relay", r.url, second)
            assert code == 1 and "relay answered 409 conflict" in err
            code, out, err = await arun("dump", "cancel", "--relay", r.url)
            assert (code, out.strip()) == (0, f"dump {second}: cancelled"), err
            code, _, err = await arun("dump", "status", "--relay", r.url, second, "--wait")
            assert code == 1  # cancelled is not done

            # Listed keys of one source.
            code, out, err = await arun("dump", "start", "--relay", r.url, "--sources",
                                        "shop.tags", "--keys", '["w1", "w2", "nope"]',
                                        "--wait")
            assert code == 0, err
            assert _dump_rows(r.relay.dumps.get(out.split()[1])) == 2

    asyncio.run(scenario())


def test_every_error_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _source(tmp_path)

    async def scenario(r: RunningRelay) -> None:
        def check(result: tuple[int, str, str], *needles: str) -> None:
            code, _, err = result
            assert code == 1, err
            assert "Traceback" not in err and ADMIN_TOKEN not in err
            assert len(err.strip().splitlines()) == 1, err
            for needle in needles:
                assert needle in err, err

        check(await arun("dump", "start", "--relay", r.url, "--sources", "shop.nope"),
              "relay answered 404 unknown_source")
        check(await arun("dump", "start", "--relay", r.url, "--keys", "[1"),
              "--keys is not JSON")
        check(await arun("dump", "start", "--relay", r.url, "--keys", "[1]"),
              "relay answered 400 bad_request", "exactly one source")
        check(await arun("dump", "start", "--relay", r.url, "--chunk-rows", "0"),
              "400 bad_request", "chunk_rows")
        check(await arun("dump", "status", "--relay", r.url, "abc"),
              "relay answered 404 not_found")
        check(await arun("dump", "cancel", "--relay", r.url, "zz!"), "400 bad_request")
        check(await arun("dump", "start", "--relay", r.url, "--token", "wrong-token"),
              "relay answered 401")
        check(await arun("dump", "start", "--relay", "ftp://x"), "--relay must be")
        monkeypatch.delenv("DATABUS_ADMIN_TOKEN")
        check(await arun("dump", "start", "--relay", r.url), "DATABUS_ADMIN_TOKEN")
        # No watermark table: the dump is accepted and fails naming the setup command.
        code, out, err = await arun("dump", "start", "--relay", r.url, "--token",
                                    ADMIN_TOKEN, "--wait")
        assert code == 1 and "databus dump setup" in err and ADMIN_TOKEN not in out + err

    async def main_() -> None:
        async with running_relay(relay_config(tmp_path, {BUFFER: db.uri(TABLES)})) as r:
            await scenario(r)

    asyncio.run(main_())
    dead = f"http://127.0.0.1:{free_port()}"
    code, _, err = run_cli("dump", "status", "--relay", dead)
    assert code == 1 and err.strip().startswith("databus dump: error: cannot reach the relay")
    assert len(err.strip().splitlines()) == 1


def test_a_relay_without_admin_token_refuses_admin(tmp_path: Path) -> None:
    # A relay with admin disabled answers its documented error, which the CLI prints.
    db = _source(tmp_path)
    config = dataclasses.replace(relay_config(tmp_path, {BUFFER: db.uri(TABLES)}),
                                 admin_token=None)

    async def scenario() -> None:
        async with running_relay(config) as r:
            code, _, err = await arun("dump", "start", "--relay", r.url)
            assert code == 1 and "relay answered 403" in err and "disabled" in err, err

    asyncio.run(scenario())
