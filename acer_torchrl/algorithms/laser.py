"""LASER (Schmitt et al. 2020) for the pipeline: its network and :func:`build` (config -> :class:`Agent`).

The loss is :class:`acer_torchrl.objectives.laser.LASERLoss`; the ``laser.*`` keys and presets are in
:mod:`acer_torchrl.settings.laser`.
"""

from __future__ import annotations

from tensordict.nn import TensorDictModule
from torch import nn

from acer_torchrl.agent import Agent
from acer_torchrl.algorithms import loss_options
from acer_torchrl.config import Config
from acer_torchrl.envs import EnvInfo
from acer_torchrl.modules import GaussianHead, acting_policy, learning_module, make_torso
from acer_torchrl.objectives.laser import LASERLoss
from acer_torchrl.objectives.names import policy_keys
from acer_torchrl.objectives.updaters import target_updater
from acer_torchrl.settings.laser import BUILD_READS, LASERConfig


def build(cfg: Config, info: EnvInfo) -> Agent:
    """One network with a shared torso, a policy head and a value head (IMPALA's agent, sec. 5.1)."""
    net, algo = cfg.network, cfg.algo
    torso = make_torso(info, net.hidden, net.activation, net.lstm_hidden if net.lstm else None)
    names = policy_keys(info.discrete)
    if info.discrete:
        head: nn.Module = nn.Linear(torso.out_dim, info.num_actions)
    else:
        head = GaussianHead(torso.out_dim, info.action_dim, algo.init_std, algo.learn_std)
    value_head = nn.Linear(torso.out_dim, 1)
    network = learning_module(
        torso,
        TensorDictModule(head, in_keys=["core"], out_keys=names),
        TensorDictModule(value_head, in_keys=["core"], out_keys=["state_value"]),
    )
    loss = LASERLoss(
        network,
        **loss_options(
            algo, LASERLoss, BUILD_READS, discrete=info.discrete, gamma=cfg.gamma, hidden_keys=torso.hidden_keys,
        ),
    )
    updaters = [target_updater(loss, algo.target_update)] if algo.target_update else []
    return Agent(loss=loss, policy=acting_policy(torso, head, info), torsos=[torso], updaters=updaters)
