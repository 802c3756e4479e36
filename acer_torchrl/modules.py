"""Network building blocks shared by the four losses.

Every network is a chain of TensorDict modules over the keys of a collected step:

``"observation"`` --encoder--> ``"embed"`` --[LSTM core]--> ``"core"`` --heads--> loss-specific outputs.

The *acting* policy runs the torso and the policy head only, writes the behaviour statistics mu under
``("behaviour", ...)`` keys (``logits``; or ``loc`` and ``scale``) and the sampled action's log-probability
under ``("behaviour", "log_prob")``: they are stored in the replay at acting time and never recomputed.
The *learning* networks use the same ``nn.Module`` objects with plain output keys (``"logits"``...).
When recurrent, the LSTM core writes its state into every step (``"recurrent_state_h/c"``), and the env
gets the primer that declares them (:attr:`Torso.primers`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import distributions as D
from torch import nn
from torchrl.envs.transforms import Transform
from torchrl.modules import LSTMModule
from torchrl.envs.utils import ExplorationType, exploration_type

from acer_torchrl.envs import MINATAR_GRID, EnvInfo
from acer_torchrl.objectives.functional import truncated_normal_log_prob, truncated_normal_sample, truncation_log_z
from acer_torchrl.objectives.names import BEHAVIOUR, policy_keys


_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "softsign": nn.Softsign}


def activation(name: str) -> type[nn.Module]:
    return _ACTIVATIONS[name]


class MLPEncoder(nn.Sequential):
    """Fully connected encoder for vector observations."""

    def __init__(self, in_dim: int, hidden: list[int], act: str = "relu"):
        layers: list[nn.Module] = []
        for width in hidden:
            layers += [nn.Linear(in_dim, width), activation(act)()]
            in_dim = width
        super().__init__(*layers)
        self.out_dim = in_dim


class FrameEncoder(nn.Module):
    """``conv`` (ending in a flatten) then ``fc`` on uint8 ``[*B, C, H, W]`` frames.

    Frames are stored as uint8 once and converted to float (divided by ``pixel_max``, to [0, 1]) here, on
    the learner's device. Any number of leading batch dims is accepted.
    """

    def __init__(self, conv: nn.Sequential, fc: nn.Sequential, out_dim: int, pixel_max: float):
        super().__init__()
        self.conv, self.fc, self.out_dim, self.pixel_max = conv, fc, out_dim, pixel_max

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        batch = frames.shape[:-3]
        x = frames.reshape(-1, *frames.shape[-3:]).float().div_(self.pixel_max)
        return self.fc(self.conv(x)).reshape(*batch, self.out_dim)


class NatureCNN(FrameEncoder):
    """The DQN/A3C "Nature" convolutional encoder (Mnih et al. 2015) for uint8 [C, 84, 84] frames (0-255), its
    layers initialised orthogonally with ReLU's gain sqrt(2) and zero biases (as OpenAI Baselines' A2C/ACER/PPO):
    under torch's default init the features shrink layer by layer (mean 0.02 after the third convolution on Pong)
    and ACER's Pong networks went dead, nearly every unit off on every state (``benchmarks/results/gpu.md``)."""

    def __init__(self, in_channels: int, out_dim: int = 512):
        conv = nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        super().__init__(conv, nn.Sequential(nn.Linear(64 * 7 * 7, out_dim), nn.ReLU()), out_dim, pixel_max=255.0)
        for layer in self.modules():
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                nn.init.orthogonal_(layer.weight, gain=math.sqrt(2))
                nn.init.zeros_(layer.bias)


class MinAtarCNN(FrameEncoder):
    """MinAtar's network (Young & Tian 2019, the torso of its DQN and AC(lambda) baselines) for 0/1 uint8
    [C, 10, 10] grids: one convolution of 16 3x3 filters, stride 1, no padding (10x10 -> 8x8), ReLU, then a
    128-unit ReLU layer."""

    def __init__(self, in_channels: int, out_dim: int = 128):
        side = MINATAR_GRID[0] - 2  # a 3x3 "valid" convolution trims one cell on each side
        conv = nn.Sequential(nn.Conv2d(in_channels, 16, 3, stride=1), nn.ReLU(), nn.Flatten())
        super().__init__(conv, nn.Sequential(nn.Linear(16 * side * side, out_dim), nn.ReLU()), out_dim, pixel_max=1.0)


def make_encoder(info: EnvInfo, hidden: list[int], act: str) -> nn.Module:
    """MLP for vector observations; for uint8 [C, H, W] frames, MinAtar's network on MinAtar's 10x10 grids,
    the Nature CNN otherwise (Atari's 84x84)."""
    if len(info.obs_shape) == 3:
        cnn = MinAtarCNN if tuple(info.obs_shape[1:]) == MINATAR_GRID else NatureCNN
        return cnn(info.obs_shape[0])
    if len(info.obs_shape) != 1:
        raise ValueError(f"unsupported observation shape {tuple(info.obs_shape)}")
    return MLPEncoder(info.obs_shape[0], hidden, act)


