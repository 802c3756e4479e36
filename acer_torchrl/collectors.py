"""Collectors: worker processes that act in their envs while the learner trains.

:func:`make_collector` builds a ``torchrl.collectors.MultiAsyncCollector`` (``num_workers >= 1``) or the
single-process ``Collector`` (``num_workers == 0``, for debugging) with the same interface:

- iterate it for batches: one worker's ``frames_per_batch`` steps, ``[T]`` for an env with one game or
  ``[num_envs, T]`` for a batched env (``EnvConfig.num_envs > 1``), time last, trajectories continuing
  across batches. ``("collector", "traj_ids")`` numbers each trajectory (one env's episode, or the part
  of it since the collector started) uniquely across workers and envs;
- ``update_policy_weights_()`` makes every worker act with the current parameters of the policy it was given
  (shared memory, see :class:`SharedWeightsScheme`: the workers act with that policy's own CPU tensors, and the
  call writes nothing when they were trained in place);
- ``shutdown()`` (also ``close()``, or leaving a ``with`` block) stops the workers;
- a worker that dies (killed, crashed) ends the iteration with :class:`~acer_torchrl.processes.HelperDied` naming
  it, within a second while the learner waits for a batch, else at its next batch.

:func:`make_remote_collector` gives the same interface over collector processes on other nodes of a
multi-node SLURM job (TorchRL's ``DistributedCollector`` over ``torch.distributed``, see
:class:`RemoteCollection`); each of those processes runs :func:`serve_remote_collection`.

Acting happens on CPU: the policy handed to :func:`make_collector` must live there.

The exit hang. In torchrl 0.14 a multi-process collector that is not shut down hangs the interpreter at
exit: ``multiprocessing``'s exit handler joins worker processes that were never told to stop (the
collector's own ``__del__`` would only run later). Its weight-sync scheme also holds multiprocessing
queues and, in each worker, a thread waiting on them; left to ``__del__`` during interpreter teardown,
its ``shutdown()`` puts a "stop" message and joins the queue's feeder thread. So the collectors made here
(a) on ``shutdown()`` first shut down their weight-sync schemes (the workers' receiver threads stop while
everything is alive; a later ``__del__`` has nothing left to do), then their workers, and (b) register
with an ``atexit`` hook that runs before ``multiprocessing``'s and shuts down every collector still open.
``tests/test_collectors.py`` runs scripts in a subprocess that must exit, with or without ``close()``.
"""

from __future__ import annotations

import atexit
import multiprocessing.util  # noqa: F401  (registers its exit handler now: ours, registered below, runs first)
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Collector, MultiAsyncCollector
from torchrl.collectors.distributed import DistributedCollector
from torchrl.envs import EnvBase
from torchrl.weight_update import SharedMemWeightSyncScheme

from acer_torchrl._torchrl_compat import (
    collector_worker_starts,
    foreach_copy_,
    mark_remote_rank_busy,
    serve_delayed_collection,
    stop_weight_receivers,
    weight_sync_schemes,
)
from acer_torchrl.processes import HelperDied, died, ignore_learner_signals, learner_signals_held

WORKER_SEED_STRIDE = 1_000  # worker i's seeds start at seed + WORKER_SEED_STRIDE * i
REMOTE_TRAJ_STRIDE = 2**40  # remote rank r numbers its trajectories from r * REMOTE_TRAJ_STRIDE

_OPEN_COLLECTORS: weakref.WeakSet = weakref.WeakSet()


def _shutdown_open_collectors() -> None:
    for collector in list(_OPEN_COLLECTORS):
        collector.shutdown(raise_on_error=False)


# atexit runs handlers last-in first-out: this one before multiprocessing's, which joins the workers.
atexit.register(_shutdown_open_collectors)


