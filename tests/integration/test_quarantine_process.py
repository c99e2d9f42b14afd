"""A quarantine kept across a relay process restart, served by its worker processes,
and healed with ``databus relay heal`` (DESIGN 17), on a real SQLite TxLog source.

The quarantine is the one a fetcher records just before the relay is killed: its
record is in ``quarantine.json`` but its marker never landed (the window was not
published). The restarted relay writes the marker into its first window, drops the
source's events, and every serving process answers its consumers with the error at
the quarantine SCN until the heal."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from databus.cli import main
from databus.event import DUMP_END_SOURCE_ID, QUARANTINE_SOURCE_ID, decode_event, iter_events
from tests.quarantine_support import shop_source
from tests.relay_harness import RelayProcess
from tests.unit.test_quarantine_relay import TABLES, item, tag
from tests.unit.test_txlog_support import BUFFER
from tests.waiting import wait_until

TOKEN = "quarantine-admin-token"
FIX = "delete the bad row, then: databus relay heal --source shop.items"


def _get(url: str, **params: str) -> tuple[int, bytes, dict[str, str]]:
    query = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}?{query}", timeout=10) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def _poll(relay: str, **params: str) -> tuple[bytes, int, dict[str, Any] | None]:
    """Poll from the start until an error or nothing new: (body, status, error)."""
    body, cp = b"", None
    while True:
        query = dict(params)
        if cp is not None:
            query["checkpoint"] = cp
        status, chunk, headers = _get(relay + "/v1/stream", **query)
        if status != 200:
            return body, status, json.loads(chunk)
        if not chunk:
            return body, 200, None
        body += chunk
        cp = headers["X-Databus-Checkpoint"]


def _heal(relay: str, token: str | None) -> tuple[int, str, str]:
    """``databus relay heal`` (in this process: the CLI's main): (exit, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    saved = os.environ.pop("DATABUS_ADMIN_TOKEN", None)
    if token is not None:
        os.environ["DATABUS_ADMIN_TOKEN"] = token
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["relay", "heal", "--relay", relay, "--source", "shop.items"])
    finally:
        os.environ.pop("DATABUS_ADMIN_TOKEN", None)
        if saved is not None:
            os.environ["DATABUS_ADMIN_TOKEN"] = saved
    return code, out.getvalue(), err.getvalue()


def tail_heal(relay: RelayProcess, tail: subprocess.Popen[bytes], tail_out: Path) -> None:
    """The CLI: no token, then the heal; the waiting tail prints the heal's dump."""
    code, _, stderr = _heal(relay.url, None)
    assert code == 1 and "admin token" in stderr
    code, stdout, stderr = _heal(relay.url, TOKEN)
    assert code == 0, stderr
    assert "out of quarantine" in stdout and "dump" in stdout

    def dumped() -> bool:
        return any(json.loads(line).get("marker") == "dump_end"
                   for line in tail_out.read_text().splitlines())

    wait_until(dumped, "tail prints the heal's dump", 30)
    assert tail.poll() is None


def test_a_restarted_relay_keeps_the_quarantine_and_heals_from_the_cli(tmp_path: Path) -> None:
    db = shop_source(tmp_path)
    relay = RelayProcess(tmp_path, {BUFFER: db.uri(TABLES)}, workers=2, admin_token=TOKEN)
    relay.start()
    try:
        db.txn(item(1, "a"), item(3, "c"), tag("x", 1))
        wait_until(lambda: b"x" in _poll(relay.url, sources="shop.tags")[0], "tag x", 20)
        held = relay.status()["buffers"][BUFFER]["max_scn"]
        relay.kill(signal.SIGTERM)
        x = held + 1  # the next window, the one the fetcher was writing
        (tmp_path / "relay" / "quarantine.json").write_text(json.dumps({
            "version": 1, "quarantined": [{
                "buffer": BUFFER, "source": "shop.items", "scn": x, "since": time.time(),
                "reason": "a row its schema cannot hold", "fix": FIX, "marker_scn": None,
                "healing": False}]}))
        relay.start()
        db.txn(item(2, "b"), tag("y", 2))
        wait_until(lambda: b"y" in _poll(relay.url, sources="shop.tags")[0], "tag y", 20)
        assert relay.status()["buffers"][BUFFER]["quarantined"][0]["scn"] == x
        everything, status, _ = _poll(relay.url, quarantine="pass")
        markers = [(h.scn, json.loads(bytes(decode_event(everything, off).value)))
                   for off, h in iter_events(everything) if h.source_id == QUARANTINE_SOURCE_ID]
        assert [m["scn"] for _, m in markers] == [x] and markers[0][0] >= x
        names = {s["id"]: s["name"] for s in json.loads(
            _get(relay.url + "/v1/sources")[1])["sources"]}
        items_after = [h.scn for _, h in iter_events(everything)
                       if h.source_id >= 0 and names[h.source_id] == "shop.items"]
        assert items_after and max(items_after) < x  # item 2 was dropped
        for _ in range(6):  # whichever process takes the connection
            body, status, error = _poll(relay.url, sources="shop.items")
            assert status == 409 and error is not None
            assert (error["error"], error["scn"], error["fix"]) == ("source_quarantined", x, FIX)
            assert all(h.scn < x for _, h in iter_events(body))
        assert _get(relay.url + "/readyz")[0] == 503
        # databus tail of the source: what came before X, one line about the quarantine,
        # then it waits (and after the heal prints the dump).
        exe = str(Path(sys.executable).with_name("databus"))
        tail_out, tail_err = tmp_path / "tail.out", tmp_path / "tail.err"
        with open(tail_out, "wb") as out, open(tail_err, "wb") as err:
            tail = subprocess.Popen([exe, "tail", "--relay", relay.url, "--sources",
                                     "shop.items", "--from-earliest"], stdout=out, stderr=err)
        try:
            wait_until(lambda: "quarantined at the relay" in tail_err.read_text(),
                       "tail says the source is quarantined", 20)
            time.sleep(1.0)  # retries meanwhile: still one line
            assert tail.poll() is None
            lines = [line for line in tail_err.read_text().splitlines()
                     if "quarantined at the relay" in line]
            assert len(lines) == 1 and FIX in lines[0] and f"SCN {x}" in lines[0]
            printed = [json.loads(line) for line in tail_out.read_text().splitlines()]
            assert [p["key"] for p in printed if "key" in p] == [1, 3]
            tail_heal(relay, tail, tail_out)
        finally:
            if tail.poll() is None:
                tail.send_signal(signal.SIGTERM)
                tail.wait(timeout=20)
        code, _, stderr = _heal(relay.url, TOKEN)
        assert code == 1 and "not_quarantined" in stderr

        def converged() -> bool:
            body, status, _ = _poll(relay.url, sources="shop.items")
            if status != 200 or not any(h.source_id == DUMP_END_SOURCE_ID
                                        for _, h in iter_events(body)):
                return False
            rows: dict[Any, Any] = {}
            for off, h in iter_events(body):
                if h.source_id >= 0:
                    rows[decode_event(body, off).key] = h.scn
            return set(rows) == {r["id"] for r in db.rows("items")}

        wait_until(converged, "the heal's dump served", 30)
        for _ in range(8):  # by every process: none still stops at the quarantine
            assert _poll(relay.url, sources="shop.items")[1] == 200
        assert _get(relay.url + "/readyz")[0] == 200
    finally:
        if relay.proc is not None and relay.proc.poll() is None:
            relay.kill(signal.SIGTERM)
