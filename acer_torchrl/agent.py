"""The :class:`Agent`: everything one algorithm hands to the shared trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torchrl.envs.transforms import Transform

from acer_torchrl.modules import Torso
from acer_torchrl.objectives.common import ReplayLoss
from acer_torchrl.objectives.names import PRIORITY_KEY, PRIORITY_WEIGHT_KEY


@dataclass
class Agent:
    """Networks and loss of one algorithm.

    Attributes:
        loss: the loss module (owns every trained network, target / average networks included).
        policy: the stochastic acting policy (CPU, shipped to the collector workers); under
            ``ExplorationType.DETERMINISTIC`` it is the greedy evaluation policy.
        torsos: the recurrent torsos whose state rides in collected steps (empty when feed-forward).
        updaters: objects with ``step()`` called after every optimiser step (target / average networks).
        estimates: per-step estimates kept beside the replay, which the loss reads from its batches (V-RACER's
            :class:`~acer_torchrl.estimates.vracer.VRACEREstimates`); the trainer calls them through
            :meth:`after_extend`, :meth:`before_update` and :meth:`after_update`, and checkpoints their
            ``state_dict()``. None: the loss needs nothing but the replay's steps.
    """

    loss: ReplayLoss
    policy: TensorDictModuleBase
    torsos: list[Torso] = field(default_factory=list)
    updaters: list[Any] = field(default_factory=list)
    estimates: Any = None

    def after_extend(self, replay) -> None:
        """After each collected batch is stored in ``replay``: the new steps' estimates."""
        if self.estimates is not None:
            self.estimates.after_extend(replay)

    def before_update(self, sample: TensorDictBase, replay) -> TensorDictBase:
        """On each batch drawn for an update, before the loss: ``sample`` with the estimates the loss reads."""
        return sample if self.estimates is None else self.estimates.before_update(sample, replay)

    def after_update(self, sample: TensorDictBase, output: TensorDictBase, replay) -> None:
        """After each optimiser step, with the batch and the loss's output it used (write-backs, controllers); a
        prioritized replay's batch gives its windows their new priorities (the loss's ``"priority"``)."""
        if PRIORITY_WEIGHT_KEY in sample.keys():
            replay.update_priorities(sample, output.get(PRIORITY_KEY))
        if self.estimates is not None:
            self.estimates.after_update(sample, output, replay)

    @property
    def value_keys(self) -> tuple[str, ...]:
        """The update's output entries that are value estimates (:attr:`ReplayLoss.value_keys` and the estimates')."""
        return (*self.loss.value_keys, *getattr(self.estimates, "value_keys", ()))

    @property
    def recurrent(self) -> bool:
        return any(t.recurrent for t in self.torsos)

    @property
    def hidden_keys(self) -> list[str]:
        return [k for t in self.torsos for k in t.hidden_keys]

    @property
    def activation_keys(self) -> list[str]:
        """Features the acting policy writes into every step on its way to the action (``"embed"``,
        ``"core"``): every loss recomputes them from the observation, so the replay does not store them."""
        return [k for k in self.policy.out_keys if isinstance(k, str) and k != "action"]

    @property
    def env_transforms(self) -> list[Transform]:
        """Primers declaring the recurrent state keys to the env (fresh copies for each env)."""
        return [p.clone() for t in self.torsos for p in t.primers]

    @property
    def unroll(self) -> TensorDictModuleBase:
        """The recurrent torsos in one module: observation/is_init/state -> ("next", state)."""
        return TensorDictSequential(*[t.module for t in self.torsos if t.recurrent])
