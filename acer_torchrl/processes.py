"""Signals in a run's processes: the learner's (:class:`RunGuard` around a trainer's step API) and its helpers'
(collector workers, the evaluation process).

Ctrl-C reaches every process of the terminal's foreground group, ``kill -- -PGID`` (a process manager, a
shell's job control) sends SIGTERM to every process of a run, and SLURM signals every process of a job on
requeue / preemption (SIGTERM, SIGUSR2). Those are meant for the learner alone: it checkpoints (submitit's
requeue under SLURM) and then shuts its helpers down itself. A helper that took SIGTERM would die before the
learner's batch is done, and the learner would wait for its weight-push acknowledgement for ever. SIGKILL still
ends them, and a helper whose learner is gone exits on its own (its pipe closes).

The learner itself, on the recipe command line, handles SIGINT / SIGTERM from its first instruction to its
last with :class:`StopSignals`: one stop, one line, exit code 130 / 143 (:class:`Interrupted`). :class:`RunGuard`
drives a run through its step API so that such a stop, or submitit's requeue, never cuts a batch short.

A helper that dies (the OOM killer's SIGKILL, a crash) is noticed by the learner within seconds: a collector worker
ends the run as a stop does, saved, with one line naming the worker and exit code 3 (:class:`HelperDied`); the
evaluation process holds no state and is restarted (``evaluation.py``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import resource_sharer
from typing import Protocol


def learner_signals() -> list[signal.Signals]:
    """The signals the learner handles: SIGINT, SIGTERM, and under SLURM submitit's requeue signal."""
    return [signal.SIGINT, signal.SIGTERM] + ([signal.SIGUSR2] if "SLURM_JOB_ID" in os.environ else [])


class Interrupted(BaseException):
    """The learner stops at SIGINT / SIGTERM; the message (one line) says what was saved and how to continue.
    A ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception`` on its way out swallows it."""

    def __init__(self, signum: int, message: str | None = None):
        super().__init__(message or "interrupted during start-up: nothing to save yet")
        self.signum = signum
        self.exit_code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


HELPER_DIED_EXIT_CODE = 3


def died(name: str, pid: int | None, exitcode: int | None) -> str:
    """``name (pid N) died (killed by SIGKILL)``: a dead helper in words, from ``multiprocessing``'s exit code
    (minus the signal that killed it)."""
    how = f"killed by {signal.Signals(-exitcode).name}" if exitcode is not None and exitcode < 0 else f"exit code {exitcode}"
    return f"{name} (pid {pid}) died ({how})"


class HelperDied(BaseException):
    """A helper process the run cannot go on without died (:func:`died` says which and how). The learner saves what
    it has (:class:`RunGuard`) and stops with one line and exit code :data:`HELPER_DIED_EXIT_CODE`; a
    ``BaseException``, as :class:`Interrupted` is."""

    exit_code = HELPER_DIED_EXIT_CODE

    def __init__(self, what: str, where: str | None = None):
        super().__init__(f"{what}; stopped {where}" if where else f"{what}; nothing to save yet")
        self.what = what