class _ClosingCollector:
    """Mixin: ``close()``, context manager, weight-sync schemes shut down before the workers, atexit net."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _OPEN_COLLECTORS.add(self)

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        _OPEN_COLLECTORS.discard(self)
        try:
            for scheme in weight_sync_schemes(self).values():
                scheme.shutdown()
        finally:
            super().shutdown(timeout=timeout, close_env=close_env, raise_on_error=raise_on_error)

    def close(self) -> None:
        self.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()


def copy_weights_(destination: TensorDictBase, source: TensorDictBase) -> None:
    """Copy each tensor of ``source`` into ``destination``'s tensor of the same key, in place, in one fused copy
    (across devices too); a pair that already is one memory is left alone."""
    pairs = [(dst, source.get(key)) for key, dst in destination.items(True, True)]
    pairs = [(dst, src) for dst, src in pairs if dst.data_ptr() != src.data_ptr()]
    if pairs:
        with torch.no_grad():
            foreach_copy_([dst for dst, _ in pairs], [src for _, src in pairs])


class SharedWeightsScheme(SharedMemWeightSyncScheme):
    """TorchRL's shared-memory weight sync, whose push writes the shared weights and nothing else.

    Once a worker has started, its policy's parameters *are* the scheme's shared-memory tensors (TorchRL's
    receiver puts them into the policy with ``apply_weights(..., inplace=False)``): a worker acts with whatever
    they hold at its next policy call. For a CPU policy these tensors are the policy's own parameters (the
    collector moves them to shared memory in place, ``share_memory_()``), so a policy trained in place, or
    copied into in place, is what the workers act with, without a push. A policy call during the learner's
    optimiser step may see some tensors already updated: the behaviour statistics stored with that step are
    those of the weights it acted with, which is all the losses' importance weights need.

    TorchRL's ``send()`` still extracts the weights anew, copies them over the shared tensors (onto themselves,
    here), and sends each worker's receiver thread a message to apply the shared tensors (again onto
    themselves), then waits for every acknowledgement: milliseconds of the learner's time a push on loaded CPU
    cores (``benchmarks/results/weight_push.md``). Here ``update_policy_weights_()`` with no weights copies the
    collector's policy into the shared tensors where they are apart from it (nothing, for the policy handed to
    :func:`make_collector`), with one fused copy, and returns: the workers act with those weights from their
    next policy call. Explicit weights or ``worker_ids`` take TorchRL's path.
    """

    def send(self, weights: TensorDictBase | None = None, worker_ids: int | list[int] | None = None) -> None:
        if weights is not None or worker_ids is not None:
            super().send(weights, worker_ids)
            return
        source = TensorDict.from_module(self.model)
        for shared in self.shared_transport.unique_weights:
            copy_weights_(shared, source)


class MultiProcessCollector(_ClosingCollector, MultiAsyncCollector):
    """``MultiAsyncCollector`` that shuts down cleanly (see the module docstring) and never drops a batch.

    TorchRL 0.14 gives its workers a one-slot output queue. A worker whose batch is ready while another
    worker's batch still waits there (the learner is busy) tries ``put`` for ``_TIMEOUT`` (1 s, a module
    constant), then collects its next batch over the unsent one: those env steps are lost. A worker puts
    one batch and then waits for the learner's "continue", so one slot per worker is enough for every
    ``put`` to succeed at once. ``tests/test_collectors.py`` checks that a learner pausing for 1.5 s loses
    nothing.
    """

    def __init__(self, *args, **kwargs):
        # the learner's threads as the trainer set them (``trainer.learner_threads``: the cores the workers leave
        # free, or ``threads=``); left to itself TorchRL subtracts its workers from them again at the workers'
        # start (16 cores, 8 workers: a learner of 1 thread, not 8) and adds them back at shutdown
        self._learner_threads = torch.get_num_threads()
        super().__init__(*args, num_threads=self._learner_threads, **kwargs)

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        try:
            super().shutdown(timeout=timeout, close_env=close_env, raise_on_error=raise_on_error)
        finally:
            torch.set_num_threads(self._learner_threads)

    @property
    def _queue_len(self) -> int:  # a private TorchRL hook: acer_torchrl/_torchrl_compat.py, use 3
        return self.num_workers

    def iterator(self) -> Iterator[TensorDictBase]:
        """TorchRL's batches; a worker that died ends them with :class:`~acer_torchrl.processes.HelperDied`.

        TorchRL looks at its workers after every batch and every second without one; finding one dead, it sends
        the others SIGTERM (which they leave to the learner: ``processes.py``) and fails closing them while they
        run (``ValueError: Cannot close a process while it is still running``). That error, or any other while a
        worker is dead, is the death; the workers still alive are the learner's to shut down."""
        try:
            yield from super().iterator()
        except Exception:
            dead = dead_workers(self.procs)
            if not dead:
                raise
            raise HelperDied(", ".join(dead)) from None

    def _run_processes(self) -> None:
        """TorchRL's start of the workers, each with the learner's signals held (``processes.py``). A stop
        signal or Ctrl-C that interrupts it kills the workers started so far: TorchRL shuts them down only on an
        ``Exception``, and the interpreter's exit would wait for them (they ignore SIGINT / SIGTERM) for ever."""
        with collector_worker_starts(learner_signals_held) as started:
            try:
                super()._run_processes()
            except BaseException as err:
                if not isinstance(err, Exception):
                    for process in started:
                        process.kill()
                        process.join()
                raise


def dead_workers(procs: Sequence[multiprocessing.process.BaseProcess], wait_s: float = 2.0) -> list[str]:
    """The workers of ``procs`` that died, in words (:func:`~acer_torchrl.processes.died`); waits up to ``wait_s``
    for one to be found. A killed worker's pipes close as it exits, before the kernel reports its exit code: the
    learner's next message to it fails (``BrokenPipeError``) while its ``exitcode`` is still None, for a moment.
    Empty when none died within ``wait_s``: the error was not a death."""
    deadline = time.monotonic() + wait_s
    while True:
        dead = [died(f"collector worker {i}", p.pid, code) for i, p in enumerate(procs)
                if (code := _exit_code(p)) is not None]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.02)


