"""Every use of a private TorchRL attribute or torch function in this package, in one place, and the helpers
that make them.

The package pins ``torchrl>=0.14,<0.15`` and ``tensordict>=0.14,<0.15`` (``pyproject.toml``; tested:
``torchrl==0.14.1``, ``tensordict==0.14.3`` in ``constraints.txt``) because of the uses below. Before raising
the pin, check each one against the new TorchRL; ``tests/test_replay.py``, ``tests/test_collectors.py`` and
``tests/test_acer.py`` cover them. Other code should call the helpers here rather than reach into TorchRL.

1. ``TensorStorage._storage`` (the storage's TensorDict), through :func:`stored_tensordict`.
   Used by ``replay.py``: ``EpisodeReplay._index`` (gather only the loss's keys), ``_next_value`` (one column
   at successor slots, and from the ``episode_ends`` side storage), ``update`` (V-RACER's write-back of
   some keys at some slots), ``column`` (one key over the whole replay: ReF-ER's far-policy share),
   ``save_rows`` (checkpoint the filled rows, one raw file per column) and ``load_rows`` (read them back into
   the storage's own memory).
   Why not the public API: ``Storage.get(index)`` returns every stored key (indexing costs time per key;
   a batch needs only the loss's ``in_keys``) and ``Storage.set(index, data)`` writes whole steps; there is
   no public access to one column or to a key subset. Upstream behaviour: TorchRL 0.14's
   ``LazyTensorStorage`` / ``LazyMemmapStorage`` keep all data in one TensorDict at ``_storage``.

2. ``RoundRobinWriter.load_state_dict({"_cursor": ..., "_write_count": ...})``, through
   :func:`set_write_position`. Used by ``replay.py``: ``EpisodeReplay.load`` (resume: the writer continues
   where the checkpointed replay stopped, so that eviction order is unchanged). Why not the public API:
   ``load_state_dict`` is public, but its keys are the writer's private attribute names, and the writer's
   own ``dumps``/``loads`` need a directory of its files. Upstream behaviour: TorchRL 0.14's
   ``RoundRobinWriter.state_dict`` returns ``{"_cursor", "_write_count"}`` (plus ``"_generation"`` when it
   tracks generations, which ours does not).

3. ``MultiAsyncCollector._queue_len`` (overridden property), in ``collectors.py``:
   ``MultiProcessCollector._queue_len``. Why: the output queue's size is not a constructor argument.
   Upstream behaviour: TorchRL 0.14 gives the multi-process collectors a one-slot output queue
   (``MultiCollector._run_processes``: ``ctx.Queue(self._queue_len)``, ``_queue_len`` = 1 for
   ``MultiAsyncCollector``); a worker whose ``put`` waits longer than ``torchrl.collectors._constants._TIMEOUT``
   (1 s) collects its next batch over the unsent one, so a busy learner loses env steps. One slot per
   worker makes every ``put`` succeed (``tests/test_collectors.py`` pauses the learner 1.5 s and loses
   nothing). ``tests/test_collectors.py`` also monkeypatches this property.

4. ``BaseCollector._weight_sync_schemes``, through :func:`weight_sync_schemes`. Used by ``collectors.py``:
   ``_ClosingCollector.shutdown`` (shut the schemes down before the workers). Why: the collector does not
   expose its schemes, and its ``shutdown()`` leaves them to ``__del__``. Upstream behaviour: in TorchRL 0.14
   a ``SharedMemWeightSyncScheme`` holds multiprocessing queues and a receiver thread in each worker; shut
   down from ``__del__`` during interpreter teardown it hangs the exit (``collectors.py``'s docstring).

5. ``torchrl.collectors.distributed.generic._distributed_init_delayed``, through
   :func:`serve_delayed_collection`. Used by ``collectors.py``: ``serve_remote_collection`` (a collector
   rank of a multi-node job). Why: ``DistributedCollector(launcher="submitit_delayed")`` is TorchRL's
   public mode for jobs whose nodes are allocated up front (the learner does not submit jobs of its own),
   but the function its other ranks must run is private. TorchRL's public ``submitit_delayed_launcher``
   submits it as separate single-node jobs; here it runs in the other tasks of one multi-node job, so that
   SLURM allocates, requeues and ends the learner and its collectors together.
   Upstream behaviour: TorchRL 0.14's ``_distributed_init_delayed(rank, backend, rank0_ip, tcpport,
   world_size)`` joins the ``torch.distributed`` group at ``tcp://rank0_ip:tcpport``, receives its
   collector's settings from rank 0 (``scatter_object_list``) and serves batches until told to shut down.

6. ``DistributedWeightSyncScheme._send_instruction("stop")``, through :func:`stop_weight_receivers`. Used
   by ``collectors.py``: ``RemoteCollector.shutdown`` (before the collector's own shutdown). Why: each remote
   rank applies weights in a background thread that blocks in ``TCPStore.get`` on the scheme's store;
   the scheme's ``shutdown()`` there only sets an event that thread reads between two gets, so the thread is
   still blocked when the learner's store closes, and the rank aborts at exit ("terminate called without an
   active exception"; SLURM marks the task failed). The "stop" instruction is what that loop ends on, and
   no public call sends it. Upstream behaviour: TorchRL 0.14's ``_background_receive_loop`` breaks on
   "stop"; a sender's ``send()`` waits for every rank's acknowledgement, so no update is in flight then.

7. ``DistributedCollector._next_async`` (overridden) and ``._store`` (the instruction store), through
   :func:`mark_remote_rank_busy`. Used by ``collectors.py``: ``RemoteCollector._next_async``. Why: in async
   mode the collector scans ranks 1..n for the status "done" and takes the first; a rank's status stays
   "done" after its batch was taken until the rank reads its next "continue", so the scan picks the same
   rank again and waits for its next batch while other ranks' batches are ready. Setting "busy" when the
   batch is taken is what the rank itself does a moment later. Upstream behaviour: TorchRL 0.14's
   ``_next_async(total_frames, trackers)`` returns ``(data, total_frames, ready_worker_idx)``; the status
   key is ``NODE_<rank>_status`` in ``_store``.

8. Not a private attribute but upstream behaviour that ``collectors.py``'s ``SharedWeightsScheme.send`` (the
   push of ``update_policy_weights_()``, overridden through public API: ``model`` and
   ``shared_transport.unique_weights``) relies on: a worker acts with the scheme's shared-memory tensors
   themselves, so writing them is the whole push and TorchRL's message and acknowledgement round trip to each
   worker (``benchmarks/results/weight_push.md``) can be left out. Upstream behaviour: TorchRL 0.14's
   ``SharedMemWeightSyncScheme._setup_connection_and_weights_on_receiver_impl`` puts the tensors it receives
   into the worker's policy with ``apply_weights(model, weights, inplace=False)``, and
   ``MultiCollector._setup_multi_policy_and_weights`` moves a CPU policy's own parameters to shared memory in
   place (``TensorDict.from_module(policy).share_memory_()``), from which the scheme's tensors are made.
   ``tests/test_collectors.py`` checks that workers act with the learner's weights bit for bit after a push.
9. ``torchrl._utils._ProcessNoWarnMixin.start`` (wrapped while a collector starts its workers), through
   :func:`collector_worker_starts`. Used by ``collectors.py``: ``MultiProcessCollector._run_processes`` (each
   worker starts with the learner's signals held, so that a Ctrl-C during its imports does not reach it, and
   the workers started so far are known when a signal interrupts the start). Why: the collector makes and starts
   its worker processes inside its constructor, with no hook around ``start()``. Upstream behaviour: TorchRL
   0.14's ``_run_processes`` starts every worker through a class of ``_make_process_no_warn_cls(ctx)``, each a
   subclass of ``_ProcessNoWarnMixin`` whose ``start()`` it calls.

Private torch functions (underscore-named, not documented API, but what ``torch.optim`` and
``torch.nn.utils.clip_grad_norm_`` run on: stable in practice; ``pyproject.toml`` gives torch no upper bound for
that reason). Each is looked up where it is used and has a public fallback taken where this torch lacks it;
``tests/test_torch_compat.py`` takes each away and checks the fallback's numbers.

T1. ``torch._foreach_lerp_`` and ``torch._foreach_copy_``, through :func:`foreach_lerp_` and
   :func:`foreach_copy_`. Used by ``objectives/updaters.py`` (ACER's average network, the target networks) and
   ``collectors.copy_weights_`` (the weight push). Why: one call for all parameters, where TorchRL's
   ``SoftUpdate`` / ``HardUpdate`` walk their TensorDicts key by key (milliseconds a learner step on two CPU
   cores; ``objectives/updaters.py``'s docstring).
   Upstream behaviour: the per-pair ``lerp_`` / ``copy_`` of each pair of lists, across devices for ``_foreach_copy_``.
   Fallbacks: ``Tensor.lerp_`` and ``Tensor.copy_`` per pair (the same bits on CPU).

T2. ``torch._foreach_norm``, ``torch._foreach_mul_``, ``torch._foreach_add_`` and ``torch._fused_adam_``, through
   :func:`has_update_kernels`. Used by ``optim.py``: ``DirectStep``. Why: the kernels of ``clip_grad_norm_`` and of
   ``torch.optim.Adam(fused=True)`` without the Python around them (``DirectStep``'s docstring).
   Upstream behaviour: ``clip_grad_norm_`` takes ``_foreach_norm(grads, 2.0)``, the 2-norm of their stack and
   ``_foreach_mul_(grads, clamp(max_norm / (norm + 1e-6), max=1))``; Adam's ``_fused_adam`` adds 1 to the ``step``
   tensors with ``_foreach_add_`` and calls ``_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
   steps, amsgrad=, lr=, beta1=, beta2=, weight_decay=, eps=, maximize=, grad_scale=, found_inf=)``;
   ``tests/test_optim.py`` compares both with torch's calls bit for bit. Fallback (any missing): torch's calls.

Noted for completeness: ``torch.ops.aten.softplus_backward`` (``algorithms/vracer.py``'s written-out backward)
is an ATen operator, public through ``torch.ops``, not an underscore-named function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from tensordict import TensorDictBase
    from torchrl.data import Storage
    from torchrl.data.replay_buffers.writers import Writer


def stored_tensordict(storage: Storage) -> TensorDictBase:
    """The TensorDict that holds every entry of a TorchRL tensor storage (use 1 above): index it, or
    ``.get(key)`` one column, without reading the other keys."""
    return storage._storage


def set_write_position(writer: Writer, cursor: int, write_count: int) -> None:
    """Put a ``RoundRobinWriter`` at slot ``cursor`` after ``write_count`` writes (use 2 above)."""
    writer.load_state_dict({"_cursor": cursor, "_write_count": write_count})


def weight_sync_schemes(collector: Any) -> dict[str, Any]:
    """A collector's weight-sync schemes by model id; empty when it has none (use 4 above)."""
    return getattr(collector, "_weight_sync_schemes", None) or {}


