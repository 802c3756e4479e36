"""The files in ``examples/`` run as a newcomer runs them: ``python examples/<file>.py``, a real process."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ACER_CARTPOLE = str(ROOT / "examples" / "acer_cartpole.py")


def imported_package_modules(importtime_log: str) -> set[str]:
    """The ``acer_torchrl`` modules a process imported, read from its ``python -X importtime`` log."""
    return set(re.findall(r"\|\s*(acer_torchrl(?:\.\w+)*)\s*$", importtime_log, flags=re.MULTILINE))


def test_acer_cartpole_example_trains_evaluates_and_imports_only_the_losses():
    run = subprocess.run([sys.executable, "-X", "importtime", ACER_CARTPOLE, "--total-frames", "1088"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    # from 1 024 stored steps on it replays too; the last collected batch is evaluated
    assert re.search(r"^frames +1088  greedy return +\d+\.\d  \(\d+ s\)$", run.stdout, flags=re.MULTILINE), run.stdout
    modules = imported_package_modules(run.stderr)
    assert "acer_torchrl.objectives" in modules  # (the loss's own module comes through importlib: not logged)
    assert {m for m in modules if not m.startswith("acer_torchrl.objectives")} == {"acer_torchrl"}


@pytest.mark.integration
def test_acer_cartpole_example_ends_on_ctrl_c_with_one_line_and_exit_code_130():
    proc = subprocess.Popen([sys.executable, ACER_CARTPOLE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().startswith("ACER on CartPole-v1, seed 0: 50048 frames")  # whole batches of 64
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.splitlines()[-1] == (
        "interrupted: this example keeps no checkpoint to resume from"
    ), stderr[-3000:]
