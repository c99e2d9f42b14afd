"""``databus demo`` runs the whole pipeline and ends with every replica check passing:
the consumer that followed the relay, the late one that began from a snapshot, and the
replicator's copy, all holding the rows that existed before capture (brought in by the
relay's initial dump)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_ends_with_the_replica_equal_to_the_source(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("databus")
    done = subprocess.run(
        [str(exe), "demo", "--seconds", "3", "--rate", "100", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = " ".join(done.stdout.split())  # rich wraps long lines
    assert "replica equals source" in out
    assert "late replica equals source" in out
    # The replicator's copy, in a second SQLite database, checked the same way.
    assert "replicated copy (replica.db) equals source" in out
    assert (tmp_path / "replica.db").is_file()
    assert "started from a bootstrap snapshot (1 bootstrap(s))" in out
    # The rows that were there before capture came in through the initial dump.
    assert "the dump brought in" in out and "11,000 that existed before capture" in out
    assert (tmp_path / "checkpoints").is_dir()
    assert (tmp_path / "bootstrap.db").is_file()