def stop_weight_receivers(collector: Any) -> None:
    """Tell the remote ranks' weight-receiving threads of a ``DistributedCollector`` to end (use 6 above)."""
    for scheme in weight_sync_schemes(collector).values():
        scheme._send_instruction("stop")


def mark_remote_rank_busy(collector: Any, rank: int) -> None:
    """Set remote rank ``rank``'s status to "busy" in a ``DistributedCollector``'s store (use 7 above)."""
    collector._store.set(f"NODE_{rank}_status", b"busy")


def serve_delayed_collection(rank: int, world_size: int, master_addr: str, port: int) -> None:
    """Serve as collector rank ``rank`` of a ``DistributedCollector(launcher="submitit_delayed")`` (use 5)."""
    from torchrl.collectors.distributed.generic import _distributed_init_delayed

    _distributed_init_delayed(rank, "gloo", master_addr, port, world_size)


@contextlib.contextmanager
def collector_worker_starts(around: Callable[[], contextlib.AbstractContextManager]):
    """While the block runs, every collector worker TorchRL starts is started inside ``around()`` (use 9);
    yields the list of the processes started so far (each added before ``around()`` ends)."""
    from torchrl._utils import _ProcessNoWarnMixin

    start, started = _ProcessNoWarnMixin.start, []

    def start_inside(process) -> None:
        with around():
            start(process)
            started.append(process)

    _ProcessNoWarnMixin.start = start_inside
    try:
        yield started
    finally:
        _ProcessNoWarnMixin.start = start


def has_update_kernels() -> bool:
    """Whether this torch has the kernels ``optim.DirectStep`` calls (T2)."""
    return all(hasattr(torch, name) for name in ("_foreach_norm", "_foreach_mul_", "_foreach_add_", "_fused_adam_"))


def foreach_lerp_(targets: list[torch.Tensor], sources: list[torch.Tensor], weight: float) -> None:
    """``target += weight (source - target)`` for each pair in place: ``torch._foreach_lerp_``, else ``Tensor.lerp_``
    per pair (T1)."""
    fused = getattr(torch, "_foreach_lerp_", None)
    if fused:
        fused(targets, sources, weight)
    else:
        for target, source in zip(targets, sources, strict=True):
            target.lerp_(source, weight)


def foreach_copy_(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """Copy each source into its destination in place: ``torch._foreach_copy_``, else ``Tensor.copy_`` per pair (T1)."""
    fused = getattr(torch, "_foreach_copy_", None)
    if fused:
        fused(destinations, sources)
    else:
        for destination, source in zip(destinations, sources, strict=True):
            destination.copy_(source)