class StopSignals:
    """SIGINT / SIGTERM in the learner's main thread, installed by the recipe command line before its first
    import of weight. The first signal raises :class:`Interrupted` where the main thread is (start-up, or
    waiting for a batch: nothing is half done there), or, inside :meth:`deferred` (a batch being learned
    from, a checkpoint being written), once that block is done. Later signals are noted and dropped: the
    learner is already stopping, and its checkpoint must not be cut short (SIGKILL still ends it at once).

    Python runs a signal's handler wherever the main thread is, a weakref callback or a ``__del__`` included, and
    there an exception is only reported (``sys.unraisablehook``, a traceback on stderr) and dropped: the stop would
    be lost, and the learner would go on (or wait for ever on helpers that were told to stop). Such an
    :class:`Interrupted` is kept, silently, and raised again as the next :meth:`deferred` block begins."""

    def __init__(self):
        self.signum: int | None = None
        self._deferring = False
        self._dropped = False  # the first signal's Interrupted was raised where Python drops exceptions
        self._previous = {}
        self._previous_unraisablehook = None

    def install(self) -> StopSignals:
        """Handle SIGINT / SIGTERM from now on (main thread only); :meth:`restore` puts the old handlers back."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        self._previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = self._on_unraisable
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if self._previous_unraisablehook is not None:
            sys.unraisablehook = self._previous_unraisablehook
            self._previous_unraisablehook = None

    def _on_unraisable(self, unraisable) -> None:
        if isinstance(unraisable.exc_value, Interrupted):
            self._dropped = True
        else:
            self._previous_unraisablehook(unraisable)

    def _on_signal(self, signum: int, _frame) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        if not self._deferring:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def deferred(self):
        """A block a signal must not cut short: it is noted, and :class:`Interrupted` raised when the block ends.
        A stop that was dropped before the block (see the class) is raised instead of entering it."""
        if self._dropped:
            self._dropped = False
            raise Interrupted(self.signum)
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self.signum is not None:
            raise Interrupted(self.signum)


class SteppedRun(Protocol):
    """A run's step API (:class:`~acer_torchrl.trainer.Trainer`'s), what :class:`RunGuard` drives."""

    def finished_summary(self) -> dict | None: ...

    def start(self) -> Iterator: ...

    def step(self, batch) -> bool: ...

    def checkpoint_due(self) -> bool: ...

    def periodic_checkpoint(self) -> None: ...

    def checkpoint(self) -> None: ...

    def stop_collecting(self) -> None: ...

    def finish(self) -> dict: ...

    def stop_early(self) -> str | None: ...

    def close(self) -> None: ...


class RunGuard:
    """Drives a run through its step API in the learner's process: :meth:`train`, each batch's ``step()`` and then,
    when due, its periodic checkpoint (:meth:`checkpoint_together`). With ``stop_signals``
    (installed: the command line), SIGINT / SIGTERM end the run with its ``stop_early()`` and :class:`Interrupted`:
    at once during start-up or while waiting for a batch, after the batch in hand, or once the final evaluation
    is done. Under SLURM, submitit's requeue signal waits for the batch in hand (:meth:`holding_requeue`)."""

    def __init__(self, stop_signals: StopSignals | None = None):
        self.stop_signals = stop_signals
        self.held_requeue: Callable[[], None] | None = None  # submitit's preemption handler, held by holding_requeue()

    def train(self, run: SteppedRun) -> dict:
        """The whole run (or what is left of it): ``start()``, ``step()`` on every batch, ``stop_collecting()``,
        ``finish()``, and in any case ``close()``; returns its summary. A resumed run that had already finished
        returns its ``finished_summary()`` untouched."""
        finished = run.finished_summary()
        if finished is not None:
            run.close()
            return finished
        return self.train_in_turn([run])[0]

    def train_in_turn(self, runs: Sequence[SteppedRun]) -> list[dict]:
        """Several runs in one process, a batch each in turn until each is done (the agents of a shared-replay
        sweep), or one (:meth:`train`); returns their summaries. A stop ends every run after the batch in hand,
        each saved by its ``stop_early()``, as does a helper's death (:class:`HelperDied`, raised by a run's
        collector); a held requeue checkpoints every run first. A stop this guard did not defer (no
        ``stop_signals``: the caller installed them, as a sweep's rank does) may have landed inside a batch, so it
        saves nothing: the runs' latest periodic checkpoints stay."""
        try:
            with self.holding_requeue():
                batches = [run.start() for run in runs]
                running = list(range(len(runs)))
                while running:  # one round: every run still going learns from one batch
                    for i in list(running):
                        batch = next(batches[i], None)
                        with self.deferring_stops():
                            done = batch is None or runs[i].step(batch)
                            if done:
                                runs[i].stop_collecting()
                                running.remove(i)
                        if not done and self.held_requeue is not None:
                            for run in runs:
                                run.checkpoint()  # the requeued job resumes from this batch
                            requeue, self.held_requeue = self.held_requeue, None
                            requeue()  # submitit: requeue, then exit (a job's other tasks: returns, goes on)
                    with self.deferring_stops():
                        self.checkpoint_together([runs[i] for i in running])
            return self.finish(runs)
        except Interrupted as stop:
            where = self.stop_early(runs) if self.stop_signals is not None else None
            raise Interrupted(stop.signum, f"interrupted {where}" if where else None) from None
        except HelperDied as death:
            raise HelperDied(death.what, self.stop_early(runs)) from None
        finally:
            for run in runs:
                run.close()

    @staticmethod
    def checkpoint_together(runs: Sequence[SteppedRun]) -> None:
        """The runs' periodic checkpoints, taken after a round, all of them once one is due. A shared-replay sweep's
        agents store into one replay, which agent 0's checkpoint holds: taken inside agent 0's step, it lacked the
        round's batches of the agents after it, which their own checkpoints counted, and a sweep killed (SIGKILL)
        before the next checkpoints resumed with a replay short of those steps."""
        if any(run.checkpoint_due() for run in runs):
            for run in runs:
                run.periodic_checkpoint()

    def finish(self, runs: Sequence[SteppedRun]) -> list[dict]:
        """Every run's ``finish()`` (its final evaluation and ``summary.json``), which a stop waits for. A stop that
        came meanwhile ends nothing more: the runs are finished, their summaries are returned (a line saying
        "interrupted" and a resume command would say otherwise of a complete run)."""
        summaries = None
        try:
            with self.deferring_stops():
                summaries = [run.finish() for run in runs]
        except Interrupted:
            if summaries is None:  # a stop dropped before the block (StopSignals.deferred): nothing finished
                raise
        return summaries

    @staticmethod
    def stop_early(runs: Sequence[SteppedRun]) -> str | None:
        """Every run's ``stop_early()``: where they stopped and how to continue, None when none had anything to save."""
        wheres = [where for where in (run.stop_early() for run in runs) if where]
        return "; ".join(wheres) if wheres else None

    def deferring_stops(self) -> contextlib.AbstractContextManager:
        """A block a stop signal waits for (:meth:`StopSignals.deferred`); a no-op without ``stop_signals``."""
        return self.stop_signals.deferred() if self.stop_signals is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def holding_requeue(self):
        """In a submitit job (SLURM's, or ``submit.py --local``'s, whose controller sends it 30 s before the time
        limit), submitit's preemption / time-out signal (SIGUSR2) runs a handler that requeues the job
        and exits (``SystemExit``) from whatever code the signal interrupted. Inside a loss's forward that met
        tensordict's ``to_module`` context, whose exit raised an error of its own over the ``SystemExit``: the
        job ended as failed (``tests/test_slurm.py``, now and then). So the signal is held here (in
        :attr:`held_requeue`) and :meth:`train` calls the handler after the batch in hand, with a checkpoint first."""
        handler = signal.getsignal(signal.SIGUSR2)
        in_main_thread = threading.current_thread() is threading.main_thread()  # where Python runs signal handlers
        in_job = any(name in os.environ for name in ("SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID"))
        if not in_job or not callable(handler) or not in_main_thread:
            yield
            return

        def hold(signum, frame) -> None:
            self.held_requeue = lambda: handler(signum, frame)

        signal.signal(signal.SIGUSR2, hold)
        try:
            yield
        finally:
            signal.signal(signal.SIGUSR2, handler)


