"""The file checkpoint store and the envelope it shares with the server-backed stores.

Tests for what a crash or damage on disk can do to a checkpoint file. A damaged file
must raise ``CheckpointError``. It must never load as something else, and never come
back as "no checkpoint" (``None``), which would silently restart the consumer.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from databus.checkpoint import Checkpoint, Mode
from databus.client._checkpoint_envelope import (
    MAX_ENVELOPE_BYTES,
    decode_envelope,
    encode_envelope,
)
from databus.client._checkpoint_store import (
    CheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
)
from databus.errors import CheckpointError, ConfigError, DatabusError

ONLINE = Checkpoint(1234)
PARTIAL = Checkpoint(5678, 3)
BOOTSTRAP = Checkpoint(
    -1,
    mode=Mode.BOOTSTRAP_SNAPSHOT,
    bootstrap_start_scn=1000,
    bootstrap_target_scn=2000,
    bootstrap_source_index=1,
    bootstrap_last_key="clé \u00e9\u4e2d\u0000end",  # non-ASCII and NUL survive the envelope
)
WHEN = datetime(2025, 1, 31, 12, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FileCheckpointStore]:
    with FileCheckpointStore(tmp_path / "cp") as s:
        yield s


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def envelope_with(body: dict[str, object], **overrides: object) -> bytes:
    """An envelope around ``body`` with a correct CRC unless ``overrides`` says otherwise."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    doc: dict[str, object] = {
        "format": 1,
        "checkpoint": body,
        "crc32": zlib.crc32(canonical),
        "written_at": WHEN.isoformat(),
    }
    doc.update(overrides)
    return json.dumps(doc).encode()


# -- round trip ---------------------------------------------------------------------------


