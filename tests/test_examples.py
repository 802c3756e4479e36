"""The files in ``examples/`` run as a newcomer runs them: ``python examples/<file>.py``, a real process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_package_modules(importtime_log: str) -> set[str]:
    """The ``acer_torchrl`` modules a process imported, read from its ``python -X importtime`` log."""
    return set(re.findall(r"\|\s*(acer_torchrl(?:\.\w+)*)\s*$", importtime_log, flags=re.MULTILINE))


def test_acer_cartpole_example_trains_evaluates_and_imports_only_the_losses():
    run = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "examples" / "acer_cartpole.py"), "--total-frames", "1088"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # from 1 024 stored steps on it replays too; the last collected batch is evaluated
    assert re.search(r"^frames +1088  greedy return +\d+\.\d  \(\d+ s\)$", run.stdout, flags=re.MULTILINE), run.stdout
    modules = imported_package_modules(run.stderr)
    assert "acer_torchrl.objectives" in modules  # (the loss's own module comes through importlib: not logged)
    assert {m for m in modules if not m.startswith("acer_torchrl.objectives")} == {"acer_torchrl"}
