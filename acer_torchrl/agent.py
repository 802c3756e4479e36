"""The :class:`Agent`: everything one algorithm hands to the shared trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torchrl.envs.transforms import Transform

from acer_torchrl.modules import Torso
from acer_torchrl.objectives.common import ReplayLoss


@dataclass
class Agent:
    """Networks and loss of one algorithm.

    Attributes:
        loss: the loss module (owns every trained network, target / average networks included).
        policy: the stochastic acting policy (CPU, shipped to the collector workers); under
            ``ExplorationType.DETERMINISTIC`` it is the greedy evaluation policy.
        torsos: the recurrent torsos whose state rides in collected steps (empty when feed-forward).
        updaters: objects with ``step()`` called after every optimiser step (target / average networks).
    """

    loss: ReplayLoss
    policy: TensorDictModuleBase
    torsos: list[Torso] = field(default_factory=list)
    updaters: list[Any] = field(default_factory=list)

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
