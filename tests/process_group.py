"""A run started in a session (process group) of its own, as a terminal or SLURM runs it: waiting on it and
signalling its whole group (the run and its collector workers), finding its helper processes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable


def captured(proc: subprocess.Popen, timeout: float | None = None) -> str:
    """What the run wrote to the pipes the test captured (stdout, stderr, whichever are piped), once it ended."""
    return "".join(part for part in proc.communicate(timeout=timeout) if part)


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen, seconds: float) -> None:
    """Return once ``condition()`` holds; fail with the run's output if it ends first, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert proc.poll() is None, captured(proc)
        assert time.monotonic() < deadline, f"not reached within {seconds} s"
        time.sleep(0.1)


def signal_group(proc: subprocess.Popen, sig: int) -> tuple[int, str, float]:
    """Send ``sig`` to the run's whole process group; returns its exit code, output and seconds to exit."""
    sent = time.monotonic()
    os.killpg(proc.pid, sig)
    try:
        output = captured(proc, timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, output, time.monotonic() - sent


def spawned_children(pid: int) -> list[int]:
    """The processes that ``pid`` started with ``multiprocessing``'s spawn (its helpers; not its resource tracker)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
