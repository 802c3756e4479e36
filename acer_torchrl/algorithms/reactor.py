"""Reactor (Gruslys et al. 2018) for the pipeline: Table 1's networks and :func:`build` (config -> :class:`Agent`).

The loss is :class:`acer_torchrl.objectives.reactor.ReactorLoss`; the ``reactor.*`` keys and presets are in
:mod:`acer_torchrl.settings.reactor`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from acer_torchrl.agent import Agent
from acer_torchrl.algorithms import loss_options
from acer_torchrl.config import Config, ConfigError
from acer_torchrl.envs import MINATAR_GRID, EnvInfo
from acer_torchrl.modules import FrameEncoder, MinAtarCNN, Torso, acting_policy, make_torso
from acer_torchrl.objectives.reactor import ReactorLoss
from acer_torchrl.objectives.updaters import target_updater
from acer_torchrl.settings.reactor import BUILD_READS, ReactorConfig


# ----------------------------------------------------------------------------------------------
# Networks (Table 1)
# ----------------------------------------------------------------------------------------------


class CReLU(nn.Module):
    """Concatenated ReLU ``[relu(x), relu(-x)]`` (Shang et al. 2016; Reactor sec. 3.3): doubles the width."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(x), torch.relu(-x)], dim=-1)


class CReLUChannels(nn.Module):
    """CReLU over the channel dim of ``[N, C, H, W]`` feature maps."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(x), torch.relu(-x)], dim=-3)


class StopGradient(nn.Module):
    """Identity whose output carries no gradient: the pi and mu-hat branches read the shared encoder's
    features through it, so their losses never reach the encoder (sec. 3.3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach()


class ReactorMLP(nn.Sequential):
    """Vector-observation encoder: ``Linear(w) -> CReLU`` per width ``w`` (output ``2 w``)."""

    def __init__(self, in_dim: int, hidden: list[int]):
        layers: list[nn.Module] = []
        for width in hidden:
            layers += [nn.Linear(in_dim, width), CReLU()]
            in_dim = 2 * width
        super().__init__(*layers)
        self.out_dim = in_dim


class ReactorCNN(FrameEncoder):
    """Table 1's encoder for uint8 ``[C, 84, 84]`` frames: three convolutions (16, 32, 32 filters of 8/4/3
    pixels, strides 4/2/1), each followed by a CReLU, then ``Linear(128) -> CReLU`` (256 features)."""

    def __init__(self, in_channels: int, linear: int = 128):
        conv = nn.Sequential(
            nn.Conv2d(in_channels, 16, 8, stride=4), CReLUChannels(),
            nn.Conv2d(32, 32, 4, stride=2), CReLUChannels(),
            nn.Conv2d(64, 32, 3, stride=1), CReLUChannels(),
            nn.Flatten(),
        )
        super().__init__(conv, nn.Sequential(nn.Linear(64 * 7 * 7, linear), CReLU()), 2 * linear, pixel_max=255.0)


def _crelu_mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    """``Linear(hidden) -> CReLU -> Linear(out)`` (the head blocks of Table 1)."""
    return nn.Sequential(nn.Linear(in_dim, hidden), CReLU(), nn.Linear(2 * hidden, out_dim))


class MixedSoftmaxHead(nn.Module):
    """Policy head returning ``log((1 - eps) softmax(z) + eps / A)``: the softmax mixed with a fixed uniform
    distribution, hard-coded into the network (Table 1). Used for pi and for mu-hat; the acting policy
    samples from this very mixture, so the stored behaviour probabilities are the mixed ones."""

    def __init__(self, in_dim: int, hidden: int, num_actions: int, epsilon: float):
        super().__init__()
        self.net = _crelu_mlp(in_dim, hidden, num_actions)
        self.log_keep = math.log1p(-epsilon)
        self.log_uniform = math.log(epsilon / num_actions) if epsilon > 0 else -math.inf

    def forward(self, core: torch.Tensor) -> torch.Tensor:
        log_softmax = torch.log_softmax(self.net(core), dim=-1)
        if self.log_uniform == -math.inf:
            return log_softmax
        return torch.logaddexp(log_softmax + self.log_keep, torch.full_like(log_softmax, self.log_uniform))


def dueling(value: torch.Tensor, advantage: torch.Tensor, action_dim: int) -> torch.Tensor:
    """``V + A(a) - mean_b A(b)`` (Wang et al. 2015), the mean over the actions' dim ``action_dim`` of ``advantage``."""
    return value + advantage - advantage.mean(dim=action_dim, keepdim=True)


class DuelingHead(nn.Module):
    """``Q(x, a) = V(x) + A(x, a) - mean_b A(x, b)`` (Wang et al. 2015) with Table 1's value and advantage
    heads (``Linear(32) -> CReLU -> Linear``)."""

    def __init__(self, in_dim: int, hidden: int, num_actions: int):
        super().__init__()
        self.value = _crelu_mlp(in_dim, hidden, 1)
        self.advantage = _crelu_mlp(in_dim, hidden, num_actions)

    def forward(self, core: torch.Tensor) -> torch.Tensor:
        return dueling(self.value(core), self.advantage(core), -1)


class CategoricalDuelingHead(nn.Module):
    """The distributional critic's logits ``[.., A, N]`` (sec. 3.4.1): state-value logits ``[.., N]`` and advantage
    logits ``[.., A, N]`` from Table 1's heads, summed per atom, the advantages' mean over actions taken off as in
    :class:`DuelingHead` (Rainbow's form, Hessel et al. 2018); the loss takes the softmax over the atoms of each
    action, ``q_i(x, a)`` on the support ``z_i`` (eq. 5 of C51)."""

    def __init__(self, in_dim: int, hidden: int, num_actions: int, atoms: int):
        super().__init__()
        self.atoms = atoms
        self.value = _crelu_mlp(in_dim, hidden, atoms)
        self.advantage = _crelu_mlp(in_dim, hidden, num_actions * atoms)

    def forward(self, core: torch.Tensor) -> torch.Tensor:
        advantage = self.advantage(core).unflatten(-1, (-1, self.atoms))
        return dueling(self.value(core).unsqueeze(-2), advantage, -2)


def make_encoder(info: EnvInfo, hidden: list[int]) -> nn.Module:
    """Table 1's CNN for Atari frames, MinAtar's own network (Young & Tian 2019) for its 10x10 grids (Table 1's
    84x84 convolutions do not fit them), the CReLU MLP for vectors."""
    if len(info.obs_shape) == 3:
        cnn = MinAtarCNN if tuple(info.obs_shape[1:]) == MINATAR_GRID else ReactorCNN
        return cnn(info.obs_shape[0])
    if len(info.obs_shape) != 1:
        raise ConfigError(f"reactor: unsupported observation shape {tuple(info.obs_shape)}")
    return ReactorMLP(info.obs_shape[0], hidden)


@dataclass
class ReactorNetworks:
    """The modules of one Reactor agent (all sharing one encoder).

    ``network`` (learning) maps the observation sequence to ``"action_value"`` [.., A] (with ``atoms``: the
    categorical critic's ``"action_value_logits"`` [.., A, N] instead), ``"logits"`` (log pi, mixed) and, when
    learned, ``"mu_logits"`` (log mu-hat); ``q_network`` is its Q branch alone
    (encoder, Q LSTM, dueling head), run with the target parameters for Q_T. ``torsos`` are the Q, pi
    (and mu-hat) torsos whose recurrent states ride in collected steps; ``policy_head`` maps the pi torso's
    ``"core"`` to log pi.
    """

    network: TensorDictSequential
    q_network: TensorDictSequential
    torsos: list[Torso]
    policy_head: nn.Module


def make_networks(
    info: EnvInfo,
    hidden: list[int],
    lstm_hidden: int | None,
    head_hidden: int,
    epsilon: float,
    learned_behaviour: bool,
    atoms: int | None = None,
) -> ReactorNetworks:
    """Table 1: shared encoder, separate LSTMs (when ``lstm_hidden``) for Q, pi and mu-hat, dueling Q head
    (categorical with ``atoms``, sec. 3.4.1), uniform-mixed softmax heads; pi and mu-hat read the encoder through
    :class:`StopGradient`."""
    encoder = make_encoder(info, hidden)
    n = info.num_actions
    q_torso = make_torso(info, hidden, "relu", lstm_hidden, prefix="q_", encoder=encoder)
    if atoms is None:
        q_head = TensorDictModule(DuelingHead(q_torso.out_dim, head_hidden, n), ["q_core"], ["action_value"])
    else:
        q_head = TensorDictModule(CategoricalDuelingHead(q_torso.out_dim, head_hidden, n, atoms), ["q_core"],
                                  ["action_value_logits"])
    q_network = TensorDictSequential(*q_torso.module, q_head)
    shared = "q_embed" if lstm_hidden else "q_core"  # the encoder's output in the Q torso

    def branch(prefix: str, out_key: str) -> tuple[Torso, nn.Module, list[TensorDictModule]]:
        torso = make_torso(info, hidden, "relu", lstm_hidden, prefix=prefix, encoder=encoder)
        head = MixedSoftmaxHead(torso.out_dim, head_hidden, n, epsilon)
        stop = TensorDictModule(StopGradient(), [shared], [f"{prefix}embed" if lstm_hidden else f"{prefix}core"])
        modules = [stop, *([torso.lstm] if lstm_hidden else []), TensorDictModule(head, [f"{prefix}core"], [out_key])]
        return torso, head, modules

    pi_torso, pi_head, pi_modules = branch("", "logits")
    torsos, modules = [q_torso, pi_torso], [*q_network, *pi_modules]
    if learned_behaviour:
        mu_torso, _, mu_modules = branch("mu_", "mu_logits")
        torsos.append(mu_torso)
        modules += mu_modules
    return ReactorNetworks(TensorDictSequential(*modules), q_network, torsos, pi_head)


# ----------------------------------------------------------------------------------------------
# Build
# ----------------------------------------------------------------------------------------------


def build(cfg: Config, info: EnvInfo) -> Agent:
    rc: ReactorConfig = cfg.algo
    if not info.discrete:
        raise ConfigError(
            f"reactor needs a discrete action space and env.name={cfg.env.name} is continuous; "
            "use loss=acer, loss=vracer or loss=laser for continuous control"
        )
    atoms = rc.atoms  # the categorical critic's head, when distributional
    nets = make_networks(
        info,
        cfg.network.hidden,
        cfg.network.lstm_hidden if cfg.network.lstm else None,
        rc.head_hidden,
        rc.epsilon,
        rc.behaviour == "learned",
        atoms if rc.distributional else None,
    )
    hidden_keys = [key for t in nets.torsos for key in t.hidden_keys]
    loss = ReactorLoss(
        nets.network,
        nets.q_network,
        **loss_options(
            rc, ReactorLoss, BUILD_READS, gamma=cfg.gamma, learned_behaviour=rc.behaviour == "learned",
            hidden_keys=hidden_keys,
        ),
    )
    pi_torso = nets.torsos[1]
    policy = acting_policy(pi_torso, nets.policy_head, info)
    torsos = nets.torsos if cfg.network.lstm else []
    return Agent(loss=loss, policy=policy, torsos=torsos, updaters=[target_updater(loss, rc.target_update)])
