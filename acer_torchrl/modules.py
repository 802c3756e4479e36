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

from dataclasses import dataclass, field

import torch
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn
from torchrl.envs.transforms import Transform
from torchrl.modules import LSTMModule, ProbabilisticActor
from torchrl.modules.distributions import IndependentNormal
from torchrl.envs.utils import ExplorationType

from acer_torchrl.envs import MINATAR_GRID, EnvInfo

BEHAVIOUR = "behaviour"  # root key of the statistics written at acting time

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
    """The DQN/A3C "Nature" convolutional encoder (Mnih et al. 2015) for uint8 [C, 84, 84] frames (0-255)."""

    def __init__(self, in_channels: int, out_dim: int = 512):
        conv = nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        super().__init__(conv, nn.Sequential(nn.Linear(64 * 7 * 7, out_dim), nn.ReLU()), out_dim, pixel_max=255.0)


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
    (ACER's MuJoCo setting, sigma = 0.3) or a learned state-independent parameter through Softplus."""

    def __init__(self, in_dim: int, action_dim: int, init_std: float = 0.3, learn_std: bool = True):
        super().__init__()
        self.loc = nn.Linear(in_dim, action_dim)
        raw = torch.log(torch.expm1(torch.full((action_dim,), float(init_std))))  # softplus^-1
        if learn_std:
            self.raw_std = nn.Parameter(raw)
        else:
            self.register_buffer("raw_std", raw)

    def forward(self, core: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.loc(core)
        return loc, nn.functional.softplus(self.raw_std).expand_as(loc)


def policy_keys(info: EnvInfo) -> list[str]:
    """Names of the distribution statistics phi (ACER sec. 3.3): logits, or loc and scale."""
    return ["logits"] if info.discrete else ["loc", "scale"]


def acting_policy(torso: Torso, policy_head: nn.Module, info: EnvInfo) -> ProbabilisticActor:
    """Stochastic acting policy: torso + ``policy_head`` writing behaviour statistics, then a sampler.

    ``policy_head`` maps ``"core"`` to the statistics of :func:`policy_keys`. The sampled action's
    log-probability goes to ``("behaviour", "log_prob")``. Under ``ExplorationType.DETERMINISTIC`` the
    same module acts greedily (argmax / mean), which is what evaluation uses.
    """
    names = policy_keys(info)
    stats = TensorDictModule(policy_head, in_keys=["core"], out_keys=[(BEHAVIOUR, n) for n in names])
    dist = torch.distributions.Categorical if info.discrete else IndependentNormal
    return ProbabilisticActor(
        TensorDictSequential(*torso.module, stats),
        in_keys={n: (BEHAVIOUR, n) for n in names},
        out_keys=["action"],
        distribution_class=dist,
        return_log_prob=True,
        log_prob_key=(BEHAVIOUR, "log_prob"),
        default_interaction_type=ExplorationType.RANDOM,
    )


def policy_distribution(info: EnvInfo, stats: dict[str, torch.Tensor]) -> torch.distributions.Distribution:
    """The policy's distribution from its statistics (the same family the acting policy samples from)."""
    if info.discrete:
        return torch.distributions.Categorical(logits=stats["logits"])
    return IndependentNormal(stats["loc"], stats["scale"])


def learning_module(torso: Torso, *heads: TensorDictModuleBase) -> TensorDictSequential:
    """Torso followed by heads, for the loss (the trainer runs it under
    ``torchrl.modules.set_recurrent_mode(True)``: [B, T] sequences, state resets on ``is_init``)."""
    return TensorDictSequential(*torso.module, *heads)
