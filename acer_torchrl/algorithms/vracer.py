"""V-RACER with ReF-ER (Novati & Koumoutsakos 2019) for the pipeline: App. A's network and :func:`build`
(config -> :class:`Agent`).

The loss is :class:`acer_torchrl.objectives.vracer.VRACERLoss`; the ``vracer.*`` keys and presets are in
:mod:`acer_torchrl.settings.vracer`.
"""

from __future__ import annotations

import math

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from acer_torchrl.agent import Agent
from acer_torchrl.algorithms import Algorithm, loss_options
from acer_torchrl.config import Config, ConfigError
from acer_torchrl.envs import EnvInfo
from acer_torchrl.modules import ActingPolicy, BehaviourSampler, GaussianHead, MLPEncoder, learning_module, make_torso
from acer_torchrl.objectives.names import BEHAVIOUR
from acer_torchrl.objectives.vracer import Standardize, VRACERLoss
from acer_torchrl.settings.vracer import DEFAULT_PRESET, PRESETS, VRACERConfig


class StandardizedMLP(nn.Sequential):
    """App. A's MLP (2x128 Softsign) behind the state standardisation; ``out_dim`` for ``make_torso``."""

    def __init__(self, obs_dim: int, hidden: list[int], act: str, eps: float = 1e-7):
        mlp = MLPEncoder(obs_dim, hidden, act)
        super().__init__(Standardize(obs_dim, eps), mlp)
        self.out_dim = mlp.out_dim
        for layer in mlp:
            if isinstance(layer, nn.Linear):  # Glorot & Bengio uniform (App. A)
                nn.init.xavier_uniform_(layer.weight)
                nn.init.zeros_(layer.bias)

    @property
    def standardize(self) -> Standardize:
        return self[0]


def _small_init(layer: nn.Linear) -> None:
    """App. A output layer: ``U[-0.1 / sqrt(f_i), 0.1 / sqrt(f_i)]`` (near-zero outputs at the start)."""
    bound = 0.1 / math.sqrt(layer.in_features)
    nn.init.uniform_(layer.weight, -bound, bound)
    nn.init.zeros_(layer.bias)


class VRACERHead(nn.Module):
    """The linear outputs of V-RACER's single network (sec. 2, App. A): ``V(s)``, the Gaussian mean and
    the state-independent std (Softplus of a parameter, initialised to ``init_std``).

    Mean and std live in [-1, 1] action units and are mapped linearly to the env's bounds,
    ``a' = c + a (high - low) / 2`` (App. B), so stored behaviour statistics and actions are in env units.
    """

    def __init__(self, in_dim: int, low: torch.Tensor, high: torch.Tensor, init_std: float):
        super().__init__()
        self.value = nn.Linear(in_dim, 1)
        self.policy = GaussianHead(in_dim, low.numel(), init_std, learn_std=True)
        _small_init(self.value)
        _small_init(self.policy.loc)
        self.register_buffer("center", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)

    def forward(self, core: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        loc, std = self.policy(core)
        return self.value(core), self.center + self.half_range * loc, self.half_range * std


class _PolicyStats(nn.Module):
    """The head's policy outputs only (the acting policy records ``mu``, not ``V``)."""

    def __init__(self, head: VRACERHead):
        super().__init__()
        self.head = head

    def forward(self, core: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(core)[1:]


def acting_policy(network: TensorDictSequential, head: VRACERHead, width: float) -> ActingPolicy:
    """The torso and the head's policy outputs writing ``("behaviour", "loc"/"scale")``, then a draw of the
    truncated normal writing ``"action"`` and ``("behaviour", "log_prob")`` (Algorithm 2; the mean under a greedy
    exploration type)."""
    stat_keys = [(BEHAVIOUR, "loc"), (BEHAVIOUR, "scale")]
    stats = TensorDictModule(_PolicyStats(head), in_keys=["core"], out_keys=stat_keys)
    sampler = TensorDictModule(
        BehaviourSampler(discrete=False, truncation=width), in_keys=stat_keys, out_keys=["action", (BEHAVIOUR, "log_prob")]
    )
    return ActingPolicy(*network, stats, sampler)


def build(cfg: Config, info: EnvInfo) -> Agent:
    """One MLP with a value, a mean and a std output (sec. 2, App. A) and the V-RACER loss."""
    if info.discrete:
        raise ConfigError(f"loss=vracer needs continuous actions; env.name={cfg.env.name} has discrete ones")
    if len(info.obs_shape) != 1:
        raise ConfigError(f"loss=vracer needs vector observations; env.name={cfg.env.name} gives {info.obs_shape}")
    net, algo = cfg.network, cfg.algo
    encoder = StandardizedMLP(info.obs_shape[0], net.hidden, net.activation, algo.epsilon)
    torso = make_torso(info, net.hidden, net.activation, encoder=encoder)
    low, high = torch.tensor(info.action_low), torch.tensor(info.action_high)
    head = VRACERHead(torso.out_dim, low, high, algo.init_std)
    keys = VRACERLoss.default_keys
    network = learning_module(
        torso, TensorDictModule(head, in_keys=["core"], out_keys=[keys.value, keys.loc, keys.scale])
    )
    loss = VRACERLoss(
        network,
        encoder.standardize,
        **loss_options(algo, VRACERLoss, gamma=cfg.gamma, n_start=cfg.replay.min_size, lr=cfg.optim.lr),
    )
    return Agent(loss=loss, policy=acting_policy(torso.module, head, algo.truncation), torsos=[torso])


ALGORITHM = Algorithm("vracer", VRACERConfig, build, PRESETS, default_preset=DEFAULT_PRESET)
