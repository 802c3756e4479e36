"""Episode-aligned experience replay on TorchRL's ``TensorDictReplayBuffer``.

Steps arrive from the collectors in chunks, one contiguous run of steps per trajectory, interleaved across
workers and envs. Each step lands in one slot of a ring-buffer storage (``LazyTensorStorage``, or
``LazyMemmapStorage`` for large Atari buffers). Beside the storage, per-slot links record the episode a slot
belongs to, its position in that episode and the slots of the previous / next step, so that

* sequences ``[B, T]`` are gathered by following ``next`` links and never cross an episode boundary
  (a sequence reaching its episode's last stored step is padded; ``"mask"`` marks the real steps);
* the oldest episodes are evicted whole: when the writer overwrites any step of an episode, the episode's
  remaining steps stop being sampled at once (no half episodes are ever seen);
* the recurrent state at a sequence's first step can be recomputed exactly by unrolling the *current*
  network from its episode's first step (LASER App. A.2; :meth:`EpisodeReplay.refresh_recurrent_state`);
* an observation is stored once: ``("next", "observation")`` of a step is read from its successor's
  ``"observation"``; only the last step of each collected chunk (an episode's end, or the newest step of a
  trajectory still running) keeps its own next observation, in a small side storage (``episode_ends``).
  Stacked Atari observations (``frame_stack``) go further: each frame is stored once, in a ring of single
  frames (:class:`~acer_torchrl.frame_store.FrameStore`), and a step costs one uint8 frame, not ``2k``;
* a trajectory is never linked across steps that did not arrive. TorchRL 0.14's ``MultiAsyncCollector``
  drops a worker's batch when its one-slot output queue stays full for a second (a busy learner: the worker
  collects its next batch over the unsent one); ours has a slot per worker and drops nothing
  (:class:`~acer_torchrl.collectors.MultiProcessCollector`), but any other collector may. The env's
  ``step_count`` shows a gap; the trajectory is cut there (its last stored step becomes a window end, like a
  trajectory still running) and the skipped steps are counted in ``steps_missing``.

Loops here run over time (sequence length, episode prefix) or over the few trajectories of one collected
batch, never over the elements of a training batch.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, Storage, TensorDictReplayBuffer

from acer_torchrl._torchrl_compat import set_write_position, stored_tensordict
from acer_torchrl.checkpoint import read_tensor, write_tensor
from acer_torchrl.frame_store import FrameStore, frame_capacity
from acer_torchrl.objectives.names import MASK_KEY, PRIORITY_WEIGHT_KEY, SLOT_KEY, WRITE_KEY
from acer_torchrl.priority_tree import SequencePriorities
from acer_torchrl.settings import FRESH_BATCHES_KEPT
from acer_torchrl.validation import ConfigError

TRAJ_KEY = ("collector", "traj_ids")
STEP_KEY = "step_count"  # the env's step counter (TorchRL's StepCounter): finds steps the collectors dropped
_LINKS = ("episode", "position", "prev", "next", "first", "alive", "end_entry")
SUCCESSOR_KEYS = ("observation",)  # keys whose ("next", key) is the successor step's key: stored once
FRAMES_KEY = "observation"  # the key a frame store keeps as single frames (when the replay has one)
LINK_BYTES = 6 * 8 + 1  # the per-slot links: six int64 and one bool
COLUMNS = "columns.json"  # beside a saved storage's column files: their keys, dtypes and shapes


def write_index(slots: torch.Tensor | np.ndarray, written: int, capacity: int) -> torch.Tensor | np.ndarray:
    """Which write put the step now in each of ``slots`` there, after ``written`` round-robin writes: the last
    ``w < written`` with ``w mod capacity == slot`` (``-1``: never written)."""
    return slots + capacity * ((written - 1 - slots) // capacity)  # torch or NumPy integers


class EpisodeLinks(NamedTuple):
    """How a replay's slots form episodes, all ``[capacity]``."""

    alive: torch.Tensor  # bool: the slot holds a sampleable step
    episode: torch.Tensor  # int64: episode id of the slot
    position: torch.Tensor  # int64: step index of the slot inside its episode
    next: torch.Tensor  # int64: slot of the episode's next step, -1 at its last stored step


class EpisodeStore(Protocol):
    """What stored estimates read of a replay (:class:`~acer_torchrl.replay.EpisodeReplay` is
    one, a sweep agent's view of the shared replay another): its size and write counter, its episode links
    and its stored steps."""

    capacity: int
    steps_written: int  # steps ever written, round robin: step w went to slot w % capacity

    def episode_links(self) -> tuple[int, EpisodeLinks]:
        """``steps_written`` and the links after those writes, taken together (other writers may go on)."""
        ...

    def gather(
        self, idx: torch.Tensor, keys: list[NestedKey] | None = None, device: torch.device | None = None
    ) -> TensorDictBase: ...


