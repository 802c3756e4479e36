"""Synthetic Atari steps, as the Atari presets' collector yields them, for the benchmarks that fill a large replay
without playing (``replay_draw.py``, ``replay_draw.py memory``, ``checkpoint_speed.py``).

A :class:`SyntheticAtari` plays ``n_envs`` envs side by side: each step's observation is the stack of the last
``frame_stack`` uint8 ``84 x 84`` frames (random bytes: neither the disk nor the replay sees a difference), its next
observation that stack shifted by one new frame, as ale-py's are (what lets a replay store each frame once);
episodes last a fixed number of steps or a random one in a range, each under a new trajectory id, with the
``step_count`` the replay checks for gaps. A batch holds every key the preset stores of a collected batch (without
the policy's activations): action, reward, done / terminated / truncated, ``is_init``, episode returns, the
behaviour policy's 6 logits and log-probability and, for recurrent agents, the LSTM state.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

FRAME = (84, 84)
ACTIONS = 6


class SyntheticAtari:
    """``n_envs`` synthetic Atari envs whose :meth:`batch` calls continue where the last one stopped."""

    def __init__(self, n_envs: int, frame_stack: int = 4, episode: int | tuple[int, int] = 1_000, lstm: int = 0,
                 seed: int = 0):
        """``episode``: every episode's length, or the ``(low, high)`` range each episode's length is drawn from;
        ``lstm``: the width of the recurrent state stored a step (0: none)."""
        self.n_envs, self.frame_stack, self.lstm = n_envs, frame_stack, lstm
        self.episode = episode if isinstance(episode, tuple) else (episode, episode)
        self.g = torch.Generator().manual_seed(seed)
        self.frames = [self._new_frames(frame_stack) for _ in range(n_envs)]  # each env's current observation
        self.count = [0] * n_envs  # steps into the running episode
        self.length = [self._episode_length() for _ in range(n_envs)]
        self.traj = list(range(n_envs))

    def _new_frames(self, n: int) -> torch.Tensor:
        return torch.randint(0, 256, (n, *FRAME), dtype=torch.uint8, generator=self.g)

    def _episode_length(self) -> int:
        low, high = self.episode
        return low if low == high else int(torch.randint(low, high + 1, (), generator=self.g))

    def _env_steps(self, e: int, T: int) -> dict[str, torch.Tensor]:
        """The next ``T`` steps of env ``e``: observation stacks, next ones, step counts, episode ends, ids."""
        window = torch.cat([self.frames[e], self._new_frames(T)])  # frames t .. t + T + k - 1
        stacks = window.unfold(0, self.frame_stack, 1).permute(0, 3, 1, 2)  # [T + 1, k, 84, 84]
        self.frames[e] = window[T:].clone()  # the next observation of the last step
        counts, ends, traj = [], [], []
        for _ in range(T):
            counts.append(self.count[e])
            traj.append(self.traj[e])
            self.count[e] += 1
            ends.append(self.count[e] == self.length[e])
            if ends[-1]:
                self.count[e], self.length[e], self.traj[e] = 0, self._episode_length(), max(self.traj) + 1
        return {"observation": stacks[:-1], "next_observation": stacks[1:], "step_count": torch.tensor(counts),
                "done": torch.tensor(ends), "traj": torch.tensor(traj)}

    def batch(self, T: int) -> TensorDict:
        """The next ``[n_envs, T]`` collected steps."""
        envs = [self._env_steps(e, T) for e in range(self.n_envs)]
        steps = {key: torch.stack([env[key] for env in envs]) for key in envs[0]}
        shape = (self.n_envs, T)
        step_count, done = steps["step_count"].unsqueeze(-1), steps["done"].unsqueeze(-1)
        no = torch.zeros(*shape, 1, dtype=torch.bool)
        data = {
            "observation": steps["observation"],
            "action": torch.randint(0, ACTIONS, shape, generator=self.g),
            "is_init": step_count == 0,
            "step_count": step_count,
            "episode_reward": torch.zeros(*shape, 1),
            "done": no, "terminated": no.clone(), "truncated": no.clone(),
            ("collector", "traj_ids"): steps["traj"],
            ("behaviour", "logits"): torch.randn(*shape, ACTIONS, generator=self.g),
            ("behaviour", "log_prob"): torch.randn(shape, generator=self.g),
            ("next", "observation"): steps["next_observation"],
            ("next", "is_init"): no.clone(),
            ("next", "step_count"): step_count + 1,
            ("next", "episode_reward"): torch.zeros(*shape, 1),
            ("next", "reward"): torch.randn(*shape, 1, generator=self.g).sign(),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "truncated"): no.clone(),
        }
        if self.lstm:
            data["recurrent_state_h"] = torch.zeros(*shape, 1, self.lstm)
            data["recurrent_state_c"] = torch.zeros(*shape, 1, self.lstm)
        return TensorDict(data, batch_size=shape)

    def batches(self, steps: int, T: int):
        """Collected ``[n_envs, T]`` batches, ``steps`` steps in all (the last batch shorter when they do not
        divide)."""
        for first in range(0, steps // self.n_envs, T):
            yield self.batch(min(T, steps // self.n_envs - first))
