"""What every loss of this library shares: the contract with the trainer and small masked helpers.

A loss is a TorchRL :class:`~torchrl.objectives.LossModule` whose ``forward(td)`` takes a ``[B, T]``
batch of sequences (``[B, 1]`` for single-step losses) and returns a TensorDict whose ``loss_*`` entries
sum to the objective; other entries are diagnostics (mean rho, clipped-rho share, rejected share...). Its
``out_keys`` name every entry, each from the one vocabulary of the four losses,
:data:`acer_torchrl.objectives.names.OUTPUTS`.
:class:`ReplayLoss` adds what the shared trainer asks of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torchrl.modules import set_recurrent_mode
from torchrl.modules.distributions import IndependentNormal
from torchrl.objectives import LossModule

from acer_torchrl.objectives.names import MASK_KEY

if TYPE_CHECKING:
    import numpy as np


def objective(out: TensorDictBase) -> torch.Tensor:
    """The sum of a loss output's ``loss_*`` entries: what its gradient is taken of."""
    return sum(v for k, v in out.items() if k.startswith("loss_"))


class ReplayLoss(LossModule):
    """Base of the four losses. Subclasses override the hooks they need. A loss takes batches of any sequence length
    (the replay's ``replay.seq_len``; V-RACER's single steps: 1).

    Attributes:
        value_keys: the output entries that are value estimates, watched for a blow-up with the loss terms
            and the gradient norm (:mod:`acer_torchrl.health`).
    """

    value_keys: tuple[str, ...] = ()

    @property
    def in_keys(self) -> list[NestedKey] | None:
        """The batch entries ``forward`` reads: replayed batches gather only these from the storage (each
        stored key costs time to index). None: every stored entry."""
        return None

    def update_plan(self, rng: np.random.Generator) -> list[float]:
        """Gradient steps to take after one collected batch, each given as its share of online data
        (1.0: the freshest collected windows only, as ACER's on-policy update; 0.0: replay only)."""
        return [0.0]

    def stored_steps_before_first_update(self, min_size: int) -> int:
        """The env steps the replay must hold before this loss's first gradient step, given the trainer's
        ``replay.min_size``: a replayed batch waits for ``min_size`` steps (at least one), a fresh one (an update
        plan's share 1.0) for none. This loss's plan draws from the replay."""
        return max(min_size, 1)

    def preprocess(self, batch: TensorDictBase) -> TensorDictBase:
        """Called on every collected batch before it is stored (e.g. to add columns written back later)."""
        return batch

    def forward_backward(self, td: TensorDictBase, params: Sequence[torch.Tensor]) -> TensorDictBase:
        """``forward(td)``, with the gradient of the sum of its ``loss_*`` entries in the ``.grad`` of each of
        ``params`` (None where it does not reach): autograd here; a loss may compute the same gradient its own way
        (V-RACER's written-out network)."""
        out = self(td)
        for param in params:  # zero_grad(set_to_none=True) without an optimiser's profiling wrapper
            param.grad = None
        objective(out).backward()
        return out

    def lr_scale(self) -> float:
        """Multiplier of ``optim.lr`` for the next optimiser step (annealing, e.g. ReF-ER eq. 13)."""
        return 1.0

    def at_env_steps(self, env_steps: int) -> None:
        """Called before each gradient step with the run's env steps so far (restored on resume): a loss sets its
        step-dependent weights here (ACER's falling critic weight)."""


class LinearDecay:
    """A weight that is ``start_value`` until env step ``steps[0]``, falls linearly to ``end_value`` at ``steps[1]``
    and stays there; ``end_value=None``: ``start_value`` throughout. :meth:`at` sets :attr:`value`."""

    def __init__(self, start_value: float, end_value: float | None, steps: Sequence[int]):
        self.start_value, self.end_value = start_value, end_value
        self.begin, self.end = steps
        self.value = start_value

    def at(self, env_steps: int) -> None:
        if self.end_value is None:
            return
        progress = 1.0 if env_steps >= self.end else max(env_steps - self.begin, 0) / max(self.end - self.begin, 1)
        self.value = self.start_value + (self.end_value - self.start_value) * progress


def policy_distribution(discrete: bool, stats: dict[str, torch.Tensor]) -> torch.distributions.Distribution:
    """The policy's distribution from its statistics (the same family the acting policy samples from)."""
    if discrete:
        return torch.distributions.Categorical(logits=stats["logits"])
    return IndependentNormal(stats["loc"], stats["scale"])


def poisson_plan(rng: np.random.Generator, replay_ratio: float, on_policy_first: bool) -> list[float]:
    """ACER Algorithm 1: an on-policy step on the fresh batch, then n ~ Poisson(replay_ratio) replay steps."""
    plan = [1.0] if on_policy_first else []
    return plan + [0.0] * int(rng.poisson(replay_ratio)) if replay_ratio > 0 else plan


