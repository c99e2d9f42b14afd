"""``databus demo`` runs the whole pipeline and ends with the replica check passing."""

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
    assert "replica equals source" in done.stdout
    assert (tmp_path / "checkpoints").is_dir()
