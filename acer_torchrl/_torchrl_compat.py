"""Every use of a private TorchRL attribute in this package, in one place, and the helpers that make them.

The package pins ``torchrl>=0.14,<0.15`` and ``tensordict>=0.14,<0.15`` (``pyproject.toml``; tested:
``torchrl==0.14.1``, ``tensordict==0.14.3`` in ``constraints.txt``) because of the uses below. Before raising
the pin, check each one against the new TorchRL; ``tests/test_replay.py``, ``tests/test_collectors.py`` and
``tests/test_acer.py`` cover them. Other code should call the helpers here rather than reach into TorchRL.

1. ``TensorStorage._storage`` (the storage's TensorDict), through :func:`stored_tensordict`.
   Used by ``replay.py``: ``EpisodeReplay._index`` (gather only the loss's keys), ``_next_value`` (one column
   at successor slots, and from the ``episode_ends`` side storage), ``update`` (V-RACER's write-back of
   some keys at some slots), ``column`` (one key over the whole replay: ReF-ER's far-policy share) and
   ``save_rows`` (checkpoint the filled rows as a memory-mapped TensorDict).
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

5. ``TargetNetUpdater._sources`` / ``._targets`` and the ``target_<name>`` key pairing, through
   :func:`target_updater_params`. Used by ``objectives/updaters.py``: ``_FusedPairs._pairs`` (one fused
   ``torch._foreach_lerp_`` / ``_foreach_copy_`` over all parameters). Why: TorchRL's ``SoftUpdate.step`` /
   ``HardUpdate.step`` walk both TensorDicts key by key on every step (milliseconds a learner step on two
   CPU cores) and expose neither the parameter lists nor a fused step. Upstream behaviour: TorchRL 0.14's
   ``TargetNetUpdater`` builds, on first access, ``_sources`` (the loss's ``<name>_params``) and ``_targets``
   (its ``target_<name>_params``), the target of source key ``(name, ...)`` under ``("target_" + name, ...)``
   (``TargetNetUpdater.init_``); ``objectives/updaters.py`` caches its own lists under ``_pairs_val``.

Not TorchRL, noted for completeness: ``torch._foreach_lerp_`` / ``torch._foreach_copy_`` (the fused updates
above) are underscore-named torch functions, stable in practice (``torch.optim`` uses them) but not
documented API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensordict import TensorDictBase
    from torchrl.data import Storage
    from torchrl.data.replay_buffers.writers import Writer
    from torchrl.objectives.utils import TargetNetUpdater


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


def target_updater_params(updater: TargetNetUpdater) -> tuple[TensorDictBase, TensorDictBase]:
    """``(sources, targets)``: the parameters a TorchRL target updater copies from and into (use 5 above);
    the target of source key ``(name, ...)`` is ``("target_" + name, ...)`` in ``targets``."""
    return updater._sources, updater._targets