def _exit_code(process: multiprocessing.process.BaseProcess) -> int | None:
    """A worker's exit code; None while it runs, and once closed (TorchRL closes only workers it stopped itself)."""
    try:
        return process.exitcode
    except ValueError:  # "process object is closed"
        return None


class InProcessCollector(_ClosingCollector, Collector):
    """Single-process ``Collector`` with the same ``close()`` / context-manager interface."""


@dataclass
class _WorkerEnv:
    """Env factory called in a worker process: seeds that process's torch and numpy RNGs (the acting
    policy samples with torch) and, when ``seed_env``, the env itself; a worker of the learner's
    (``learner_child``) leaves the learner's signals to it (a remote rank is a task of its own)."""

    create_env_fn: Callable[[], EnvBase]
    seed: int
    seed_env: bool
    learner_child: bool = True

    def __call__(self) -> EnvBase:
        if self.learner_child:
            ignore_learner_signals()
        torch.manual_seed(self.seed)
        np.random.seed(self.seed % 2**32)
        env = self.create_env_fn()
        if self.seed_env:
            env.set_seed(self.seed)
        return env


def make_collector(
    create_env_fn: Callable[[], EnvBase] | Sequence[Callable[[], EnvBase]],
    policy: TensorDictModuleBase,
    *,
    num_workers: int,
    frames_per_batch: int,
    total_frames: int = -1,
    seed: int = 0,
    env_device: str | torch.device = "cpu",
) -> MultiProcessCollector | InProcessCollector:
    """Collector over ``num_workers`` worker processes (``0``: in this process).

    Args:
        create_env_fn: one picklable env factory for every worker, or a list with one per worker (e.g.
            ``[make_env_fn(cfg, seed=s_i) for i ...]``). A single factory's envs are seeded here (worker i:
            ``seed + WORKER_SEED_STRIDE * i``); a list's factories seed their own envs.
        policy: the acting policy, a TensorDict module on CPU. Worker i's torch RNG is seeded with
            ``seed + WORKER_SEED_STRIDE * i``.
        num_workers: worker processes (``0``: the single-process debug collector).
        frames_per_batch: env steps in one yielded batch (one worker, all of its envs): a multiple of the
            env's ``num_envs`` (TorchRL rounds it up, with a warning, otherwise).
        total_frames: env steps after which iteration stops (``-1``: never).
        seed: base seed, see above.
        env_device: device of the envs' outputs.
    """
    if num_workers < 0:
        raise ValueError(f"collector.workers must be >= 0, got {num_workers}")
    devices = {p.device.type for p in policy.parameters()} | {b.device.type for b in policy.buffers()}
    if devices - {"cpu"}:
        raise ValueError(f"the acting policy must be on CPU (collectors act on CPU), got parameters on {sorted(devices)}")
    shared = not isinstance(create_env_fn, Sequence)
    env_fns = [create_env_fn] * max(num_workers, 1) if shared else list(create_env_fn)
    if len(env_fns) != max(num_workers, 1):
        raise ValueError(f"got {len(env_fns)} env factories for {num_workers} workers: pass one, or one per worker")
    common = {
        "frames_per_batch": frames_per_batch,
        "total_frames": total_frames,
        "env_device": env_device,
        "policy_device": "cpu",
        "storing_device": "cpu",
        # Our envs carry InitTracker and the caller passes the policy's primers: no automatic wrapping.
        "auto_register_policy_transforms": False,
    }
    if num_workers == 0:
        env = env_fns[0]()
        if shared:
            env.set_seed(seed)
        return InProcessCollector(env, policy, **common)
    workers = [_WorkerEnv(fn, seed + WORKER_SEED_STRIDE * i, shared) for i, fn in enumerate(env_fns)]
    return MultiProcessCollector(
        workers,
        policy,
        weight_sync_schemes={"policy": SharedWeightsScheme()},
        **common,
    )


@dataclass(frozen=True)
class RemoteCollection:
    """Where the collector processes of a multi-node job meet the learner: ``ranks`` processes (ranks 1 ..
    ``ranks`` of a ``torch.distributed`` group of ``ranks + 1``), the learner at ``master_addr``, which
    listens on ``port`` (process group), ``port + 1`` (TorchRL's instruction store) and ``port + 2`` (the
    weight-sync store)."""

    master_addr: str
    port: int
    ranks: int


