"""ACER (Wang et al. 2017) for the pipeline: its networks and :func:`build` (config -> :class:`Agent`).

The loss is :class:`acer_torchrl.objectives.acer.ACERLoss`; the ``acer.*`` keys and presets are in
:mod:`acer_torchrl.settings.acer` (no torch there, so ``--help`` prints at once).
"""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule
from torch import nn

from acer_torchrl.agent import Agent
from acer_torchrl.algorithms import loss_options
from acer_torchrl.config import Config, ConfigError
from acer_torchrl.envs import EnvInfo
from acer_torchrl.estimates.standardization import FittedStandardization
from acer_torchrl.modules import (
    GaussianHead, MLPEncoder, StandardizedEncoder, acting_policy, learning_module, make_encoder, make_torso,
)
from acer_torchrl.objectives.acer import ACERLoss
from acer_torchrl.objectives.names import policy_keys
from acer_torchrl.objectives.updaters import average_updater, target_updater
from acer_torchrl.settings.acer import BUILD_READS, ACERConfig


class SDNAdvantage(nn.Module):
    """The advantage stream ``A(x, a)`` of the stochastic dueling network (ACER eq. 13): a small MLP on
    the torso's features and the action ("an additional small network that computes the stochastic A
    values", sec. 6)."""

    def __init__(self, core_dim: int, action_dim: int, hidden: list[int], act: str = "relu"):
        super().__init__()
        self.mlp = MLPEncoder(core_dim + action_dim, hidden, act)
        self.out = nn.Linear(self.mlp.out_dim, 1)

    def forward(self, core: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        core = core.expand(*action.shape[:-1], core.shape[-1])
        return self.out(self.mlp(torch.cat([core, action], -1)))


def build(cfg: Config, info: EnvInfo) -> Agent:
    """Networks of ``cfg.network`` on one torso: policy head + Q head (discrete) or Gaussian policy +
    V head + SDN advantage network (continuous); the loss; the acting policy; the average-policy updater."""
    a: ACERConfig = cfg.algo
    if a.target_update and not info.discrete:
        name, values = cfg.preset_values() or (None, {})
        whose = (f" (preset={name} sets it; the continuous presets pendulum and mujoco do not)"
                 if values.get("acer.target_update") == a.target_update else "")
        raise ConfigError(f"acer.target_update={a.target_update} is for discrete actions; {cfg.env.name} has "
                          f"continuous ones: set acer.target_update=0{whose}")
    net = cfg.network
    encoder = None
    if a.standardize:
        if len(info.obs_shape) != 1:
            raise ConfigError(f"acer.standardize=true needs vector observations; {cfg.env.name} gives "
                              f"{tuple(info.obs_shape)}: set acer.standardize=false")
        encoder = StandardizedEncoder(make_encoder(info, net.hidden, net.activation), info.obs_shape[0])
    torso = make_torso(info, net.hidden, net.activation, net.lstm_hidden if net.lstm else None, encoder=encoder)
    if a.bound_mean and info.discrete:
        raise ConfigError(f"acer.bound_mean=true bounds a Gaussian policy's mean; {cfg.env.name} has discrete actions: "
                          f"set acer.bound_mean=false")
    if info.discrete:
        policy_head = nn.Linear(torso.out_dim, info.num_actions)
        critic = TensorDictModule(nn.Linear(torso.out_dim, info.num_actions), ["core"], ["action_value"])
        advantage = None
        nn.init.orthogonal_(policy_head.weight, gain=0.01)  # start near the uniform policy
        nn.init.zeros_(policy_head.bias)
    else:
        bounds = (torch.tensor(info.action_low), torch.tensor(info.action_high)) if a.bound_mean else None
        policy_head = GaussianHead(torso.out_dim, info.action_dim, a.init_std, a.learn_std, bounds)
        critic = TensorDictModule(nn.Linear(torso.out_dim, 1), ["core"], ["state_value"])
        advantage = SDNAdvantage(torso.out_dim, info.action_dim, a.sdn_hidden, net.activation)
        nn.init.orthogonal_(policy_head.loc.weight, gain=0.01)
        nn.init.zeros_(policy_head.loc.bias)
    actor = learning_module(torso, TensorDictModule(policy_head, ["core"], policy_keys(info.discrete)))
    loss = ACERLoss(
        actor,
        critic,
        advantage,
        **loss_options(
            a, ACERLoss, BUILD_READS, discrete=info.discrete, gamma=cfg.gamma,
            hidden_keys=torso.hidden_keys, on_policy=info.discrete if a.on_policy is None else a.on_policy,
        ),
    )
    if not (loss.on_policy or loss.replay_ratio):  # acer.on_policy=false with it is refused by the config already
        raise ConfigError(f"acer.replay_ratio=0 never updates on {cfg.env.name}: with continuous actions ACER takes "
                          "no on-policy update (sec. 6); raise acer.replay_ratio or set acer.on_policy=true")
    if encoder is not None and loss.on_policy:
        raise ConfigError("acer.standardize=true fits the state statistics at replay.min_size stored steps, before the "
                          "first replay update; an on-policy update would train the network on raw states before "
                          "that: set acer.on_policy=false")
    updaters = [average_updater(loss, a.alpha, ("actor_network",))] if a.trust_region else []
    if a.target_update:
        updaters.append(target_updater(loss, a.target_update, ("value_network",)))
    estimates = None if encoder is None else FittedStandardization(loss, encoder.standardize, cfg.replay.min_size)
    return Agent(loss=loss, policy=acting_policy(torso, policy_head, info), torsos=[torso], updaters=updaters,
                 estimates=estimates)