@dataclass
class Torso:
    """``observation -> core`` features, optionally through an LSTM whose state rides in every step."""

    module: TensorDictSequential
    out_dim: int
    lstm: LSTMModule | None = None
    hidden_keys: list[str] = field(default_factory=list)  # state keys at the root of a step
    primers: list[Transform] = field(default_factory=list)  # env transforms declaring those keys

    @property
    def recurrent(self) -> bool:
        return self.lstm is not None


def make_torso(
    info: EnvInfo,
    hidden: list[int],
    act: str,
    lstm_hidden: int | None = None,
    prefix: str = "",
    encoder: nn.Module | None = None,
) -> Torso:
    """Encoder (+ LSTM core when ``lstm_hidden``) writing ``"<prefix>core"``.

    Passing an existing ``encoder`` shares it between torsos (Reactor's separate LSTMs on one encoder).
    """
    encoder = encoder if encoder is not None else make_encoder(info, hidden, act)
    if lstm_hidden is None:
        module = TensorDictSequential(
            TensorDictModule(encoder, in_keys=["observation"], out_keys=[f"{prefix}core"])
        )
        return Torso(module, encoder.out_dim)
    h_key, c_key = f"{prefix}recurrent_state_h", f"{prefix}recurrent_state_c"
    lstm = LSTMModule(
        input_size=encoder.out_dim,
        hidden_size=lstm_hidden,
        in_keys=[f"{prefix}embed", h_key, c_key],
        out_keys=[f"{prefix}core", ("next", h_key), ("next", c_key)],
    )
    module = TensorDictSequential(
        TensorDictModule(encoder, in_keys=["observation"], out_keys=[f"{prefix}embed"]), lstm
    )
    return Torso(module, lstm_hidden, lstm, [h_key, c_key], [lstm.make_tensordict_primer()])


class GaussianHead(nn.Module):
    """Diagonal Gaussian policy statistics: a state-dependent mean and a std that is either fixed
    (ACER's MuJoCo setting, sigma = 0.3) or a learned state-independent parameter through Softplus.
    With ``bounds`` (low, high) the mean is ``c + h tanh(x)``, inside them (``c``, ``h``: their centre and
    half-width); without, the linear layer's output."""

    def __init__(self, in_dim: int, action_dim: int, init_std: float = 0.3, learn_std: bool = True,
                 bounds: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        self.loc = nn.Linear(in_dim, action_dim)
        raw = torch.log(torch.expm1(torch.full((action_dim,), float(init_std))))  # softplus^-1
        if learn_std:
            self.raw_std = nn.Parameter(raw)
        else:
            self.register_buffer("raw_std", raw)
        self.bounded = bounds is not None
        if self.bounded:
            low, high = bounds
            self.register_buffer("center", (high + low) / 2)
            self.register_buffer("half_width", (high - low) / 2)

    def forward(self, core: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.loc(core)
        if self.bounded:
            loc = torch.addcmul(self.center, self.half_width, loc.tanh())
        return loc, nn.functional.softplus(self.raw_std).expand_as(loc)


class Standardize(nn.Module):
    """V-RACER's state standardisation (Novati & Koumoutsakos 2019, App. B, eq. 14-15),
    ``s_hat = (s - mu_s) / (sigma_s + eps)``; the identity until :meth:`fit`.

    ``mu_s`` and ``sigma_s`` are buffers: they are checkpointed with the loss and pushed to the collector
    workers with the policy's weights, so acting and learning see the same standardised states.
    """

    def __init__(self, dim: int, eps: float = 1e-7):
        super().__init__()
        self.eps = eps
        self.register_buffer("loc", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))

    @torch.no_grad()
    def fit(self, observations: torch.Tensor) -> None:
        """Mean and (population) std of ``observations`` ``[n, dim]`` (eq. 14-15)."""
        self.loc.copy_(observations.mean(0))
        self.scale.copy_(observations.std(0, correction=0))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.loc) / (self.scale + self.eps)


class StandardizedEncoder(nn.Sequential):
    """``encoder`` behind a :class:`Standardize` layer (``observation -> encoder(s_hat)``), for vector observations;
    ``out_dim`` for :func:`make_torso`. The layer is the identity until its statistics are fitted (V-RACER's
    :class:`~acer_torchrl.estimates.vracer.VRACEREstimates`, or
    :class:`~acer_torchrl.estimates.standardization.FittedStandardization` for any other agent)."""

    def __init__(self, encoder: nn.Module, obs_dim: int, eps: float = 1e-7):
        super().__init__(Standardize(obs_dim, eps), encoder)
        self.out_dim = encoder.out_dim

    @property
    def standardize(self) -> Standardize:
        return self[0]