@dataclass
class _OffsetTrajectoryIds:
    """Runs in remote rank ``rank``'s collector: its ``("collector", "traj_ids")`` count from
    ``rank * REMOTE_TRAJ_STRIDE``, unique across ranks (each rank's collector counts from 0; the replay
    links steps by these ids)."""

    rank: int

    def __call__(self, batch):
        batch.set_(("collector", "traj_ids"), batch.get(("collector", "traj_ids")) + self.rank * REMOTE_TRAJ_STRIDE)
        return batch


class RemoteCollector(_ClosingCollector, DistributedCollector):
    """TorchRL's ``DistributedCollector`` with the ``close()`` / context-manager interface of the others;
    its ``shutdown()`` ends the remote ranks' weight receivers first, so that they exit cleanly (TorchRL's
    own shutdown then stops the ranks, then its weight-sync schemes).

    A rank whose batch was taken is marked busy at once. TorchRL leaves its "done" status until the rank reads
    its next instruction, and takes the first rank it finds "done": the learner then waited for that rank's
    next batch while the others' batches were ready (rank 1 served, the others starved and their batches
    aged).

    TorchRL sets ``MASTER_ADDR`` / ``MASTER_PORT`` in this process's environment for its process group and leaves
    them there; a SLURM job submitted later from the same process would inherit them (sbatch exports the
    environment) and submitit would rendezvous on that port. ``shutdown()`` puts back what was there before."""

    RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")

    def __init__(self, *args, **kwargs):
        self._environment_before = {key: os.environ.get(key) for key in self.RENDEZVOUS}
        super().__init__(*args, **kwargs)

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        if self in _OPEN_COLLECTORS:  # not shut down yet
            _OPEN_COLLECTORS.discard(self)
            stop_weight_receivers(self)
        try:
            DistributedCollector.shutdown(self, timeout=timeout)  # its schemes after its ranks have exited
        finally:
            for key, value in self._environment_before.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _next_async(self, total_frames, trackers):
        data, total_frames, index = super()._next_async(total_frames, trackers)
        mark_remote_rank_busy(self, index + 1)
        return data, total_frames, index


def make_remote_collector(
    env_fns: Sequence[Callable[[], EnvBase]],
    policy: TensorDictModuleBase,
    remote: RemoteCollection,
    *,
    frames_per_batch: int,
    total_frames: int = -1,
    seed: int = 0,
    launcher: str = "submitit_delayed",
) -> RemoteCollector:
    """Collector over ``remote.ranks`` processes on other nodes, one env factory each (``env_fns``), with
    :func:`make_collector`'s interface: iterate it for one rank's ``frames_per_batch`` steps (ranks
    deliver asynchronously, each holding one batch until the learner has taken it), then
    ``update_policy_weights_()`` sends the learner policy's parameters to every rank (a background thread
    there applies them, also mid-batch, and acknowledges: the call returns once every rank has them).

    Each rank runs a single-process TorchRL ``Collector`` over its env (``env.num_envs`` games); rank
    ``r``'s torch and numpy RNGs are seeded with ``seed + WORKER_SEED_STRIDE * r``. The processes must be
    running :func:`serve_remote_collection` (``launcher="submitit_delayed"``: the other tasks of the SLURM
    job, see ``acer_torchrl/cluster.py``); ``launcher="mp"`` starts them here as local processes (tests).
    """
    if len(env_fns) != remote.ranks:
        raise ValueError(f"got {len(env_fns)} env factories for {remote.ranks} remote collector ranks")
    per_rank = [{"auto_register_policy_transforms": False, "postproc": _OffsetTrajectoryIds(r + 1)} for r in range(remote.ranks)]
    # TorchRL builds rank 1's env here too (one batch, for the layout of the batches to receive): its factory
    # seeds this process's RNGs, which the learner's own draws must not see
    numpy_state = np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        collector = RemoteCollector(
            [_WorkerEnv(fn, seed + WORKER_SEED_STRIDE * (r + 1), False, learner_child=False) for r, fn in enumerate(env_fns)],
            policy,
            frames_per_batch=frames_per_batch,
            total_frames=total_frames if total_frames >= 0 else sys.maxsize,  # TorchRL's -1 (never) stops at once
            env_device="cpu",
            policy_device="cpu",
            storing_device="cpu",
            collector_class=Collector,
            collector_kwargs=per_rank,
            launcher=launcher,
            tcp_port=remote.port,
        )
    np.random.set_state(numpy_state)
    return collector


def serve_remote_collection(rank: int, remote: RemoteCollection) -> None:
    """Run collector rank ``rank`` (1 .. ``remote.ranks``) of a multi-node job until the learner shuts the
    collection down: join the learner's process group, receive the env factory, policy and settings from it,
    collect and send batches, apply the weights it sends (TorchRL's delayed-launch node, see
    ``acer_torchrl/_torchrl_compat.py``)."""
    serve_delayed_collection(rank, remote.ranks + 1, remote.master_addr, remote.port)
