"""Stacked Atari observations stored as single frames, each frame once.

An Atari observation is a stack of the last ``k`` frames (``[k, 84, 84]`` uint8, DQN's preprocessing), so
consecutive steps of a trajectory share ``k - 1`` frames, and a step's next observation is its own stack shifted
by one frame. Stored as collected, a step costs ``2k`` frames (its observation and its next observation); here it
costs one: the newest frame of its next observation. Each stored step keeps ``k + 1`` frame ids,

    ids[t] = [f_{t-k+1}, ..., f_t, f_{t+1}]      observation = frames[ids[t, :k]], next = frames[ids[t, 1:]]

so that a ``[B, T]`` sequence's observations and next observations (the bootstrap rows) come out of one index op
on the frames, as two views of the same ``[B, T, k + 1, 84, 84]`` gather. For a learner on another device (a GPU)
the frames a draw reads are gathered once each (a 20-step sequence of 4-frame stacks reads 24 distinct frames of
its 100 ids), moved there, and expanded into the stacks on that device. A trajectory's first stored step (a
reset, a life lost with ``episodic_life``, or after a gap or a resume) stores its whole stack; a step that
continues a trajectory takes its predecessor's ids shifted by one. A step whose next observation is not its own
stack shifted by one frame (ale-py restarts a game now and then at the step after a lost life) gets that next
stack whole, as an override of its next ids, and the steps after it continue from there: the stacks read back
are the collected ones bit for bit, whatever the env does (``tests/test_replay.py``).

Frames live in a ring of their own, a little larger than the replay (trajectory starts write ``k`` frames). A
frame slot remembers the episode that wrote it; overwriting it evicts that episode whole, as the replay does for
step slots, so a sampleable step never points at a frame written over.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data import Storage

from acer_torchrl._torchrl_compat import stored_tensordict

FRAME_KEY = "frame"


def _words(stacks: torch.Tensor) -> torch.Tensor:
    """``[N, k, ...]`` uint8 frames as ``[N, k, bytes / 8]`` int64 words where the frame's bytes allow (84 x 84 do):
    comparing stacks frame by frame then takes an eighth of the element comparisons, with the same answer."""
    flat = stacks.flatten(2)
    if flat.dtype == torch.uint8 and flat.shape[-1] % 8 == 0 and flat.stride(-1) == 1:
        return flat.view(torch.int64)
    return flat


def frame_capacity(steps: int, stack: int) -> int:
    """Frame slots for a replay of ``steps`` steps: one per step, plus room for the ``stack`` frames of each
    trajectory start (a quarter of the replay: one start in every ``4 * stack`` steps, where Atari episodes, life
    losses included, last hundreds of steps), plus a batch's worth of starts for small replays."""
    return steps + steps // 4 + 64 * stack