def available_memory() -> int | None:
    """Bytes of RAM the kernel can still hand out (``MemAvailable`` of ``/proc/meminfo``); None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _rows(stored: torch.Tensor | TensorDictBase, idx: torch.Tensor) -> torch.Tensor | TensorDictBase:
    """The rows ``idx`` of a stored column (a regular tensor even from a memory-mapped one), or of a sub-TensorDict."""
    return stored.index_select(0, idx) if isinstance(stored, torch.Tensor) else stored[idx]


def check_memory(capacity: int, nbytes: int, what: str) -> None:
    """A one-line :class:`ConfigError` when ``nbytes`` (``what`` of a replay of ``capacity`` steps) exceed the
    available memory: an allocation that large gets the process killed by the kernel, with no message."""
    available = available_memory()
    if available is not None and nbytes > available:
        raise ConfigError(
            f"replay.capacity={capacity}: {what} need {nbytes / 2**30:.1f} GiB of memory, {available / 2**30:.1f} GiB "
            "are available; lower replay.capacity (or set replay.memmap=true for large observations)"
        )


def as_rows(batch: TensorDictBase) -> TensorDictBase:
    """A collected batch as ``[n_trajectory_rows, T]`` (one row per env, time last)."""
    if batch.ndim == 1:
        return batch.unsqueeze(0)
    return batch.reshape(-1, batch.shape[-1])


class Replay(Protocol):
    """What the trainer and the losses' hooks use of a replay: :class:`EpisodeReplay` is one, the sweep's
    per-agent view of a shared replay (:class:`~acer_torchrl.shared_replay.AgentReplay`) another.

    Steps are written as collected (``extend`` returns their slots) and read back as ``[B, T]`` sequences
    that never cross an episode boundary (``"mask"`` marks the real steps, ``"slot"`` their slots) or as
    single steps. A loss that keeps estimates per stored step (V-RACER) also reads ``capacity``,
    ``steps_written``, ``episode_links`` and ``gather``
    (:class:`EpisodeStore`).
    """

    steps_missing: int  # env steps the collectors ran but never delivered

    def __len__(self) -> int: ...

    @property
    def num_episodes(self) -> int: ...  # episodes with a step stored (a shared replay's: every agent's)

    def extend(self, batch: TensorDictBase) -> torch.Tensor: ...

    def sample_sequences(
        self, batch_size: int, seq_len: int, keys: list[NestedKey] | None = None, device: torch.device | None = None
    ) -> TensorDictBase: ...  # on ``device`` when given (the learner's)

    def sample_steps(self, batch_size: int, keys: list[NestedKey] | None = None) -> TensorDictBase: ...

    def refresh_recurrent_state(
        self, sample: TensorDictBase, unroll: TensorDictModuleBase, hidden_keys: list[str]
    ) -> None: ...

    def zero_recurrent_state(self, sample: TensorDictBase, hidden_keys: list[str]) -> None: ...

    def save(self, path: Path) -> dict[str, dict] | None: ...  # the manifest entries of the files it wrote, if known

    def load(self, path: Path) -> None: ...


class EpisodeReplay:
    """Whole-episode FIFO replay sampling sequences or single steps.

    Args:
        capacity: steps held.
        scratch_dir: when given, memory-mapped storage in that directory (RAM stays small for Atari).
        seed: sampling seed.
        frame_stack: ``k > 1`` when ``"observation"`` is a stack of the last ``k`` frames (Atari): its frames
            are stored once each (:class:`~acer_torchrl.frame_store.FrameStore`).
        priorities: prioritized sequence replay (Reactor ICLR sec. 3.3): sequences start where these priorities
            draw them (:class:`~acer_torchrl.priority_tree.SequencePriorities`), each batch with its importance
            weights and the writes it was drawn from (:meth:`update_priorities` gives the trained windows their
            priorities); None: uniform starts.
    """

    def __init__(
        self,
        capacity: int,
        *,
        scratch_dir: str | Path | None = None,
        seed: int = 0,
        frame_stack: int = 1,
        priorities: SequencePriorities | None = None,
    ):
        self.capacity = capacity
        self.priorities = priorities
        self.in_memory = scratch_dir is None
        check_memory(capacity, capacity * LINK_BYTES, "its episode links")

        def storage(subdir: str | None = None, size: int = capacity):
            if scratch_dir is None:
                return LazyTensorStorage(size)
            # existsok: a resumed run writes over the files its killed predecessor left (the checkpoint has its own)
            path = Path(scratch_dir, subdir) if subdir else Path(scratch_dir)
            return LazyMemmapStorage(size, scratch_dir=str(path), existsok=True)

        self.buffer = TensorDictReplayBuffer(storage=storage())
        # next observations of chunk ends, a ring written in slot order (its entries are only touched when
        # written: far fewer than `capacity`, the memory-mapped file stays sparse)
        self.episode_ends = storage("episode_ends")
        self.end_entries_written = 0
        self.successor_keys: tuple[str, ...] | None = None  # fixed by the first batch (or a loaded replay)
        self.frames = (
            FrameStore(capacity, frame_stack, storage("frames", frame_capacity(capacity, frame_stack)))
            if frame_stack > 1 else None
        )
        self.generator = torch.Generator().manual_seed(seed)
        long = dict(dtype=torch.long)
        self.episode = torch.full((capacity,), -1, **long)  # episode id of each slot
        self.position = torch.zeros(capacity, **long)  # step index of the slot inside its episode
        self.prev = torch.full((capacity,), -1, **long)
        self.next = torch.full((capacity,), -1, **long)
        self.first = torch.full((capacity,), -1, **long)  # slot of the episode's first stored step
        self.alive = torch.zeros(capacity, dtype=torch.bool)
        self.end_entry = torch.full((capacity,), -1, **long)  # entry of `episode_ends` holding the slot's next obs
        self.episodes_started = 0
        self.steps_written = 0
        # trajectory id -> (episode id, slot of its last stored step, steps stored so far, its step_count)
        self._open: dict[int, tuple[int, int, int, int]] = {}
        self.steps_missing = 0  # env steps the collectors ran but never delivered (seen as step_count gaps)
        self._alive_slots: torch.Tensor | None = None

    # ------------------------------------------------------------------ writing
    def __len__(self) -> int:
        return self.alive_slots().numel()

    @property
    def num_episodes(self) -> int:
        return int(self.episode[self.alive].unique().numel())

    def extend(self, batch: TensorDictBase) -> torch.Tensor:
        """Store a collected batch (``[T]`` or ``[n_envs, T]``); returns the slots written, row-major."""
        rows = as_rows(batch)
        traj = rows.get(TRAJ_KEY)
        done = rows.get(("next", "done")).reshape(traj.shape)
        flat = rows.reshape(-1)
        n_rows, T = traj.shape
        if flat.numel() > self.capacity:
            raise ValueError(f"a collected batch of {flat.numel()} steps exceeds replay.capacity={self.capacity}")
        stacked = (FRAMES_KEY, ("next", FRAMES_KEY)) if self.frames is not None else ()
        if self.steps_written == 0:
            self._check_first_batch(flat, stacked)
        # slots the round-robin writer will use: evict the episodes living there first
        start = self.steps_written % self.capacity
        slots = (start + torch.arange(flat.numel())) % self.capacity
        alive_before = self.alive.clone() if self.priorities is not None else None
        self._evict(slots)
        if self.successor_keys is None:
            stored = set(flat.keys(True)) - set(stacked)
            self.successor_keys = tuple(k for k in SUCCESSOR_KEYS if k in stored and ("next", k) in stored)
        written = self.buffer.extend(flat.exclude(*stacked, *[("next", k) for k in self.successor_keys]))
        assert torch.equal(written.reshape(-1), slots), "replay writer is not round robin"
        self.steps_written += flat.numel()

        # chunk boundaries: a new trajectory id, or a new row
        traj_flat = traj.reshape(-1)
        new_chunk = torch.ones_like(traj_flat, dtype=torch.bool)
        new_chunk[1:] = traj_flat[1:] != traj_flat[:-1]
        new_chunk[::T] = True
        starts = new_chunk.nonzero().squeeze(-1).tolist() + [traj_flat.numel()]
        done_flat = done.reshape(-1)
        step_count = rows.get(STEP_KEY, None)
        step_count = step_count.reshape(-1).tolist() if step_count is not None else None
        continues: list[int | None] = []  # per chunk: the slot it continues from (None: a trajectory's start)
        for a, b in zip(starts[:-1], starts[1:]):  # one iteration per trajectory chunk
            tid = int(traj_flat[a])
            chunk = slots[a:b]
            expected = self._open[tid][3] + 1 if tid in self._open else 0  # step_count of the chunk's first step
            if step_count is not None and step_count[a] != expected:
                # the collector dropped steps of this trajectory: cut it there, never link across the gap
                self.steps_missing += max(step_count[a] - expected, 0)
                self._open.pop(tid, None)
            continues.append(self._open[tid][1] if tid in self._open else None)
            if tid in self._open:
                ep, last, count, _ = self._open[tid]
                alive = bool(self.alive[last]) and int(self.episode[last]) == ep
                first = int(self.first[last])
                if alive:
                    self.next[last] = chunk[0]
                    self.prev[chunk[0]] = last
            else:
                ep, count, alive, first = self.episodes_started, 0, True, int(chunk[0])
                self.episodes_started += 1
                self.prev[chunk[0]] = -1
            n = b - a
            self.episode[chunk] = ep
            self.position[chunk] = count + torch.arange(n)
            self.first[chunk] = first
            self.prev[chunk[1:]] = chunk[:-1]
            self.next[chunk[:-1]] = chunk[1:]
            self.next[chunk[-1]] = -1
            self.alive[chunk] = alive
            if bool(done_flat[b - 1]):
                self._open.pop(tid, None)
            else:
                self._open[tid] = (ep, int(chunk[-1]), count + n, step_count[b - 1] if step_count is not None else -1)
        self._store_chunk_ends(flat, slots, torch.tensor(starts[1:]) - 1)
        if self.frames is not None:
            self._store_frames(flat, slots, starts, continues)
        self._alive_slots = None
        if alive_before is not None:  # written and evicted windows lose their priority
            evicted = (alive_before & ~self.alive).nonzero().squeeze(-1)
            self.priorities.forget(torch.cat([slots, evicted]), self.alive)
        return slots

    def _check_first_batch(self, flat: TensorDictBase, stacked: tuple) -> None:
        """Before the first write: the observations fit the frame store, and the replay fits in memory."""
        if self.frames is not None:
            self.frames.check(flat.get(FRAMES_KEY))
        if not self.in_memory:
            return
        step_bytes = sum(flat.get(k)[0].numel() * flat.get(k).element_size() for k in flat.keys(True, True)
                         if k not in stacked)
        nbytes = self.capacity * step_bytes
        if self.frames is not None:
            nbytes += self.frames.nbytes(flat.get(FRAMES_KEY))
        check_memory(self.capacity, nbytes, f"its steps ({nbytes // self.capacity} bytes each)")

    def _store_frames(self, flat: TensorDictBase, slots: torch.Tensor, starts: list[int], continues: list) -> None:
        """The batch's frames into the frame store; episodes whose frames its ring overwrote are evicted, as for
        step slots."""
        chunks = [(a, b, last) for a, b, last in zip(starts[:-1], starts[1:], continues)]
        victims = self.frames.store(flat.get(FRAMES_KEY), flat.get(("next", FRAMES_KEY)), slots, self.episode[slots], chunks)
        if victims.numel():
            self.alive &= ~torch.isin(self.episode, victims)

    def _store_chunk_ends(self, flat: TensorDictBase, slots: torch.Tensor, ends: torch.Tensor) -> None:
        """Keep the next observation of each chunk's last step (batch positions ``ends``): it has no
        successor stored yet (a running trajectory), or never will (an episode's end)."""
        self.end_entry[slots] = -1
        if not self.successor_keys:
            return
        # the ring never overwrites a live entry: it advances at most once per step written
        entries = (self.end_entries_written + torch.arange(ends.numel())) % self.capacity
        self.episode_ends.set(entries, flat[ends].select(*[("next", k) for k in self.successor_keys]))
        self.end_entry[slots[ends]] = entries
        self.end_entries_written += ends.numel()

    def _evict(self, slots: torch.Tensor) -> None:
        """Kill every episode that has a step in ``slots`` (whole-episode FIFO eviction)."""
        victims = self.episode[slots][self.alive[slots]].unique()
        if victims.numel():
            self.alive &= ~torch.isin(self.episode, victims)
            self._alive_slots = None

    # ------------------------------------------------------------------ reading
    def alive_slots(self) -> torch.Tensor:
        """The slots of the stored (sampleable) steps, ascending; kept until the next write."""
        if self._alive_slots is None:  # only the written slots can be alive: a large replay not yet full costs no more
            self._alive_slots = self.alive[: min(self.steps_written, self.capacity)].nonzero().squeeze(-1)
        return self._alive_slots

    def _stored_slots(self) -> torch.Tensor:
        """:meth:`alive_slots`, refused when there are none."""
        alive = self.alive_slots()
        if alive.numel() == 0:
            raise RuntimeError("cannot sample from an empty replay")
        return alive

    def _sample_starts(self, n: int) -> torch.Tensor:
        alive = self._stored_slots()
        return alive[torch.randint(alive.numel(), (n,), generator=self.generator)]

    def _sample_prioritized(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` window starts drawn by the priorities and their importance weights."""
        alive = self._stored_slots()
        starts = self.priorities.sample(n, alive, self.alive, self.generator)
        return starts, self.priorities.importance_weights(starts, self.alive, alive.numel())

    def update_priorities(self, sample: TensorDictBase, priority: torch.Tensor) -> None:
        """Give the windows of a prioritized ``sample`` (``[B, T]``, as :meth:`sample_sequences` drew it) their new
        priorities (``[B]``, the loss's mean absolute TD error): only windows still stored as they were drawn (rows
        of online data, and windows written over or evicted since, are left out)."""
        write = sample.get(WRITE_KEY)[:, 0].cpu()
        slot = write % self.capacity
        kept = (write >= 0) & (write_index(slot, self.steps_written, self.capacity) == write) & self.alive[slot]
        self.priorities.assign(slot[kept], priority.detach().cpu()[kept], self.alive)

    def follow(self, starts: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots of ``length`` consecutive steps from ``starts`` within their episodes, and their mask.

        Past an episode's last stored step the slot repeats and the mask is False.
        """
        links = self.next.numpy()  # NumPy on the same memory: on a batch of 32 a NumPy call costs less than torch's
        idx = np.empty((starts.numel(), length), dtype=np.int64)
        mask = np.empty((starts.numel(), length), dtype=bool)
        idx[:, 0], mask[:, 0] = starts.numpy(), True
        for j in range(1, length):  # loop over time, vectorised over the batch
            nxt = links[idx[:, j - 1]]
            mask[:, j] = mask[:, j - 1] & (nxt >= 0)
            idx[:, j] = np.where(mask[:, j], nxt, idx[:, j - 1])
        return torch.from_numpy(idx), torch.from_numpy(mask)

    def gather(
        self, idx: torch.Tensor, keys: list[NestedKey] | None = None, device: torch.device | None = None
    ) -> TensorDictBase:
        """Stored steps at slots ``idx`` (any shape), with their slot numbers under ``"slot"``; only
        ``keys`` (those stored) when given: indexing costs time per stored key. On ``device`` when given: stacked
        frames travel as distinct frames (:meth:`FrameStore.gather <acer_torchrl.frame_store.FrameStore.gather>`)."""
        data = self._index(idx.reshape(-1), keys, device).reshape(idx.shape)
        data.set(SLOT_KEY, idx)
        return data

    def _index(
        self, flat_idx: torch.Tensor, keys: list[NestedKey] | None, device: torch.device | None = None
    ) -> TensorDictBase:
        """Stored steps at 1-D ``flat_idx``; only ``keys`` (those stored) when given; on ``device`` when given."""
        rebuilt = [k for k in self.successor_keys or () if keys is None or ("next", k) in keys]
        stacks = self._stacks(flat_idx, keys, device) if self.frames is not None else {}
        if keys is None:
            data = self.buffer.storage.get(flat_idx)
        else:  # one index_select per stored column: a third of the time TensorDict's own indexing takes
            stored = stored_tensordict(self.buffer.storage)
            data = TensorDict(
                {key: _rows(stored.get(key), flat_idx) for key in keys if key in stored.keys(True)},
                batch_size=flat_idx.shape,
                device=stored.device,
            )
        for key in rebuilt:
            data.set(("next", key), self._next_value(key, flat_idx))
        if device is not None and data.device != torch.device(device):
            data = data.to(device)
        for key, value in stacks.items():
            data.set(key, value)
        return data

    def _stacks(
        self, flat_idx: torch.Tensor, keys: list[NestedKey] | None, device: torch.device | None
    ) -> dict[NestedKey, torch.Tensor]:
        """The stacked observations of ``keys`` (all when None) at ``flat_idx``, from the frame store."""
        current = keys is None or FRAMES_KEY in keys
        following = keys is None or ("next", FRAMES_KEY) in keys
        if not (current or following):
            return {}
        observation, following_obs = self.frames.gather(flat_idx, current, following, device)
        return {k: v for k, v in ((FRAMES_KEY, observation), (("next", FRAMES_KEY), following_obs)) if v is not None}

    def _next_value(self, key: str, flat_idx: torch.Tensor) -> torch.Tensor:
        """``("next", key)`` at stored steps: the successor's ``key``, or the chunk end's own copy."""
        successor = self.next[flat_idx]
        has_successor = successor >= 0
        values = _rows(stored_tensordict(self.buffer.storage).get(key), torch.where(has_successor, successor, flat_idx))
        if not bool(has_successor.all()):
            entry = self.end_entry[flat_idx[~has_successor]]
            if bool((entry < 0).any()):
                raise RuntimeError("replay: a step with neither a successor nor a stored next observation")
            values[~has_successor] = stored_tensordict(self.episode_ends).get(("next", key))[entry]
        return values

    def sample_sequences(
        self, batch_size: int, seq_len: int, keys: list[NestedKey] | None = None, device: torch.device | None = None
    ) -> TensorDictBase:
        """``[batch_size, seq_len]`` sequences starting at uniformly drawn stored steps (prioritized: drawn by the
        priorities, with each window's importance weight under ``"priority_weight"`` and each step's write under
        ``"write_index"``); only ``keys`` when given; on ``device`` when given."""
        if self.priorities is None:
            starts, weight = self._sample_starts(batch_size), None
        else:
            starts, weight = self._sample_prioritized(batch_size)
        idx, mask = self.follow(starts, seq_len)
        data = self.gather(idx, keys, device)
        data.set(MASK_KEY, mask)
        if weight is not None:
            data.set(PRIORITY_WEIGHT_KEY, weight.unsqueeze(-1).expand(idx.shape).to(data.device))
            data.set(WRITE_KEY, write_index(idx, self.steps_written, self.capacity).to(data.device))
        return data

    def sample_steps(self, batch_size: int, keys: list[NestedKey] | None = None) -> TensorDictBase:
        """``[batch_size]`` single steps drawn uniformly (V-RACER's single-step replay); only ``keys`` when
        given. Each with the write that stored it (``"write_index"``): a reader that looks at the replay again
        later (a sweep agent, while the others write) can tell a step since replaced in its slot."""
        sample = self.gather(self._sample_starts(batch_size), keys)
        sample.set(WRITE_KEY, write_index(sample.get(SLOT_KEY), self.steps_written, self.capacity))
        return sample

    def episode_slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """All stored steps of the episodes of ``slots``: ``[N, L]`` slots (from each episode's first
        stored step, L the longest of those episodes) and their mask."""
        firsts = self.first[slots]
        length = int(self._episode_length(firsts).max()) if slots.numel() else 0
        return self.follow(firsts, max(length, 1))

    def _episode_length(self, firsts: torch.Tensor) -> torch.Tensor:
        alive = self.alive & (self.first >= 0)
        counts = torch.zeros(self.capacity, dtype=torch.long)
        counts.index_add_(0, self.first[alive], torch.ones_like(self.first[alive]))
        return counts[firsts]

    def episode_links(self) -> tuple[int, EpisodeLinks]:
        """``steps_written`` and how the slots form episodes (the replay's own tensors: the next write changes them)."""
        return self.steps_written, EpisodeLinks(self.alive, self.episode, self.position, self.next)

    def column(self, key, alive_only: bool = True) -> torch.Tensor:
        """One stored key over the replay (statistics over the whole replay, e.g. the sweep's per-agent counts)."""
        values = stored_tensordict(self.buffer.storage).get(key)[: min(self.steps_written, self.capacity)]
        if alive_only:
            values = values[self.alive[: values.shape[0]]]
        return values

    # ------------------------------------------------------------------ recurrent state
    @torch.no_grad()
    def refresh_recurrent_state(
        self, sample: TensorDictBase, unroll: TensorDictModuleBase, hidden_keys: list[str]
    ) -> None:
        """Replace the state at each sequence's first step by the current network's (LASER App. A.2).

        For a sequence starting k steps into its episode, ``unroll`` (the recurrent torso in sequence mode)
        runs over the episode's first k steps from a zero state; the state after them is written into
        ``sample[:, 0][hidden_keys]``. Sequences starting at an episode's first step get the zero state.
        Prefixes of different lengths are right-aligned in one ``[B, k_max]`` batch; ``is_init`` at each
        episode's first step resets the state, so the padding in front of it has no effect.
        """
        prefix, k = self.recurrent_prefix(sample.get(SLOT_KEY)[:, 0], hidden_keys)
        refresh_from_prefix(sample, prefix, k, unroll, hidden_keys)

    def recurrent_prefix(self, starts: torch.Tensor, hidden_keys: list[str]) -> tuple[TensorDictBase | None, torch.Tensor]:
        """The stored steps of each start's episode before it, for :func:`refresh_from_prefix`.

        Returns ``(prefix, k)``: ``k`` the number of such steps per start and ``prefix`` the
        ``[len(starts), max k]`` steps (``observation`` and zeroed ``hidden_keys``), right-aligned, with
        ``is_init`` at each episode's first step; ``None`` when every start is an episode's first step.
        """
        k = self.position[starts]  # steps of the episode stored before the sequence's start
        k_max = int(k.max())
        if k_max == 0:
            return None, k
        idx = torch.empty(starts.numel(), k_max, dtype=torch.long)
        idx[:, -1] = torch.where(k > 0, self.prev[starts], starts)
        for j in range(k_max - 1, 0, -1):  # walk back in time, vectorised over the batch
            prev = self.prev[idx[:, j]]
            idx[:, j - 1] = torch.where(prev >= 0, prev, idx[:, j])
        prefix = self._index(idx.reshape(-1), ["observation", *hidden_keys]).reshape(idx.shape)
        is_init = torch.zeros(starts.numel(), k_max, 1, dtype=torch.bool)
        first_col = (k_max - k).clamp(max=k_max - 1)
        is_init[torch.arange(starts.numel()), first_col] = True
        prefix.set("is_init", is_init)
        for key in hidden_keys:
            prefix.get(key).zero_()
        return prefix, k

    def zero_recurrent_state(self, sample: TensorDictBase, hidden_keys: list[str]) -> None:
        """The paper-style reset (Reactor): every sequence starts from the zero state."""
        for key in hidden_keys:
            sample.get(key)[:, 0] = 0.0

    # ------------------------------------------------------------------ persistence
    def saved_bytes(self) -> int:
        """About the bytes :meth:`save` writes (filled rows, episode ends, links): what a checkpoint makes sure
        the disk has free before it starts writing."""
        filled = min(self.steps_written, self.capacity)
        rows = stored_tensordict(self.buffer.storage)[:filled].bytes() if filled else 0
        ends = min(self.end_entries_written, self.capacity)
        ends_bytes = stored_tensordict(self.episode_ends)[:ends].bytes() if self.successor_keys and ends else 0
        frames = self.frames.saved_bytes() if self.frames is not None else 0
        return rows + ends_bytes + frames + filled * LINK_BYTES

    def save(self, path: Path) -> dict[str, dict]:
        """Write the replay under ``path``: the filled slots (:func:`save_rows`), the links and counters.
        Returns the manifest entries (size, CRC-32) of the row files, by path relative to ``path``."""
        path.mkdir(parents=True, exist_ok=True)
        checksums = {}
        if self.steps_written:  # only the filled slots: a checkpoint is sized by content, not by capacity
            checksums |= save_rows(self.buffer.storage, min(self.steps_written, self.capacity), path / "steps")
        filled = min(self.steps_written, self.capacity)  # the links of the written slots (a slice is saved whole)
        links = {name: getattr(self, name)[:filled].clone() for name in _LINKS}
        links["capacity"] = self.capacity
        links["generator"] = self.generator.get_state()
        if self.priorities is not None:
            links.update(self.priorities.state())
        if self.frames is not None:
            links.update(self.frames.state())
            if self.frames.filled():
                checksums |= save_rows(self.frames.storage, self.frames.filled(), path / "frames")
        torch.save(links, path / "links.pt")
        if self.successor_keys:  # only the written entries: the ring is mostly untouched
            entries = min(self.end_entries_written, self.capacity)
            checksums |= save_rows(self.episode_ends, entries, path / "episode_ends")
        counters = {
            "episodes_started": self.episodes_started,
            "steps_written": self.steps_written,
            "end_entries_written": self.end_entries_written,
            "steps_missing": self.steps_missing,
            "successor_keys": self.successor_keys,
        }
        (path / "counters.json").write_text(json.dumps(counters))
        return checksums

    def load(self, path: Path) -> None:
        """Restore a replay saved by :meth:`save`. Trajectories open at save time end there (the
        collectors restart their envs), so their last stored step is a window end, not a boundary."""
        links = torch.load(path / "links.pt", weights_only=True)
        saved_capacity = links.get("capacity", links["episode"].numel())  # older checkpoints: every slot's links
        if saved_capacity != self.capacity:
            raise ValueError(f"the saved replay holds {saved_capacity} steps but replay.capacity={self.capacity}")
        if (path / "steps").exists():
            load_rows(self.buffer.storage, path / "steps")
        for name in _LINKS:
            if name in links:  # replays saved before `end_entry` existed store every next observation
                getattr(self, name)[: links[name].numel()].copy_(links[name])
        self.generator.set_state(links["generator"])
        if (self.frames is not None) != ("frame_ids" in links):
            raise ValueError("the saved replay and this run differ in env.frame_stack (frames stored once or not)")
        if self.frames is not None:
            self.frames.load_state(links)
            if (path / "frames").exists():
                load_rows(self.frames.storage, path / "frames")
        counters = json.loads((path / "counters.json").read_text())
        self.episodes_started = counters["episodes_started"]
        self.steps_written = counters["steps_written"]
        set_write_position(self.buffer.writer, self.steps_written % self.capacity, self.steps_written)
        self.end_entries_written = counters.get("end_entries_written", 0)
        self.steps_missing = counters.get("steps_missing", 0)
        keys = counters.get("successor_keys", () if self.steps_written else None)
        self.successor_keys = tuple(keys) if keys is not None else None
        if self.successor_keys:
            load_rows(self.episode_ends, path / "episode_ends")
        self._open.clear()
        self._alive_slots = None
        if self.priorities is not None:  # a prioritized run resumes a prioritized replay (replay.* are run-defining)
            self.priorities.load_state(links, self.alive)


def _column_file(prefix: Path, key: tuple[str, ...]) -> Path:
    """Where :func:`save_rows` writes the column ``key``: ``prefix/next/done.bin`` for ``("next", "done")``."""
    return prefix.joinpath(*key[:-1], f"{key[-1]}.bin")


def _dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (``"uint8"``); ``ValueError`` for any other name."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


def save_rows(storage: Storage, rows: int, prefix: Path) -> dict[str, dict]:
    """The first ``rows`` entries of a TorchRL storage under ``prefix``: each stored column as one raw file
    (:func:`~acer_torchrl.checkpoint.write_tensor`, straight from the storage's memory) and their keys, dtypes
    and shapes in ``columns.json``. Returns the files' manifest entries, by path relative to ``prefix.parent``."""
    columns, checksums = [], {}
    for key, column in stored_tensordict(storage).items(include_nested=True, leaves_only=True):
        key = key if isinstance(key, tuple) else (key,)
        file = _column_file(prefix, key)
        file.parent.mkdir(parents=True, exist_ok=True)
        checksums[str(file.relative_to(prefix.parent))] = write_tensor(file, column[:rows])
        dtype = str(column.dtype).removeprefix("torch.")
        columns.append({"key": list(key), "dtype": dtype, "shape": list(column.shape[1:])})
    (prefix / COLUMNS).write_text(json.dumps({"rows": rows, "columns": columns}))
    return checksums


def load_rows(storage: Storage, prefix: Path) -> None:
    """Entries saved by :func:`save_rows` back into the first slots of ``storage``, each column read straight
    into the storage's memory. Only JSON and raw tensor files are read: loading a checkpoint never runs pickled
    code. A replay saved before the columns were raw files (a memory-mapped TensorDict) loads through
    ``TensorDict.load_memmap(allow_pickle=False)``."""
    if not (prefix / COLUMNS).exists():
        saved = TensorDict.load_memmap(prefix, allow_pickle=False)
        storage.set(torch.arange(saved.shape[0]), saved)
        return
    layout = json.loads((prefix / COLUMNS).read_text())
    rows, columns = layout["rows"], [(tuple(c["key"]), c) for c in layout["columns"]]
    empty = TensorDict({key: torch.zeros(c["shape"], dtype=_dtype(c["dtype"])) for key, c in columns}, batch_size=[])
    storage.set(slice(0, rows), empty.expand(rows))  # shapes the storage (allocated on first use) and its length
    stored = stored_tensordict(storage)
    for key, _ in columns:
        read_tensor(_column_file(prefix, key), stored.get(key)[:rows])


def refresh_from_prefix(
    sample: TensorDictBase,
    prefix: TensorDictBase | None,
    k: torch.Tensor,
    unroll: TensorDictModuleBase,
    hidden_keys: list[str],
) -> None:
    """Second half of :meth:`EpisodeReplay.refresh_recurrent_state`: unroll the current network over the
    episode prefixes of :meth:`EpisodeReplay.recurrent_prefix` and write the resulting state into
    ``sample[:, 0]`` (the zero state where ``k == 0``). Kept apart so that a replay served by another
    process can send the prefix while the network runs where the learner is."""
    zero = torch.zeros_like(sample.get(hidden_keys[0])[:, 0])
    if prefix is None:
        for key in hidden_keys:
            sample.get(key)[:, 0] = zero
        return
    out = unroll(prefix.to(zero.device))
    k = k.to(zero.device)
    for key in hidden_keys:
        state = out.get(("next", key))[:, -1]
        sample.get(key)[:, 0] = torch.where((k > 0).view(-1, *[1] * (state.ndim - 1)), state, zero)


def unprioritized(windows: TensorDictBase) -> TensorDictBase:
    """``windows`` (fresh ones, mixed into a prioritized batch) with importance weight 1 and no replay write
    (:meth:`EpisodeReplay.update_priorities` leaves them out)."""
    windows = windows.copy()
    windows.set(PRIORITY_WEIGHT_KEY, torch.ones(windows.shape, device=windows.device))
    windows.set(WRITE_KEY, torch.full(windows.shape, -1, dtype=torch.long, device=windows.device))
    return windows


class OnlineWindows:
    """The freshest collected data, cut into ``[seq_len]`` windows, for on-policy updates and for mixing
    a share of online data into replay batches (ACER Alg. 1, LASER sec. 4.2).

    Windows are cut from each trajectory row of a collected batch along time; they may hold episode
    boundaries (the estimators handle ``done`` mid-window). Each window keeps the recurrent state the actor
    had at its first step.
    """

    def __init__(self, seq_len: int, keep_batches: int = FRESH_BATCHES_KEPT):
        self.seq_len = seq_len
        self.batches: deque[TensorDictBase] = deque(maxlen=keep_batches)
        self._freshest_first: deque[torch.Tensor] = deque(maxlen=keep_batches)  # each batch's windows, latest first

    def push(self, batch: TensorDictBase) -> None:
        rows = as_rows(batch)
        n, T = rows.shape
        pad = (-T) % self.seq_len
        mask = torch.ones(n, T + pad, dtype=torch.bool)
        if pad:
            rows = torch.cat([rows, rows[:, -1:].expand(n, pad).clone()], dim=1)
            mask[:, T:] = False
        per_row = (T + pad) // self.seq_len
        rows = rows.reshape(n * per_row, self.seq_len)
        rows.set(MASK_KEY, mask.reshape(rows.shape))
        self.batches.appendleft(rows)
        # window (row i, k-th of its row) is i * per_row + k: the rows' last windows first, then the ones before
        latest_first = torch.arange(per_row - 1, -1, -1).unsqueeze(1) + per_row * torch.arange(n)
        self._freshest_first.appendleft(latest_first.reshape(-1))

    def state(self) -> list[dict]:
        """The windows kept, for the run's checkpoint (tensors and plain containers only): without them a resumed
        run's first updates would mix in fewer fresh windows than an uninterrupted one's."""
        return [{"batch_size": list(b.batch_size), "data": b.to_dict(), "freshest_first": order}
                for b, order in zip(self.batches, self._freshest_first)]

    def load_state(self, state: list[dict]) -> None:
        """The windows :meth:`state` kept; none when they were cut at another ``seq_len`` (a resume may change it)."""
        self.batches.clear()
        self._freshest_first.clear()
        for kept in state:
            if kept["batch_size"][1:] != [self.seq_len]:
                continue
            self.batches.append(TensorDict(kept["data"], batch_size=kept["batch_size"]))
            self._freshest_first.append(kept["freshest_first"])

    @property
    def latest(self) -> TensorDictBase:
        return self.batches[0]

    def take(self, n: int) -> TensorDictBase:
        """The ``n`` freshest windows (fewer if fewer were collected): whole batches from the newest on, each in its
        row-major order (env 0's windows in time order first), then of the batch that fills only in part the latest
        windows of its rows (every env's last, then every env's one before, ...)."""
        windows, have = [], 0
        for batch, latest_first in zip(self.batches, self._freshest_first):
            if have >= n:
                break
            windows.append(batch if n - have >= batch.shape[0] else batch[latest_first[: n - have]])
            have += windows[-1].shape[0]
        return torch.cat(windows, 0)
