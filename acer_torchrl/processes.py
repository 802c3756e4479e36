"""Signals in the learner's helper processes (collector workers, the evaluation process).

Ctrl-C reaches every process of the terminal's foreground group, ``kill -- -PGID`` (a process manager, a
shell's job control) sends SIGTERM to every process of a run, and SLURM signals every process of a job on
requeue / preemption (SIGTERM, SIGUSR2). Those are meant for the learner alone: it checkpoints (submitit's
requeue under SLURM) and then shuts its helpers down itself. A helper that took SIGTERM would die before the
learner's batch is done, and the learner would wait for its weight-push acknowledgement for ever. SIGKILL still
ends them, and a helper whose learner is gone exits on its own (its pipe closes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading


def learner_signals() -> list[signal.Signals]:
    """The signals the learner handles: SIGINT, SIGTERM, and under SLURM submitit's requeue signal."""
    return [signal.SIGINT, signal.SIGTERM] + ([signal.SIGUSR2] if "SLURM_JOB_ID" in os.environ else [])


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
