"""Per-step estimates an agent keeps for the steps of a replay it reads but does not own: V-RACER's stored
``V(s_k)``, ``rho_k`` and ``V(s_{k+1})`` (Novati & Koumoutsakos 2019, sec. 2, Algorithm 3;
:class:`~acer_torchrl.estimates.vracer.VRACEREstimates`).

They live with the agent, beside its loss, indexed by the replay's slots, not in the replay: each agent of a
shared-replay sweep keeps its own network's estimates of every stored step, whoever collected it, and the replay
stays the record of what was collected. The replay is written round robin (its ``w``-th step lands in slot
``w mod capacity``), so its write counter alone says which slots changed since the agent last looked
(:meth:`SlotEstimates.sync`).
"""

from __future__ import annotations

import numpy as np
import torch

from acer_torchrl.replay import EpisodeStore


class SlotEstimates:
    """Named one-value-per-slot columns for one replay and its episode links as of the last :meth:`sync`.

    A column is allocated ``[capacity]`` at its first :meth:`write`, in the dtype written.
    """

    def __init__(self):
        self.columns: dict[str, torch.Tensor] = {}
        self.capacity = 0
        self.synced = 0  # the replay's steps_written at the last sync
        self.links: EpisodeLinks | None = None
        self.version = 0  # changes with every write, sync and load (a reader's cue to recount what it derived)

    def sync(self, replay: EpisodeStore) -> torch.Tensor | None:
        """The alive slots written since the last sync (every alive slot the first time), ascending by write;
        None when the replay has not been written since. Refreshes :attr:`links`."""
        if self.links is not None and replay.steps_written == self.synced:
            return None
        if replay.capacity != self.capacity:  # a first look (or another replay): everything is new
            self.columns, self.capacity, self.synced = {}, replay.capacity, 0
        written, self.links = replay.episode_links()
        self.version += 1
        slots = torch.arange(max(self.synced, written - self.capacity), written) % self.capacity
        self.synced = written
        return slots[self.links.alive[slots]]

    def alive_slots(self) -> torch.Tensor:
        return self.links.alive.nonzero().squeeze(-1)

    def written(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Column ``name`` over the slots written so far and which of them are alive (no gather: for statistics
        over the replay, the slots beyond are never alive)."""
        n = min(self.synced, self.capacity)
        return self.columns[name][:n], self.links.alive[:n]

    def array(self, name: str) -> np.ndarray:
        """Column ``name`` as a NumPy view (the per-update bookkeeping: on a few hundred entries a NumPy
        call costs a fraction of a torch call's dispatch)."""
        return self.columns[name].numpy()

    def read(self, name: str, slots: torch.Tensor) -> torch.Tensor:
        """``name`` at ``slots`` (any shape), ``[*slots.shape]``."""
        return torch.from_numpy(self.array(name)[as_array(slots)])

    def write(self, slots: torch.Tensor | np.ndarray, **values: torch.Tensor | np.ndarray) -> None:
        """``values[name]`` (``[*slots.shape]`` or ``[*slots.shape, 1]``) into column ``name`` at ``slots``."""
        slots = as_array(slots).reshape(-1)
        self.version += 1
        for name, value in values.items():
            value = as_array(value).reshape(-1)
            if name not in self.columns:
                self.columns[name] = torch.zeros(self.capacity, dtype=torch.from_numpy(value).dtype)
            self.array(name)[slots] = value

    def scale(self, factor: float, *names: str) -> None:
        self.version += 1
        for name in names:
            self.columns[name].mul_(factor)

    def state(self) -> dict:
        """Checkpoint content (tensors and ints only): the columns and the write count they reflect."""
        return {"capacity": self.capacity, "synced": self.synced, "columns": dict(self.columns)}

    def load_state(self, state: dict) -> None:
        self.capacity, self.synced = int(state["capacity"]), int(state["synced"])
        self.columns = dict(state["columns"])
        self.version += 1
        self.links = None  # read again at the next sync


def as_array(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """A CPU NumPy view of ``x`` (a copy only from another device)."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x
