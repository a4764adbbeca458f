"""scripts/gc_pause.py on the CPU with the toy tail: it loads a pool with the freeze off, reports how many
objects the collector tracks and the full collection's time as loaded and frozen."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gc_pause.py"


@pytest.mark.slow
def test_it_reports_the_collections_as_loaded_and_frozen():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tail", "toy", "--repeats", "2"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"a pool of 'toy' on cpu: \d+ objects tracked by the collector", lines[0])
    assert re.fullmatch(r"full collection, median of 2: \d+\.\d ms as loaded, \d+\.\d{3} ms frozen", lines[1])
