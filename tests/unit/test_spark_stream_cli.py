"""``databus spark stream``: argument parsing and the checks made before Spark starts.

The end-to-end run (a relay, ``databus spark stream`` in a subprocess, the table equal to
the source, the query killed and resumed from its checkpoint) needs the ``databus``
source and is added with it (tests/integration).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from databus.cli import main
from databus.spark_jobs._apply import COMMIT_DIR, COMMIT_FILE, TableConflict
from databus.spark_jobs._stream_cli import add_stream, check_paths, stream_options


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_stream(parser.add_subparsers())
    return parser.parse_args(["stream", *argv])


def test_options_of_the_source() -> None:
    args = parse("--relay", "http://r1:8080", "--relay", "https://r2:8443,http://r3:1",
                 "--sources", "shop.orders, shop.items", "--to", "/t", "--checkpoint", "/cp",
                 "--bootstrap", "http://b:9090", "--partitions", "4", "--trigger", "2.5")
    assert stream_options(args) == {
        "relays": "http://r1:8080,https://r2:8443,http://r3:1",
        "sources": "shop.orders,shop.items", "partitions": "4", "bootstrap": "http://b:9090"}
    assert args.trigger == 2.5
    plain = parse("--relay", "http://r", "--sources", "a", "--to", "t", "--checkpoint", "c")
    assert stream_options(plain) == {"relays": "http://r", "sources": "a", "partitions": "1"}
    assert plain.trigger is None


@pytest.mark.parametrize("missing", ["--relay", "--sources", "--to", "--checkpoint"])
def test_required_arguments(missing: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = {"--relay": "http://r", "--sources": "a", "--to": "t", "--checkpoint": "c"}
    del argv[missing]
    with pytest.raises(SystemExit) as exited:
        main(["spark", "stream", *(x for kv in argv.items() for x in kv)])
    assert exited.value.code == 2
    assert missing in capsys.readouterr().err


@pytest.mark.parametrize(("extra", "message"), [
    (["--relay", "r1:8080"], "--relay wants http:// or https:// URLs, got 'r1:8080'"),
    (["--bootstrap", "ftp://b"], "--bootstrap wants http:// or https:// URLs"),
    (["--sources", "a,,b"], "--sources wants names separated by commas"),
    (["--sources", "a,a"], "--sources names a source twice"),
    (["--partitions", "0"], "--partitions must be at least 1, got 0"),
    (["--trigger", "0"], "--trigger must be a positive number of seconds"),
    (["--trigger", "nan"], "--trigger must be a positive number of seconds"),
    (["--to", "s3a://bucket/t"], "writes to a file system path"),
], ids=["relay", "bootstrap", "empty source", "twice", "partitions", "trigger", "nan",
        "scheme"])
def test_a_wrong_argument_is_one_line_before_spark_starts(
        extra: list[str], message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = {"--relay": "http://r", "--sources": "a", "--to": str(tmp_path / "t"),
            "--checkpoint": str(tmp_path / "cp")}
    argv.update(dict(zip(extra[::2], extra[1::2], strict=True)))
    assert main(["spark", "stream", *(x for kv in argv.items() for x in kv)]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "t").exists()  # nothing was created


def test_table_and_checkpoint_paths(tmp_path: Path) -> None:
    table, checkpoint = tmp_path / "t", tmp_path / "cp"
    check_paths(str(table), str(checkpoint))  # both new: fine
    with pytest.raises(Exception, match="must not contain one another"):
        check_paths(str(table), str(table / "cp"))
    with pytest.raises(Exception, match="must not contain one another"):
        check_paths(str(tmp_path), str(checkpoint))
    (table / COMMIT_DIR).mkdir(parents=True)
    (table / COMMIT_DIR / COMMIT_FILE).write_text(json.dumps(
        {"format": 1, "version": 3, "dir": "v0000000003-b7", "batch_id": 7, "rows": 1,
         "schema": None}))
    # A table written by a query whose checkpoint is not this one: its batch ids would
    # start again at 0 and be skipped as applied.
    with pytest.raises(TableConflict, match="written up to batch 7 by a query whose "
                                            "checkpoint is not"):
        check_paths(str(table), str(checkpoint))
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "7").write_text("v1")
    check_paths(str(table), f"file://{checkpoint}")  # resuming that query: fine