def test_missing_file_loads_as_none_and_the_directory_is_created(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b"
    store = FileCheckpointStore(directory, name="orders-indexer")
    assert directory.is_dir()
    assert store.path == directory / "orders-indexer.json"
    assert store.load() is None


@pytest.mark.parametrize("checkpoint", [ONLINE, PARTIAL, BOOTSTRAP, Checkpoint.latest()])
def test_round_trip(store: FileCheckpointStore, checkpoint: Checkpoint) -> None:
    store.store(checkpoint)
    assert store.load() == checkpoint
    # A second instance (a restarted process) reads the same.
    assert FileCheckpointStore(store.directory).load() == checkpoint


def test_store_replaces_the_previous_checkpoint(store: FileCheckpointStore) -> None:
    for scn in range(1, 6):
        store.store(Checkpoint(scn))
    assert store.load() == Checkpoint(5)
    assert temp_files(store.directory) == []


def test_file_content_is_the_documented_envelope(store: FileCheckpointStore) -> None:
    store.store(ONLINE)
    raw = store.path.read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    doc = json.loads(raw)
    assert list(doc) == ["format", "checkpoint", "crc32", "written_at"]
    assert doc["format"] == 1
    assert doc["checkpoint"] == {"mode": "online", "window_scn": 1234, "window_offset": -1}
    assert doc["crc32"] == zlib.crc32(ONLINE.dumps().encode())
    assert datetime.fromisoformat(doc["written_at"]).tzinfo is not None


def test_store_fsyncs_the_file_before_the_rename_and_the_directory_after(
    store: FileCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    store.store(ONLINE)
    assert calls == ["fsync file", "replace", "fsync dir"]


def test_store_rejects_what_is_not_a_checkpoint(store: FileCheckpointStore) -> None:
    with pytest.raises(TypeError, match="takes a Checkpoint"):
        store.store({"window_scn": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "../up", "x" * 201, "a\x00b", "é"])
def test_bad_names_are_rejected(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="checkpoint name"):
        FileCheckpointStore(tmp_path, name=name)


def test_close_is_idempotent_and_final(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    store.store(ONLINE)
    store.close()
    store.close()
    with pytest.raises(DatabusError, match="closed"):
        store.load()
    with pytest.raises(DatabusError, match="closed"):
        store.store(ONLINE)
    assert FileCheckpointStore(tmp_path).load() == ONLINE


# -- crashes ------------------------------------------------------------------------------

# The child stores NEW over OLD and is SIGKILLed at a known point in the write. It
# replaces one os function with one that says READY and then blocks forever.
_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from databus.checkpoint import Checkpoint
    from databus.client._checkpoint_store import FileCheckpointStore

    directory, point = sys.argv[1], sys.argv[2]
    store = FileCheckpointStore(directory)

    def block(*args, **kwargs):
        print("READY", flush=True)
        while True:
            time.sleep(60)

    real_write = os.write
    if point == "mid-write":
        # Half of the bytes reach the temp file, then the process dies.
        def write(fd, data):
            real_write(fd, bytes(data[: len(data) // 2]))
            block()
        os.write = write
    elif point == "before-fsync":
        os.fsync = block
    elif point == "before-rename":
        os.replace = block
    store.store(Checkpoint(2000, 5))
    print("NOT KILLED", flush=True)
    """
)


@pytest.mark.parametrize("point", ["mid-write", "before-fsync", "before-rename"])
def test_kill_9_mid_store_leaves_the_previous_checkpoint(tmp_path: Path, point: str) -> None:
    old = Checkpoint(1000)
    FileCheckpointStore(tmp_path).store(old)

    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path), point],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == "READY\n", f"child did not reach {point}: {line!r} {child.stderr}"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    assert child.returncode == -signal.SIGKILL

    # The interrupted write left its temp file. The checkpoint is untouched.
    leftovers = temp_files(tmp_path)
    assert len(leftovers) == 1
    if point == "before-rename":  # complete but never renamed into place
        assert decode_envelope((tmp_path / leftovers[0]).read_bytes(), where="t",
                               recovery="") == Checkpoint(2000, 5)
    reader = FileCheckpointStore(tmp_path)  # also proves the dead child's lock is gone
    assert reader.load() == old
    assert temp_files(tmp_path) == []  # cleaned up by the new instance
    reader.store(Checkpoint(3000))
    assert reader.load() == Checkpoint(3000)


def test_failed_rename_keeps_the_previous_checkpoint_and_no_temp_file(
    store: FileCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.store(ONLINE)

    def no_space(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(CheckpointError, match="No space left") as info:
        store.store(PARTIAL)
    assert info.value.retriable  # a full disk may clear up
    assert str(store.path) in str(info.value)
    monkeypatch.undo()
    assert store.load() == ONLINE
    assert temp_files(store.directory) == []


def test_unwritable_directory_is_a_permanent_error(
    store: FileCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(*args: object, **kwargs: object) -> int:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(CheckpointError, match="Permission denied") as info:
        store.store(ONLINE)
    assert not info.value.retriable


def test_stale_temp_files_are_ignored_then_removed(tmp_path: Path) -> None:
    FileCheckpointStore(tmp_path).store(ONLINE)
    stale = tmp_path / ".checkpoint.json.0123456789abcdef.tmp"
    stale.write_bytes(b'{"format":1,"chec')  # a write cut short long ago
    # Files that only look similar belong to someone else and stay.
    others = [
        tmp_path / ".other.json.0123456789abcdef.tmp",
        tmp_path / ".checkpoint.json.x.json.0123456789abcdef.tmp",
        tmp_path / "notes.tmp",
    ]
    for path in others:
        path.write_text("keep")

    store = FileCheckpointStore(tmp_path)
    assert not stale.exists()
    assert all(path.exists() for path in others)
    assert store.load() == ONLINE


# -- damage -------------------------------------------------------------------------------


def assert_clear_error(exc: CheckpointError, path: Path, reason: str) -> None:
    message = str(exc)
    assert str(path) in message, message  # which file
    assert reason in message, message  # what is wrong
    assert "delete it to deliberately start without a checkpoint" in message  # what to do
    assert not exc.retriable


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "is empty"),
        (b"  \n", "only whitespace"),
        (b"hello", "not valid JSON"),
        (b"\x00" * 64, "only NUL bytes (64 of them)"),
        (b"\xff\xfe{}", "not UTF-8 text (byte 0xff at offset 0)"),
        (b"[1, 2]", "JSON list, not an envelope"),
        (b'{"format":1,"checkpoint":{"window_scn":1', "truncated"),
        # A bare checkpoint, as if written by hand or by another tool.
        (Checkpoint(7).dumps().encode(), "no 'format' field"),
        (envelope_with(ONLINE.to_json(), format=2), "envelope format 2"),
        (envelope_with(ONLINE.to_json(), format="1"), "envelope format '1'"),
        (envelope_with(ONLINE.to_json(), format=True), "envelope format True"),
        (envelope_with(ONLINE.to_json(), extra=1), "unknown field(s) extra"),
        (envelope_with(ONLINE.to_json(), checkpoint="x"), "JSON str, not an object"),
        (envelope_with(ONLINE.to_json(), crc32=-1), "not a 32-bit unsigned"),
        (envelope_with(ONLINE.to_json(), crc32=2**32), "not a 32-bit unsigned"),
        (envelope_with(ONLINE.to_json(), crc32=1.5), "not a 32-bit unsigned"),
        (envelope_with(ONLINE.to_json(), written_at=5), "is not a string"),
        (envelope_with(ONLINE.to_json(), written_at="yesterday"), "not an ISO 8601"),
        # Valid JSON, edited window_scn: only the CRC can tell.
        (envelope_with(ONLINE.to_json(), crc32=zlib.crc32(Checkpoint(1235).dumps().encode())),
         "checksum does not match"),
        # A correct CRC over something that is not a checkpoint.
        (envelope_with({"window_scn": 5, "window_offset": -7}), "impossible checkpoint"),
        (envelope_with({"window_scn": 5, "typo": 1}), "impossible checkpoint"),
        (envelope_with({"window_scn": "5"}), "impossible checkpoint"),
        (b'{"format":1,"format":1,"checkpoint":{},"crc32":0,"written_at":""}',
         "repeats the key 'format'"),
        (b'{"format":1,"checkpoint":{"window_scn":NaN},"crc32":0,"written_at":""}',
         "holds NaN"),
    ],
)
def test_damaged_file_raises_a_clear_error(
    store: FileCheckpointStore, content: bytes, reason: str
) -> None:
    store.path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        store.load()
    assert_clear_error(info.value, store.path, reason)


def test_missing_envelope_fields_are_named(store: FileCheckpointStore) -> None:
    doc = json.loads(envelope_with(ONLINE.to_json()))
    del doc["crc32"], doc["written_at"]
    store.path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError) as info:
        store.load()
    assert_clear_error(info.value, store.path, "lacks the field(s) crc32, written_at")


def test_oversized_file_is_not_read_into_memory(store: FileCheckpointStore) -> None:
    store.path.write_bytes(b" " * (MAX_ENVELOPE_BYTES + 10) + b"{}")
    with pytest.raises(CheckpointError) as info:
        store.load()
    assert_clear_error(info.value, store.path, f"more than {MAX_ENVELOPE_BYTES} bytes")


def test_a_directory_in_place_of_the_file(store: FileCheckpointStore) -> None:
    store.path.mkdir()
    with pytest.raises(CheckpointError, match="cannot read checkpoint file") as info:
        store.load()
    assert str(store.path) in str(info.value)
    assert not info.value.retriable


def test_every_truncation_raises(store: FileCheckpointStore) -> None:
    store.store(BOOTSTRAP)
    full = store.path.read_bytes()
    for length in range(len(full) - 1):  # all but the trailing newline
        store.path.write_bytes(full[:length])
        with pytest.raises(CheckpointError) as info:
            store.load()
        assert str(store.path) in str(info.value)
        if length > 0:
            assert "truncated" in str(info.value), (length, str(info.value))
    # Cutting just the newline leaves the whole JSON document: still the same checkpoint.
    store.path.write_bytes(full[:-1])
    assert store.load() == BOOTSTRAP


@pytest.mark.parametrize("checkpoint", [ONLINE, BOOTSTRAP])
def test_every_flipped_bit_raises_or_loads_the_exact_original(
    store: FileCheckpointStore, checkpoint: Checkpoint
) -> None:
    store.store(checkpoint)
    original = store.path.read_bytes()
    outcomes = {"raised": 0, "original": 0}
    for position in range(len(original)):
        for bit in range(8):
            damaged = bytearray(original)
            damaged[position] ^= 1 << bit
            store.path.write_bytes(bytes(damaged))
            try:
                loaded = store.load()
            except CheckpointError as exc:
                assert str(store.path) in str(exc)
                outcomes["raised"] += 1
                continue
            assert loaded == checkpoint, (position, bit, bytes(damaged))
            outcomes["original"] += 1
    # Only whitespace and the unchecked written_at timestamp can absorb a flip. Nearly
    # all flips must be caught.
    assert outcomes["raised"] > 0.8 * len(original) * 8, outcomes


@pytest.mark.parametrize("checkpoint", [ONLINE, PARTIAL, BOOTSTRAP])
def test_every_byte_value_at_every_position_raises_or_decodes_the_original(
    checkpoint: Checkpoint,
) -> None:
    # The exhaustive variant of the test above, on bytes (no file I/O), 256 values per byte.
    original = encode_envelope(checkpoint, written_at=WHEN)
    for position in range(len(original)):
        for value in range(256):
            if value == original[position]:
                continue
            damaged = original[:position] + bytes([value]) + original[position + 1:]
            try:
                decoded = decode_envelope(damaged, where="w", recovery="r")
            except CheckpointError:
                continue
            assert decoded == checkpoint, (position, value, damaged)


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_decode_envelope_accepts_reformatted_json(ensure_ascii: bool) -> None:
    # PostgreSQL jsonb reorders keys, adds spaces and decodes \u escapes. The CRC covers
    # the canonical form, so the envelope still verifies.
    doc = json.loads(encode_envelope(BOOTSTRAP))
    reformatted = json.dumps(doc, indent=4, sort_keys=True, ensure_ascii=ensure_ascii)
    assert decode_envelope(reformatted.encode(), where="w", recovery="r") == BOOTSTRAP


# -- concurrency --------------------------------------------------------------------------


def test_concurrent_stores_end_with_a_valid_file_and_readers_never_see_damage(
    tmp_path: Path,
) -> None:
    shared = FileCheckpointStore(tmp_path)
    writers, per_writer = 8, 40
    written = {Checkpoint(w * 1000 + i) for w in range(writers) for i in range(per_writer)}
    errors: list[BaseException] = []
    done = threading.Event()

    def write(w: int) -> None:
        # Half the writers share one instance (thread lock), the other half have their own
        # (file lock).
        store = shared if w % 2 else FileCheckpointStore(tmp_path)
        try:
            for i in range(per_writer):
                store.store(Checkpoint(w * 1000 + i))
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            while not done.is_set():
                loaded = shared.load()
                assert loaded is None or loaded in written
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    reader = threading.Thread(target=read)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()

    assert errors == []
    assert shared.load() in written
    assert temp_files(tmp_path) == []
    # The winner is the last store of some writer.
    assert shared.load() in {Checkpoint(w * 1000 + per_writer - 1) for w in range(writers)}


# -- the memory store ---------------------------------------------------------------------


def test_memory_store() -> None:
    store: CheckpointStore = MemoryCheckpointStore()
    assert store.load() is None
    store.store(ONLINE)
    store.store(PARTIAL)
    assert store.load() == PARTIAL
    assert isinstance(store, MemoryCheckpointStore) and store.stores == 2
    assert MemoryCheckpointStore(ONLINE).load() == ONLINE
    store.close()
    store.close()
    with pytest.raises(DatabusError, match="closed"):
        store.load()