class FrameStore:
    """The frames of a replay's stacked observations and each step slot's ``k + 1`` frame ids.

    Args:
        steps: the replay's capacity (step slots).
        stack: ``k``, the frames in an observation.
        storage: a TorchRL storage for the frames (in RAM or memory-mapped), of :func:`frame_capacity` entries.
    """

    def __init__(self, steps: int, stack: int, storage: Storage):
        self.stack = stack
        self.capacity = storage.max_size
        self.storage = storage
        self.ids = torch.full((steps, stack + 1), -1, dtype=torch.long)  # per step slot
        self.next_ids = torch.full((steps, stack), -1, dtype=torch.long)  # per step slot: a next stack stored whole
        self.owner = torch.full((self.capacity,), -1, dtype=torch.long)  # per frame slot: the episode that wrote it
        self.written = 0  # frames written so far

    def check(self, observation: torch.Tensor) -> None:
        """A ``ValueError`` unless ``observation`` (``[N, ...]``) is a stack of ``k`` frames."""
        if observation.ndim < 2 or observation.shape[1] != self.stack:
            raise ValueError(
                f"the replay stores observations as stacks of {self.stack} frames (env.frame_stack), but the "
                f"collected observations have shape {tuple(observation.shape[1:])}"
            )

    def store(
        self,
        observation: torch.Tensor,
        following: torch.Tensor,
        step_slots: torch.Tensor,
        episodes: torch.Tensor,
        chunks: list[tuple[int, int, int | None]],
    ) -> torch.Tensor:
        """Store the frames of ``N`` collected steps (``observation`` and ``following``: ``[N, k, ...]``) written
        to ``step_slots`` for ``episodes``; ``chunks`` are their trajectory chunks ``(a, b, last)``: batch positions
        ``a:b``, continuing from step slot ``last`` (None: a trajectory's start). Returns the episodes whose
        frames the ring overwrote: the caller evicts them."""
        k = self.stack
        shifted = _words(following)[:, :-1] != _words(observation)[:, 1:]
        breaks = shifted.flatten(1).any(1).nonzero().squeeze(-1).tolist()
        segments, ends = [], []  # (a, b, slot continued from or None); chunk ends whose next stack is stored whole
        for a, b, last in chunks:
            for t in (t for t in breaks if a <= t < b):
                if t + 1 < b:
                    segments.append((a, t + 1, last))
                    a, last = t + 1, None
                else:
                    ends.append(t)
            segments.append((a, b, last))
        starts = [a for a, _, last in segments if last is None]
        n = len(starts) + len(ends)
        frame_slots, victims = self._allocate(n * k + len(step_slots))
        stacks = torch.cat([observation[starts], following[ends]]).flatten(0, 1)
        self._write(frame_slots, torch.cat([stacks, following[:, -1]]),
                    torch.cat([episodes[starts + ends].repeat_interleave(k), episodes]))
        stack_ids = dict(zip(starts, frame_slots[: len(starts) * k].view(-1, k)))
        end_ids = dict(zip(ends, frame_slots[len(starts) * k : n * k].view(-1, k)))
        # every prefix before any link: a continued slot may be written over below (its episode is then dead)
        prefixes = [stack_ids[a] if last is None else self._continuation(last) for a, _, last in segments]
        next_frames = frame_slots[n * k :]
        self.next_ids[step_slots] = -1
        for (a, b, _), prefix in zip(segments, prefixes):
            self.ids[step_slots[a:b]] = torch.cat([prefix, next_frames[a:b]]).unfold(0, k + 1, 1)
        for t in breaks:
            self.next_ids[step_slots[t]] = end_ids[t] if t in end_ids else stack_ids[t + 1]
        return victims

    def _allocate(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``n`` frame slots of the ring, and the episodes whose frames they hold (to evict)."""
        if n > self.capacity:
            raise ValueError(f"a collected batch needs {n} frames, more than the frame ring's {self.capacity}")
        slots = (self.written + torch.arange(n)) % self.capacity
        owners = self.owner[slots]
        return slots, owners[owners >= 0].unique()

    def _write(self, frame_slots: torch.Tensor, frames: torch.Tensor, episodes: torch.Tensor) -> None:
        # the ring's slots are consecutive but where it wraps: as a slice, the write is one copy (the atari_gpu
        # preset's 320 frames a batch on the project's CPU VM: 0.13 ms against 0.95 ms as an index tensor)
        first, n = int(frame_slots[0]), frame_slots.numel()
        where = slice(first, first + n) if first + n <= self.capacity else frame_slots
        self.storage.set(where, TensorDict({FRAME_KEY: frames}, batch_size=[n]))
        self.owner[frame_slots] = episodes
        self.written += frame_slots.numel()

    def _continuation(self, last: int) -> torch.Tensor:
        """The ``k`` frame ids of step slot ``last``'s next observation."""
        whole = self.next_ids[last]
        return (whole if whole[0] >= 0 else self.ids[last, 1:]).clone()

    def gather(
        self, step_slots: torch.Tensor, current: bool, following: bool, device: torch.device | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(observation, next observation)`` of ``step_slots`` (1-D), each ``[N, k, ...]`` (None where not asked
        for), gathered in one index op: when both are asked for, they are views of one ``[N, k + 1, ...]`` gather
        (a next stack stored whole is gathered apart, into a copy). On ``device`` when given (see :meth:`_frames`)."""
        first, last = (0 if current else 1), (self.stack + 1 if following else self.stack)
        ids = self.ids[step_slots, first:last]
        observation = self._frames(ids, device)
        following_obs = observation[:, last - first - self.stack :] if following else None
        if following:
            whole = self.next_ids[step_slots]
            rows = whole[:, 0] >= 0
            if rows.any():
                following_obs = following_obs.clone()
                following_obs[rows.to(following_obs.device)] = self._frames(whole[rows], device)
        return (observation[:, : self.stack] if current else None), following_obs

    def _frames(self, ids: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
        """The frames of ``ids`` (any shape), by one index_select on the flat ids (much faster than advanced
        indexing with a 2-D index). For another ``device`` than the ring's, each distinct frame is read and moved
        once and the ids are expanded there: the stacks of a sequence share most of their frames, and a
        ``[N, k + 1]`` gather moved whole would carry each of them ``k + 1`` times."""
        stored = stored_tensordict(self.storage).get(FRAME_KEY)
        flat = ids.reshape(-1)
        if device is None or torch.device(device) == stored.device:
            return stored.index_select(0, flat).view(*ids.shape, *stored.shape[1:])
        distinct, position = torch.unique(flat, return_inverse=True)
        frames = stored.index_select(0, distinct).to(device, non_blocking=True)
        return frames.index_select(0, position.to(device, non_blocking=True)).view(*ids.shape, *stored.shape[1:])

    # ------------------------------------------------------------------ persistence and size
    def state(self) -> dict:
        """The tensors and counter to save beside the frames' rows (:meth:`filled`)."""
        return {"frame_ids": self.ids, "frame_next_ids": self.next_ids, "frame_owner": self.owner,
                "frames_written": self.written}

    def load_state(self, state: dict) -> None:
        self.ids.copy_(state["frame_ids"])
        self.next_ids.copy_(state["frame_next_ids"])
        self.owner.copy_(state["frame_owner"])
        self.written = int(state["frames_written"])

    def filled(self) -> int:
        """Frame slots holding a frame."""
        return min(self.written, self.capacity)

    def saved_bytes(self) -> int:
        """Bytes a checkpoint writes of the frame store: the filled frame slots and the ids."""
        filled = self.filled()
        frames = stored_tensordict(self.storage)[:filled].bytes() if filled else 0
        return frames + (self.ids.numel() + self.next_ids.numel() + self.owner.numel()) * 8

    def nbytes(self, observation: torch.Tensor) -> int:
        """Bytes of the frame ring for observations like ``observation`` (``[N, k, ...]``), ids included."""
        frame = observation[0, 0].numel() * observation.element_size()
        return self.capacity * (frame + 8) + (self.ids.numel() + self.next_ids.numel()) * 8