def sequence_mask(td: TensorDictBase) -> torch.Tensor:
    """``[B, T, 1]`` bool mask of real (not padding) steps; all True when the batch has none."""
    mask = padding_mask(td)
    return torch.ones(*td.shape, 1, dtype=torch.bool, device=td.device) if mask is None else mask


def padding_mask(td: TensorDictBase) -> torch.Tensor | None:
    """``[*td.shape, 1]`` bool mask of real steps when the batch has padding, else None (every step is real:
    :func:`masked_mean` then takes the plain mean, with no mask arithmetic in the graph)."""
    mask = td.get(MASK_KEY, None)
    return None if mask is None else mask.reshape(*td.shape, 1)


def trace_cut(done: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``done`` for the estimators' trace cutting: also True on the last real step before padding, so that
    the recursion bootstraps on ``V(s_{t+1})`` there instead of reading the padding row."""
    next_real = torch.zeros_like(mask)
    next_real[..., :-1, :] = mask[..., 1:, :]
    return done | ~next_real


def masked_mean(value: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``value`` over the real steps (mask broadcast on the trailing dims; None: every step)."""
    if mask is None:
        return value.mean()
    mask = mask.expand_as(value).to(value.dtype)
    return (value * mask).sum() / mask.sum().clamp_min(1.0)


def window_weight(td: TensorDictBase, key: NestedKey) -> torch.Tensor | None:
    """``[B, T, 1]`` importance weight of each step's window (a prioritized replay's ``key``, repeated along time),
    None when the batch has none (a uniform replay: every loss term is the plain :func:`masked_mean`)."""
    weight = td.get(key, None)
    return None if weight is None else weight.reshape(*td.shape, 1)


def weighted_mean(value: torch.Tensor, mask: torch.Tensor | None, weight: torch.Tensor | None) -> torch.Tensor:
    """:func:`masked_mean` with each step counted ``weight`` times (PER's importance weights, Schaul et al. 2016,
    sec. 3.4: ``sum w m v / sum m``); ``weight`` None: :func:`masked_mean` itself."""
    if weight is None:
        return masked_mean(value, mask)
    weight = weight.expand_as(value).to(value.dtype)
    if mask is None:
        return (value * weight).mean()
    mask = mask.expand_as(value).to(value.dtype)
    return (value * mask * weight).sum() / mask.sum().clamp_min(1.0)


@torch.no_grad()
def window_priority(td_error: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]``: each window's mean absolute TD error over its real steps (``td_error`` and ``mask`` ``[B, T, 1]``),
    the priority of a prioritized sequence replay (Reactor ICLR sec. 3.3)."""
    mask = mask.expand_as(td_error).to(td_error.dtype)
    return (td_error.abs() * mask).flatten(1).sum(-1) / mask.flatten(1).sum(-1).clamp_min(1.0)


def observation_keys(in_keys: Sequence[NestedKey], hidden_keys: Sequence[str]) -> list[NestedKey]:
    """The keys of ``in_keys`` that describe the state itself (not the recurrent state nor ``is_init``):
    what a step's ``("next", ...)`` must hold to evaluate the network on ``s_{t+1}``."""
    return [k for k in in_keys if k not in hidden_keys and k != "is_init"]


def close_segments_at_padding(td: TensorDictBase, mask: torch.Tensor) -> TensorDictBase:
    """A shallow copy of ``td`` whose first padding step of each sequence is ``is_init``.

    TorchRL's ``LSTMModule`` in recurrent mode splits a sequence at ``is_init`` and writes, under
    ``("next", state)``, the state after the last step of every segment. With this flag a segment closes at
    the last real step, so the unroll's ``("next", state)`` there is the state after that step (the one
    :func:`next_state_values` bootstraps from); padding outputs are masked out anyway.
    """
    out = td.copy()
    after_real = torch.zeros_like(mask)
    after_real[..., 1:, :] = mask[..., :-1, :] & ~mask[..., 1:, :]
    out.set("is_init", out.get("is_init") | after_real)
    return out


def _next_step_inputs(
    td: TensorDictBase,
    unrolled: TensorDictBase | None,
    rows: torch.Tensor,
    in_keys: Sequence[NestedKey],
    hidden_keys: Sequence[str],
) -> TensorDictBase:
    """The inputs of ``s_{t+1}`` at the steps ``rows`` (``[B, T]`` bool) as ``[N]`` single steps: the stored
    ``("next", ...)`` observation and, when recurrent, the state ``unrolled`` reached after step ``t``."""
    step = td.get("next")[rows].select(*observation_keys(in_keys, hidden_keys))
    for key in hidden_keys:
        step.set(key, unrolled.get(("next", key))[rows])
    if hidden_keys:
        step.set("is_init", torch.zeros(*step.shape, 1, dtype=torch.bool, device=step.device))
    return step


def shift_in_bootstraps(value: torch.Tensor, bootstrap: torch.Tensor, bootstrap_value: torch.Tensor | None) -> torch.Tensor:
    """``V(s_{t+1})`` for every step, ``[B, T, 1]``: row ``t+1``'s ``value``, and ``bootstrap_value`` (``[N, 1]``,
    in row-major order) at the ``bootstrap`` steps, where row ``t+1`` is not ``s_{t+1}``."""
    next_value = torch.cat([value[..., 1:, :], value[..., -1:, :]], dim=-2)
    if bootstrap_value is not None:
        next_value[bootstrap.squeeze(-1)] = bootstrap_value
    return next_value


@torch.no_grad()
def next_state_values(
    td: TensorDictBase,
    unrolled: Mapping,
    value: torch.Tensor,
    bootstrap: torch.Tensor,
    in_keys: Sequence[NestedKey],
    hidden_keys: Sequence[str],
    evaluate: Callable[[TensorDictBase], torch.Tensor],
) -> torch.Tensor:
    """``V(s_{t+1})`` for every step of a ``[B, T]`` batch, ``[B, T, 1]`` (ACER Alg. 2-3's
    ``Q^ret <- V(x_k)``; V-trace's ``V(x_{s+n})``, IMPALA eq. 1).

    Inside an episode it is ``value`` of row ``t+1``. At ``bootstrap`` steps (window ends, the last real
    step before padding, truncations) row ``t+1`` is not ``s_{t+1}``: there ``evaluate`` (the network whose
    inputs are ``in_keys``) runs once more on the :func:`observation_keys` under ``"next"``, as single
    steps, ``[N] -> [N, 1]``. When recurrent, it starts from the state the learning network's own unroll
    reached after step ``t`` (``unrolled``'s ``("next", hidden_keys)``, written at the end of each segment;
    see :func:`close_segments_at_padding`), not from the state stored at acting time: a replayed sequence's
    state is refreshed at its start (LASER App. A.2) and the unroll carries it on, while the stored next
    state belongs to the network that acted. (Reactor bootstraps inside its ``T + 1``-step unroll instead.)
    """
    rows = bootstrap.squeeze(-1)
    if not rows.any():
        return shift_in_bootstraps(value, bootstrap, None)
    with set_recurrent_mode(False):
        bootstrap_value = evaluate(_next_step_inputs(td, unrolled, rows, in_keys, hidden_keys))
    return shift_in_bootstraps(value, bootstrap, bootstrap_value)


def evaluate_with_next_steps(
    evaluate: Callable[[TensorDictBase | dict[NestedKey, torch.Tensor]], Mapping],
    td: TensorDictBase,
    inputs: TensorDictBase,
    bootstrap: torch.Tensor,
    in_keys: Sequence[NestedKey],
    hidden_keys: Sequence[str],
) -> tuple[Mapping, Mapping | None]:
    """The network ``evaluate`` on every step of ``inputs`` (``[B, T]``) and on ``s_{t+1}`` of the
    ``bootstrap`` steps of ``td`` (``[N]``, None when there are none), as :func:`next_state_values` defines it;
    its outputs by key: TensorDicts, or dicts of tensors where
    :class:`~acer_torchrl.objectives.network_call.NetworkCall` calls the network on tensors.

    Feed-forward networks take both in one pass: the ``N`` stored next observations appended to the
    ``B * T`` steps (one forward instead of two; the appended rows feed only detached targets, so the
    gradient is the same), handed to ``evaluate`` as a dict of ``[B * T + N, ...]`` tensors. Recurrent ones
    unroll first and then take the ``N`` single steps without gradient, from the state the unroll reached.
    """
    rows = bootstrap.squeeze(-1)
    if hidden_keys or not rows.any():
        out = evaluate(inputs)
        if not rows.any():
            return out, None
        with torch.no_grad(), set_recurrent_mode(False):
            return out, evaluate(_next_step_inputs(td, out, rows, in_keys, hidden_keys))
    n = inputs.numel()
    steps = {}
    for key in observation_keys(in_keys, hidden_keys):
        now = inputs.get(key)
        steps[key] = torch.cat([now.reshape(n, *now.shape[inputs.ndim:]), td.get(("next", key))[rows]], 0)
    out = evaluate(steps)
    if isinstance(out, TensorDictBase):
        return out[:n].reshape(inputs.shape), out[n:]
    return {k: v[:n].reshape(*inputs.shape, *v.shape[1:]) for k, v in out.items()}, {k: v[n:] for k, v in out.items()}
