"""What every loss of this library shares: the contract with the trainer and small masked helpers.

A loss is a TorchRL :class:`~torchrl.objectives.LossModule` whose ``forward(td)`` takes a ``[B, T]``
batch of sequences (``[B, 1]`` for single-step losses) and returns a TensorDict whose ``loss_*`` entries
sum to the objective; other entries are diagnostics (mean rho, truncated share, rejected share...).
:class:`ReplayLoss` adds what the shared trainer asks of it.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.objectives import LossModule

from acer_torchrl.replay import MASK_KEY


class ReplayLoss(LossModule):
    """Base of the four losses. Subclasses set ``seq_len`` and override the hooks they need.

    Attributes:
        seq_len: steps per sampled sequence (1: single steps, as V-RACER).
    """

    seq_len: int = 1

    def update_plan(self, rng: np.random.Generator) -> list[float]:
        """Gradient steps to take after one collected batch, each given as its share of online data
        (1.0: the freshest collected windows only, as ACER's on-policy update; 0.0: replay only)."""
        return [0.0]

    def preprocess(self, batch: TensorDictBase) -> TensorDictBase:
        """Called on every collected batch before it is stored (e.g. to add columns written back later)."""
        return batch

    def after_update(self, sample: TensorDictBase, output: TensorDictBase, replay) -> None:
        """Called after each optimiser step with the batch it used (write-backs, controllers)."""

    def after_extend(self, batch: TensorDictBase, slots: torch.Tensor, replay) -> None:
        """Called after each collected batch is stored, with the storage slots its steps went to
        (row-major), e.g. to compute per-episode estimates over the stored steps (V-RACER)."""

    def lr_scale(self) -> float:
        """Multiplier of ``optim.lr`` for the next optimiser step (annealing, e.g. ReF-ER eq. 13)."""
        return 1.0


def poisson_plan(rng: np.random.Generator, replay_ratio: float, on_policy_first: bool) -> list[float]:
    """ACER Algorithm 1: an on-policy step on the fresh batch, then n ~ Poisson(replay_ratio) replay steps."""
    plan = [1.0] if on_policy_first else []
    return plan + [0.0] * int(rng.poisson(replay_ratio)) if replay_ratio > 0 else plan


def sequence_mask(td: TensorDictBase) -> torch.Tensor:
    """``[B, T, 1]`` bool mask of real (not padding) steps; all True when the batch has none."""
    mask = td.get(MASK_KEY, None)
    if mask is None:
        return torch.ones(*td.shape, 1, dtype=torch.bool, device=td.device)
    return mask.reshape(*td.shape, 1)


def trace_cut(done: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``done`` for the estimators' trace cutting: also True on the last real step before padding, so that
    the recursion bootstraps on ``V(s_{t+1})`` there instead of reading the padding row."""
    next_real = torch.zeros_like(mask)
    next_real[..., :-1, :] = mask[..., 1:, :]
    return done | ~next_real


def masked_mean(value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``value`` over the real steps (mask broadcast on the trailing dims)."""
    mask = mask.expand_as(value).to(value.dtype)
    return (value * mask).sum() / mask.sum().clamp_min(1.0)