class TruncatedGaussian(D.Independent):
    """Diagonal normal truncated at ``width`` std from its mean in every component (V-RACER's actions, Novati &
    Koumoutsakos 2019, App. A; its density and draws: ``objectives.functional.truncated_normal_*``).

    Sampling is exact (inverse CDF). ``log_prob`` is the truncated density inside the support,
    ``log N(a; m, s) - d log Z`` with ``Z = erf(width / sqrt 2)``: ``Z`` does not depend on ``m`` or ``s``,
    so ``rho = pi / mu`` is the ratio of the Gaussian densities, as in the paper. The deterministic action
    (evaluation) is the mean. The distribution class for a ``ProbabilisticActor`` acting for this loss in a plain
    TorchRL loop; this package's own acting policy draws the same actions without a distribution object
    (``modules.BehaviourSampler`` with ``truncation``: ``tests/test_modules.py`` compares the two).
    """

    has_rsample = True

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, width: float = 3.0):
        super().__init__(D.Normal(loc, scale, validate_args=False), 1, validate_args=False)
        self.width = width
        self._log_z = truncation_log_z(width)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        base = self.base_dist
        return truncated_normal_sample(base.loc.expand(self._extended_shape(sample_shape)), base.scale, self.width)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return truncated_normal_log_prob(value, self.base_dist.loc, self.base_dist.scale, self._log_z)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        return self.base_dist.loc

    @property
    def mean(self) -> torch.Tensor:
        return self.base_dist.loc


class BehaviourSampler(nn.Module):
    """The acting policy's last step: the action drawn from the behaviour statistics and its log-probability.

    Categorical logits, or a diagonal Gaussian's ``loc`` and ``scale`` (with ``truncation``: the normal truncated at
    that many std, V-RACER's App. A). Under a greedy exploration type (``ExplorationType.DETERMINISTIC``, ``MODE`` or
    ``MEAN``: what evaluation sets) the action is the argmax / the mean; otherwise (``RANDOM``, or none set) a
    sample, drawn as ``Categorical.sample`` / ``Normal.sample`` / ``TruncatedGaussian.sample`` draw it. It stands
    in for ``ProbabilisticActor`` on the acting path, which rebuilds a distribution object and its TensorDict
    plumbing at every env step: a large share of a CartPole policy call
    (``benchmarks/results/learner.md``).
    """

    GREEDY = (ExplorationType.DETERMINISTIC, ExplorationType.MODE, ExplorationType.MEAN)

    def __init__(self, discrete: bool, truncation: float | None = None):
        super().__init__()
        self.discrete = discrete
        self.truncation = truncation

    def forward(self, *stats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        greedy = exploration_type() in self.GREEDY
        if self.discrete:
            log_p = stats[0].log_softmax(-1)
            if greedy:
                action = log_p.argmax(-1)
            else:
                flat = log_p.exp().reshape(-1, log_p.shape[-1])
                try:
                    action = torch.multinomial(flat, 1, True).reshape(log_p.shape[:-1])
                except RuntimeError:  # probabilities not finite (the logits overflowed), checked by multinomial at no
                    # cost to a finite policy. Not raised: a collector's worker would die of it with a traceback. The
                    # steps' log-probability is NaN instead, on which the trainer ends the run in one line.
                    nan = torch.full(log_p.shape[:-1], float("nan"), dtype=log_p.dtype, device=log_p.device)
                    return torch.zeros_like(nan, dtype=torch.long), nan
            return action, log_p.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        loc, scale = stats
        if self.truncation is not None:
            action = loc if greedy else truncated_normal_sample(loc, scale, self.truncation)
            return action, truncated_normal_log_prob(action, loc, scale, truncation_log_z(self.truncation))
        action = loc if greedy else torch.normal(loc, scale)
        return action, torch.distributions.Normal(loc, scale, validate_args=False).log_prob(action).sum(-1)


def acting_policy(torso: Torso, policy_head: nn.Module, info: EnvInfo) -> TensorDictSequential:
    """Stochastic acting policy: torso + ``policy_head`` writing behaviour statistics, then a
    :class:`BehaviourSampler` writing ``"action"`` and ``("behaviour", "log_prob")``.

    ``policy_head`` maps ``"core"`` to the statistics of :func:`~acer_torchrl.objectives.names.policy_keys`. Under
    ``ExplorationType.DETERMINISTIC`` the same module acts greedily (argmax / mean), which is what
    evaluation uses.
    """
    stat_keys = [(BEHAVIOUR, n) for n in policy_keys(info.discrete)]
    stats = TensorDictModule(policy_head, in_keys=["core"], out_keys=stat_keys)
    sampler = TensorDictModule(BehaviourSampler(info.discrete), in_keys=stat_keys, out_keys=["action", (BEHAVIOUR, "log_prob")])
    return TensorDictSequential(*torso.module, stats, sampler)


def learning_module(torso: Torso, *heads: TensorDictModuleBase) -> TensorDictSequential:
    """Torso followed by heads, for the loss (the trainer runs it under
    ``torchrl.modules.set_recurrent_mode(True)``: [B, T] sequences, state resets on ``is_init``)."""
    return TensorDictSequential(*torso.module, *heads)
