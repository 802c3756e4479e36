"""What a SLURM job runs (through submitit): a recipe run that survives preemption and requeueing.

``RecipeJob()(recipe, overrides)`` runs :func:`acer_torchrl.cli.run` with ``key=value`` overrides that
must fix ``run_dir=`` before submission, so that a requeued job finds its checkpoints there:

* submitit's own preemption/timeout signal is held until the batch in hand is done; the run is then
  checkpointed and :meth:`RecipeJob.checkpoint` requeues the job with ``resume=<run_dir>``
  (:class:`~acer_torchrl.processes.RunGuard`);
* an external requeue (``scontrol requeue``, node failure) restarts the job with its original arguments;
  ``SLURM_RESTART_COUNT`` then tells :meth:`RecipeJob.__call__` to resume from ``run_dir`` as well.

A job with several tasks (``slurm/submit.py <recipe> --nodes N``) collects on all of its nodes: task 0 is
the learner, every other task one collector process serving it over ``torch.distributed``
(:func:`acer_torchrl.collectors.serve_remote_collection`); SLURM starts, requeues and ends them together.

A job of submitit's local executor (``slurm/submit.py --local``) handles SIGINT / SIGTERM as a recipe does: the
run checkpoints and its result says where it stopped (:func:`run_stopping_on_signals`). Under SLURM submitit's
own signal handling stays (requeue on preemption). A requeue signalled while the run is still being built (before its
loop starts) starts it afresh. This module imports neither
torch nor the trainer at import time, so ``slurm/submit.py`` stays quick.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import submitit

from acer_torchrl.config import override_value, without_keys


def required_run_dir(overrides: list[str]) -> str:
    """The ``run_dir=`` of ``overrides``; a one-line ValueError when it is missing."""
    run_dir = override_value(overrides, "run_dir")
    if not run_dir:
        raise ValueError("a cluster run needs run_dir=<path> fixed before submission (requeued jobs resume there)")
    return run_dir


def with_resume(overrides: list[str]) -> list[str]:
    """``overrides`` with ``resume=<run_dir>`` when ``run_dir`` holds a checkpoint, else unchanged."""
    from acer_torchrl.checkpoint import CheckpointError, latest_checkpoint

    run_dir = required_run_dir(overrides)
    try:
        latest_checkpoint(Path(run_dir))
    except CheckpointError:
        return list(overrides)
    return without_keys(overrides, "resume") + [f"resume={run_dir}"]


class RecipeJob(submitit.helpers.Checkpointable):
    """A recipe run as a submitit job; requeued on preemption, resuming from its ``run_dir``."""

    def __call__(self, recipe: str, overrides: list[str]) -> dict | None:
        from acer_torchrl import cli
        from acer_torchrl.collectors import RemoteCollection, serve_remote_collection

        warnings.filterwarnings("ignore", category=DeprecationWarning)  # as a recipe on the command line
        cli.quiet_libraries()  # (its log: TorchRL's INFO lines off)
        required_run_dir(overrides)
        remote = None
        if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
            rank, world_size, master_addr, port = job_rank_info()
            remote = RemoteCollection(master_addr, port, world_size - 1)
            if rank > 0:
                serve_remote_collection(rank, remote)  # until the learner shuts the collection down
                return None
        if requeued():
            overrides = with_resume(overrides)
        if os.environ.get("SUBMITIT_EXECUTOR") == "local":
            return run_stopping_on_signals(recipe, list(overrides))
        return cli.run(recipe, list(overrides), remote=remote)

    def checkpoint(self, recipe: str, overrides: list[str]) -> submitit.helpers.DelayedSubmission:
        return submitit.helpers.DelayedSubmission(self, recipe, with_resume(overrides))


def run_stopping_on_signals(recipe: str, overrides: list[str]) -> dict:
    """A local job's run: SIGINT / SIGTERM checkpoint it as they do a recipe on the command line
    (:class:`~acer_torchrl.processes.StopSignals`); the job's result then says where it stopped,
    ``{"interrupted": <the stop's one line>, "exit_code": 130 | 143}``, else it is the run's summary."""
    from acer_torchrl import cli
    from acer_torchrl.processes import Interrupted, StopSignals

    stops = StopSignals().install()
    try:
        return cli.run(recipe, overrides, stop_signals=stops)
    except Interrupted as stop:
        return {"interrupted": str(stop), "exit_code": stop.exit_code}
    finally:
        stops.restore()


def requeued() -> bool:
    """Whether this job is one SLURM restarted (``scontrol requeue``, node failure): it must resume."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0


def job_rank_info() -> tuple[int, int, str, int]:
    """``(rank, world_size, master_addr, master_port)`` of the calling task of a (multi-task) submitit job.

    The port is derived from the job id, so every task of one job agrees on it without talking.
    """
    dist = submitit.helpers.TorchDistributedEnvironment()
    return dist.rank, dist.world_size, dist.master_addr, dist.master_port
