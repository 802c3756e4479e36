"""[B, T] replay windows for the loss tests, laid out as ``EpisodeReplay.sample_sequences`` returns them.

Row 0 terminates at t=2 and row 1 is truncated at t=3 (a new episode follows each, ``is_init``), row 2 ends
(not done) before padding from t=4, row 3 is truncated at t=2 right before padding; further rows run through.
Inside an episode ``("next", "observation")[t]`` is ``observation[t+1]``; padding rows repeat the episode's
last step and are masked out.
"""

from __future__ import annotations

from typing import Callable

import torch
from tensordict import TensorDict


def layout(B: int, T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(terminated, truncated, mask)``, each [B, T, 1] bool."""
    terminated = torch.zeros(B, T, 1, dtype=torch.bool)
    truncated = torch.zeros(B, T, 1, dtype=torch.bool)
    mask = torch.ones(B, T, 1, dtype=torch.bool)
    terminated[0, 2] = True
    truncated[1, 3] = True
    mask[2, 4:] = False
    truncated[3, 2] = True
    mask[3, 3:] = False
    return terminated, truncated, mask


def padded_window(B: int, T: int, obs_dim: int, g: torch.Generator, fields: Callable[[torch.Tensor], dict]) -> TensorDict:
    """Random float64 observations and rewards; ``fields(observation)`` gives the other root entries
    (action, behaviour statistics)."""
    terminated, truncated, mask = layout(B, T)
    done = terminated | truncated
    obs = torch.randn(B, T, obs_dim, generator=g, dtype=torch.float64)
    next_obs = torch.randn(B, T, obs_dim, generator=g, dtype=torch.float64)
    continues = (~done[:, :-1]) & mask[:, 1:]
    next_obs[:, :-1] = torch.where(continues, obs[:, 1:], next_obs[:, :-1])
    is_init = torch.zeros(B, T, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[:, 1:] = done[:, :-1] & mask[:, 1:]
    root = fields(obs)
    td = TensorDict(
        {
            "observation": obs,
            "is_init": is_init,
            **root,
            "mask": mask.squeeze(-1),
            "next": {
                "observation": next_obs,
                "reward": torch.randn(B, T, 1, generator=g, dtype=torch.float64),
                "terminated": terminated,
                "truncated": truncated,
                "done": done,
            },
        },
        batch_size=[B, T],
    )
    for b in range(B):
        real = int(mask[b].sum())
        if real < T:
            td[b, real:] = td[b, real - 1 : real].expand(T - real).clone()
            td["mask"][b, real:] = False
    return td


def per_window_mean_abs(error: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B]: a plain loop's mean of ``|error|`` over each window's real steps (``error`` and ``mask`` ``[B, T]``),
    the priority a prioritized sequence replay gives a window (Reactor sec. 3.3)."""
    B, T = mask.shape
    return torch.tensor([sum(abs(float(error[b, t])) for t in range(T) if mask[b, t]) / int(mask[b].sum())
                         for b in range(B)], dtype=torch.float64)
