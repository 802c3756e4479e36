"""The sweep's one replay and its server (LASER sec. 5.4-5.5): :class:`SharedReplay` (the storage, its agent
tags and lock), its RPC service (:func:`serve`, :class:`RemoteReplay`) and each agent's view of it
(:class:`AgentReplay`, what the agent's trainer uses as its replay). The package docstring
(:mod:`acer_torchrl.shared_replay`) says why it is an RPC server."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from acer_torchrl.replay import SLOT_KEY, TRAJ_KEY, EpisodeLinks, EpisodeReplay, refresh_from_prefix

SAMPLED_FILE = "sampled_by_agent.json"  # an agent's replayed-step counts per source agent, in its checkpoint
AGENT_KEY = "agent_id"  # int64 [..., 1]: the sweep agent whose behaviour policy produced the step


def tag_agent(batch: TensorDictBase, agent_id: int, n_agents: int) -> TensorDictBase:
    """A shallow copy of ``batch`` with ``agent_id`` in every step and trajectory ids made unique across the
    agents (``traj * n_agents + agent_id``: every agent's collector numbers its trajectories from 0)."""
    tagged = batch.copy()
    tagged.set(AGENT_KEY, torch.full((*batch.shape, 1), agent_id, dtype=torch.int64))
    tagged.set(TRAJ_KEY, batch.get(TRAJ_KEY) * n_agents + agent_id)
    return tagged


class SharedReplay:
    """One :class:`EpisodeReplay` for the agents of a sweep, safe to call from several threads (the RPC
    server threads and the owner's own learner).

    Args:
        replay: the storage (its capacity is the sweep's, not per agent).
        n_agents: agents writing into it.
    """

    def __init__(self, replay: EpisodeReplay, n_agents: int):
        self.replay = replay
        self.n_agents = n_agents
        self.lock = threading.Lock()

    def extend(self, batch: TensorDictBase, agent_id: int) -> torch.Tensor:
        if not 0 <= agent_id < self.n_agents:
            raise ValueError(f"agent_id {agent_id} is not one of the sweep's {self.n_agents} agents")
        tagged = tag_agent(batch, agent_id, self.n_agents)
        with self.lock:
            return self.replay.extend(tagged)

    def size(self) -> int:
        with self.lock:
            return len(self.replay)

    def episodes(self) -> int:
        """Episodes with a step stored (all agents)."""
        with self.lock:
            return self.replay.num_episodes

    def sample_sequences(self, batch_size: int, seq_len: int, keys: list[NestedKey] | None = None) -> TensorDictBase:
        with self.lock:
            return self.replay.sample_sequences(batch_size, seq_len, keys)

    def sample_steps(self, batch_size: int, keys: list[NestedKey] | None = None) -> TensorDictBase:
        with self.lock:
            return self.replay.sample_steps(batch_size, keys)

    def recurrent_prefix(self, starts: torch.Tensor, hidden_keys: list[str]):
        with self.lock:
            return self.replay.recurrent_prefix(starts, hidden_keys)

    def capacity(self) -> int:
        return self.replay.capacity

    def written(self) -> int:
        """Steps ever written (all agents)."""
        with self.lock:
            return self.replay.steps_written

    def episode_links(self) -> tuple[int, EpisodeLinks]:
        """The steps written so far and the episode links after them (copies: one consistent snapshot)."""
        with self.lock:
            written, links = self.replay.episode_links()
            return written, EpisodeLinks(*(t.clone() for t in links))

    def gather(self, idx: torch.Tensor, keys: list[NestedKey] | None = None) -> TensorDictBase:
        with self.lock:
            return self.replay.gather(idx, keys)

    def missing(self) -> int:
        """Env steps the agents' collectors dropped (:attr:`EpisodeReplay.steps_missing`, all agents)."""
        with self.lock:
            return self.replay.steps_missing

    def agent_counts(self) -> list[int]:
        """Stored (alive) steps per agent."""
        with self.lock:
            if len(self.replay) == 0:
                return [0] * self.n_agents
            ids = self.replay.column(AGENT_KEY).reshape(-1)
        return torch.bincount(ids, minlength=self.n_agents).tolist()

    def save(self, path: Path) -> dict[str, dict]:
        with self.lock:
            return self.replay.save(Path(path))

    def load(self, path: Path) -> None:
        with self.lock:
            self.replay.load(Path(path))


# ---------------------------------------------------------------------------------------------- RPC
_SERVED: SharedReplay | None = None  # the replay rank 0 serves
_SERVED_SET = threading.Event()  # set once this process serves a replay, or says it serves none
_REMOTE_METHODS = frozenset(
    {"extend", "size", "episodes", "missing", "sample_sequences", "sample_steps", "recurrent_prefix", "capacity",
     "written", "episode_links", "gather", "agent_counts"}
)


def serve(replay: SharedReplay | None) -> None:
    """Make ``replay`` the one this process serves to :class:`RemoteReplay` clients (``None`` stops); calls that
    came before the first ``serve`` waited for it."""
    global _SERVED
    _SERVED = replay
    _SERVED_SET.set()


def _call_served(method: str, *args):
    """Runs on the owner, in an RPC server thread, once the owner said what it serves (:func:`serve`): the ranks
    meet before rank 0 has built (or restored) its replay."""
    _SERVED_SET.wait()
    if _SERVED is None or method not in _REMOTE_METHODS:
        raise RuntimeError(f"no shared replay served here for {method!r}")
    return getattr(_SERVED, method)(*args)


class RemoteReplay:
    """Client stub of a :class:`SharedReplay` served by the RPC worker ``owner`` (same methods)."""

    def __init__(self, owner: str):
        self.owner = owner

    def __getattr__(self, method: str):
        if method not in _REMOTE_METHODS:
            raise AttributeError(method)
        from torch.distributed import rpc

        return lambda *args: rpc.rpc_sync(self.owner, _call_served, args=(method, *args))


# ---------------------------------------------------------------------------------------------- agent view
class AgentReplay:
    """One agent's handle on the sweep's shared replay, with the interface the trainer uses.

    Writes are tagged with the agent's id; samples come uniformly from everyone's data. The recurrent state
    is refreshed with this agent's network (App. A.2): the owner sends the episode prefixes, the network
    runs here. Only the owner's handle (``owner=True``) persists the replay in checkpoints, so the sweep
    saves one replay, not N. ``sampled`` counts the replayed steps drawn from each agent.
    """

    def __init__(self, shared: SharedReplay | RemoteReplay, agent_id: int, n_agents: int, owner: bool):
        self.shared = shared
        self.agent_id = agent_id
        self.owner = owner
        self.sampled = torch.zeros(n_agents, dtype=torch.long)

    def extend(self, batch: TensorDictBase) -> torch.Tensor:
        return self.shared.extend(batch, self.agent_id)

    def __len__(self) -> int:
        return self.shared.size()

    @property
    def num_episodes(self) -> int:
        return self.shared.episodes()

    @property
    def steps_missing(self) -> int:
        return self.shared.missing()

    def _count(self, sample: TensorDictBase) -> TensorDictBase:
        ids = sample.get(AGENT_KEY)
        real = sample.get("mask", torch.ones(ids.shape[:-1], dtype=torch.bool))
        self.sampled += torch.bincount(ids[real].reshape(-1), minlength=self.sampled.numel())
        return sample

    def sample_sequences(
        self, batch_size: int, seq_len: int, keys: list[NestedKey] | None = None, device: torch.device | None = None
    ) -> TensorDictBase:
        """Drawn by the shared replay (on its side of the RPC), then moved to ``device`` when given."""
        return _moved(self._count(self.shared.sample_sequences(batch_size, seq_len, self._with_agent(keys))), device)

    def sample_steps(self, batch_size: int, keys: list[NestedKey] | None = None) -> TensorDictBase:
        return self._count(self.shared.sample_steps(batch_size, self._with_agent(keys)))

    @staticmethod
    def _with_agent(keys: list[NestedKey] | None) -> list[NestedKey] | None:
        """``keys`` and the collecting agent's id (counted per sample), or None (every key)."""
        return keys if keys is None else [*keys, AGENT_KEY]

    def refresh_recurrent_state(
        self, sample: TensorDictBase, unroll: TensorDictModuleBase, hidden_keys: list[str]
    ) -> None:
        prefix, k = self.shared.recurrent_prefix(sample.get(SLOT_KEY)[:, 0], hidden_keys)
        refresh_from_prefix(sample, prefix, k, unroll, hidden_keys)

    def zero_recurrent_state(self, sample: TensorDictBase, hidden_keys: list[str]) -> None:
        for key in hidden_keys:
            sample.get(key)[:, 0] = 0.0

    # what a loss keeping estimates per stored step reads (V-RACER: replay.EpisodeStore)
    @property
    def capacity(self) -> int:
        return self.shared.capacity()

    @property
    def steps_written(self) -> int:
        return self.shared.written()

    def episode_links(self) -> tuple[int, EpisodeLinks]:
        return self.shared.episode_links()

    def gather(
        self, idx: torch.Tensor, keys: list[NestedKey] | None = None, device: torch.device | None = None
    ) -> TensorDictBase:
        return _moved(self.shared.gather(idx, keys), device)

    def save(self, path: Path) -> dict[str, dict]:
        """The shared replay (owner only) and this agent's ``sampled`` counts (every agent); returns the
        manifest entries of the shared replay's row files (:meth:`EpisodeReplay.save`)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        checksums = {}
        if self.owner:
            checksums = self.shared.save(path)
        else:
            (path / "shared.json").write_text(json.dumps({"agent_id": self.agent_id, "stored_by": "agent 0"}))
        (path / SAMPLED_FILE).write_text(json.dumps(self.sampled.tolist()))
        return checksums

    def load(self, path: Path) -> None:
        path = Path(path)
        if self.owner:
            self.shared.load(path)
        if (path / SAMPLED_FILE).exists():
            self.sampled = torch.tensor(json.loads((path / SAMPLED_FILE).read_text()), dtype=torch.long)


def _moved(sample: TensorDictBase, device: torch.device | None) -> TensorDictBase:
    """``sample`` on ``device`` (as it is when None): a draw comes over the RPC on the shared replay's device."""
    return sample if device is None else sample.to(device)
