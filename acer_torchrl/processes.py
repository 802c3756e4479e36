"""Signals in the learner's helper processes (collector workers, the evaluation process).

Ctrl-C reaches every process of the terminal's foreground group, and SLURM signals every process of a job on
requeue / preemption (SIGTERM, SIGUSR2). Those are meant for the learner alone: it checkpoints (submitit's
requeue under SLURM) and then shuts its helpers down itself; SIGKILL still ends them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading


def learner_signals() -> list[signal.Signals]:
    """The signals the learner handles: SIGINT, and under SLURM its requeue / preemption signals."""
    return [signal.SIGINT] + ([signal.SIGTERM, signal.SIGUSR2] if "SLURM_JOB_ID" in os.environ else [])


def ignore_learner_signals() -> None:
    """In a helper process: leave :func:`learner_signals` to the learner."""
    for sig in learner_signals():
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def learner_signals_ignored():
    """Ignore :func:`learner_signals` while a helper process starts (an ignored signal stays ignored in the
    child, and Python keeps it so): a Ctrl-C during the child's imports cannot reach it. Only the main thread
    may set handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in learner_signals()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