def end_unfinished_helpers() -> None:
    """Kill the helper processes that are still starting or ending when a run stops for good (an interrupted
    start-up, nothing to resume): a child still unpickling its arguments when this process exits finds the
    parent's semaphores gone and prints a traceback; killed, it ends silently."""
    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=5)


def ignore_learner_signals() -> None:
    """In a helper process: leave :func:`learner_signals` to the learner (ignored, then unblocked: pending
    ones, held since the process started under :func:`learner_signals_held`, are dropped), and stay quiet when
    the stopping learner hangs up on a tensor this process shares (:func:`_quiet_on_learner_hangups`)."""
    for sig in learner_signals():
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, learner_signals())
    sys.excepthook = _quiet_on_learner_hangups(sys.excepthook)


def _quiet_on_learner_hangups(excepthook: Callable) -> Callable:
    """``excepthook`` without the learner's hang-ups on multiprocessing's resource sharer. A tensor a helper puts on
    a queue (a collector worker's batch) reaches the learner as a file descriptor that a thread of the helper
    serves; a stop raises in the learner wherever it waits, the middle of that exchange too, and the thread then
    printed the closed connection's traceback into the run's stderr. Nothing is lost: the learner is stopping."""

    def hook(exc_type, exc, tb) -> None:
        frames = traceback.extract_tb(tb)
        in_sharer = bool(frames) and frames[0].filename == resource_sharer.__file__
        if in_sharer and issubclass(exc_type, (ConnectionError, EOFError)):
            return
        excepthook(exc_type, exc, tb)

    return hook


@contextlib.contextmanager
def learner_signals_held():
    """Block :func:`learner_signals` in this thread while a helper process starts: the child inherits them
    blocked (through ``exec`` too), so that a Ctrl-C during its interpreter's start and imports waits unseen
    until it ignores them (:func:`ignore_learner_signals`).

    In the main thread their Python handlers are held as well: the kernel gives a signal this thread blocks to
    another thread of the learner, and Python then runs the handler here all the same, where it cut a start in the
    middle of sending the child its arguments (the child, not yet known to the learner, printed an ``EOFError``
    traceback under a Ctrl-C's one line). The learner loses none: a signal that comes meanwhile is handled, by the
    handler it would have met, as the block ends."""
    held: list[tuple[int, object]] = []
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in learner_signals():
            if callable(signal.getsignal(sig)):
                handlers[sig] = signal.signal(sig, lambda signum, frame: held.append((signum, frame)))
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, learner_signals())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        for signum, frame in held:
            handlers[signum](signum, frame)
