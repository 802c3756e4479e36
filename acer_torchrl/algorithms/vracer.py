"""V-RACER with ReF-ER (Novati & Koumoutsakos 2019) for the pipeline: App. A's network and :func:`build`
(config -> :class:`Agent`).

The loss is :class:`acer_torchrl.objectives.vracer.VRACERLoss`, its stored estimates
:class:`acer_torchrl.estimates.vracer.VRACEREstimates`; the ``vracer.*`` keys and presets are in
:mod:`acer_torchrl.settings.vracer`.

Deviation: the hidden-layer initialisation is Glorot's uniform ``sqrt(6 / (f_i + f_o))`` (App. A prints
``6 / sqrt(f_i + f_o)`` while citing Glorot & Bengio).
"""

from __future__ import annotations

import math

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torch.autograd.function import once_differentiable

from acer_torchrl.agent import Agent
from acer_torchrl.algorithms import loss_options
from acer_torchrl.config import Config, ConfigError
from acer_torchrl.envs import EnvInfo
from acer_torchrl.estimates.vracer import VRACEREstimates
from acer_torchrl.modules import (
    BehaviourSampler, GaussianHead, MLPEncoder, StandardizedEncoder, learning_module, make_torso,
)
from acer_torchrl.objectives.names import BEHAVIOUR
from acer_torchrl.objectives.vracer import VRACERLoss
from acer_torchrl.settings.vracer import BUILD_READS, VRACERConfig


class StandardizedMLP(StandardizedEncoder):
    """App. A's MLP (2x128 Softsign) behind the state standardisation (App. B, eq. 14-15)."""

    def __init__(self, obs_dim: int, hidden: list[int], act: str, eps: float = 1e-7):
        mlp = MLPEncoder(obs_dim, hidden, act)
        super().__init__(mlp, obs_dim, eps)
        for layer in mlp:
            if isinstance(layer, nn.Linear):  # Glorot & Bengio uniform (App. A)
                nn.init.xavier_uniform_(layer.weight)
                nn.init.zeros_(layer.bias)


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
        return self.value(core), *self.env_units(*self.policy(core))

    def env_units(self, loc: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's mean and std from [-1, 1] action units to the env's bounds (App. B)."""
        return self.center + self.half_range * loc, self.half_range * std


def softsign_and_denominator(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``nn.Softsign``'s ``x / (1 + |x|)`` (the same operations, the same bits) and its denominator ``1 + |x|``
    (what :func:`softsign_backward` reads)."""
    denominator = x.abs().add_(1.0)
    return x / denominator, denominator


def softsign_backward(grad: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``grad`` times Softsign's derivative ``1 / (1 + |x|)^2``."""
    return grad / (denominator * denominator)


class _NetworkFunction(torch.autograd.Function):
    """:class:`WrittenOutNetwork`'s forward as one autograd node, its backward written out (each step the
    derivative autograd takes of the modules' operation: the same kernels, hence the same bits, tested)."""

    @staticmethod
    def forward(ctx, network: WrittenOutNetwork, obs: torch.Tensor, *params: torch.Tensor):
        outputs, activations = network.evaluate(obs, params)
        ctx.network = network
        ctx.save_for_backward(*activations, *params)
        return outputs

    @staticmethod
    @once_differentiable
    def backward(ctx, d_value, d_loc, d_scale):
        saved = ctx.saved_tensors
        count = len(saved) - len(ctx.network.parameters())
        grads = ctx.network.gradients(saved[:count], saved[count:], d_value, d_loc, d_scale, ctx.needs_input_grad[1])
        return None, *grads


class WrittenOutNetwork:
    """App. A's network, :class:`StandardizedMLP` then :class:`VRACERHead` (``observation -> V, loc, scale``),
    evaluated with the modules' own operations and parameters, under autograd as one node whose backward is
    written out (:class:`_NetworkFunction`): the matrix products and Softsign derivatives of the MLP, the heads'
    affine maps and Softplus. Autograd's ~20 nodes for it (``addmm`` and transposes per layer, the Softsign
    nodes, the heads' ``mul``/``add``/``softplus``/``expand``) cost as much as their arithmetic at V-RACER's batch
    of 256 on one core (``benchmarks/results/learner.md``).
    The loss calls it instead of the TensorDict network (:class:`~acer_torchrl.objectives.vracer.VRACERLoss`'s
    ``network_call``), and the trainer's update calls :meth:`evaluate` and :meth:`gradients` without autograd
    (``VRACERLoss.forward_backward``); :meth:`of` gives None for hidden activations other than ``nn.Softsign``."""

    def __init__(self, encoder: StandardizedMLP, head: VRACERHead):
        self.standardize = encoder.standardize
        self.layers = [m for m in encoder[1] if isinstance(m, nn.Linear)]
        self.head = head

    @classmethod
    def of(cls, encoder: StandardizedMLP, head: VRACERHead) -> WrittenOutNetwork | None:
        hidden = list(encoder[1])
        plain = all(isinstance(m, nn.Softsign) for m in hidden[1::2]) and isinstance(head.policy.raw_std, nn.Parameter)
        return cls(encoder, head) if plain else None

    def parameters(self) -> list[torch.Tensor]:
        head = self.head
        linear = [t for layer in [*self.layers, head.value, head.policy.loc] for t in (layer.weight, layer.bias)]
        return [*linear, head.policy.raw_std]

    def __call__(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        params = self.parameters()
        if torch.is_grad_enabled():
            return _NetworkFunction.apply(self, obs, *params)
        return self.evaluate(obs, params)[0]

    def evaluate(self, obs: torch.Tensor, params: list[torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], list]:
        """``(V, loc, scale)`` as the modules compute them (:class:`Standardize`, ``nn.Linear``, ``nn.Softsign``,
        :class:`VRACERHead`) with ``params`` (:meth:`parameters`), and what the backward reads: each hidden layer's
        input and Softsign denominator, then the last one's output."""
        *layers, (value_w, value_b, loc_w, loc_b), raw_std = _pairs(params)
        x = self.standardize(obs)
        activations = []
        for weight, bias in layers:
            activations.append(x)
            x, denominator = softsign_and_denominator(nn.functional.linear(x, weight, bias))
            activations.append(denominator)
        raw_loc = nn.functional.linear(x, loc_w, loc_b)
        std = nn.functional.softplus(raw_std).expand_as(raw_loc)
        value = nn.functional.linear(x, value_w, value_b)
        return (value, *self.head.env_units(raw_loc, std)), [*activations, x]

    def gradients(self, activations, params, d_value, d_loc, d_scale, observation: bool) -> list[torch.Tensor | None]:
        """The observation's gradient (None unless ``observation``), then the parameters' in :meth:`parameters`'
        order, from the outputs' (None: zero) and :meth:`evaluate`'s ``params`` and activations."""
        half, core = self.head.half_range, activations[-1]
        *layers, (value_w, _, loc_w, _), raw_std = _pairs(params)
        d_value = core.new_zeros(core.shape[0], 1) if d_value is None else d_value
        d_raw_loc = core.new_zeros(core.shape[0], half.numel()) if d_loc is None else d_loc * half
        d_raw_std = torch.zeros_like(raw_std) if d_scale is None else torch.ops.aten.softplus_backward(
            (d_scale * half).sum(0), raw_std, 1.0, 20.0)
        heads = [d_value.t().mm(core), d_value.sum(0), d_raw_loc.t().mm(core), d_raw_loc.sum(0)]
        d_x = d_value.mm(value_w) + d_raw_loc.mm(loc_w)
        grads = []
        for depth in reversed(range(len(layers))):
            x, denominator = activations[2 * depth : 2 * depth + 2]
            d_pre = softsign_backward(d_x, denominator)
            grads = [d_pre.t().mm(x), d_pre.sum(0), *grads]
            if depth or observation:
                d_x = d_pre.mm(layers[depth][0])
        norm = self.standardize
        d_obs = d_x / (norm.scale + norm.eps) if observation else None
        return [d_obs, *grads, *heads, d_raw_std]


def _pairs(params: list[torch.Tensor]) -> list:
    """:meth:`WrittenOutNetwork.parameters` as ``[(weight, bias) per hidden layer..., (value weight, value bias, mean
    weight, mean bias), raw std]``."""
    *hidden, value_w, value_b, loc_w, loc_b, raw_std = params
    return [*zip(hidden[::2], hidden[1::2]), (value_w, value_b, loc_w, loc_b), raw_std]


class _PolicyStats(nn.Module):
    """The head's policy outputs only (the acting policy records ``mu``, not ``V``)."""

    def __init__(self, head: VRACERHead):
        super().__init__()
        self.head = head

    def forward(self, core: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(core)[1:]


def acting_policy(network: TensorDictSequential, head: VRACERHead, width: float) -> TensorDictSequential:
    """The torso and the head's policy outputs writing ``("behaviour", "loc"/"scale")``, then a draw of the
    truncated normal writing ``"action"`` and ``("behaviour", "log_prob")`` (Algorithm 2; the mean under a greedy
    exploration type)."""
    stat_keys = [(BEHAVIOUR, "loc"), (BEHAVIOUR, "scale")]
    stats = TensorDictModule(_PolicyStats(head), in_keys=["core"], out_keys=stat_keys)
    sampler = TensorDictModule(
        BehaviourSampler(discrete=False, truncation=width), in_keys=stat_keys, out_keys=["action", (BEHAVIOUR, "log_prob")]
    )
    return TensorDictSequential(*network, stats, sampler)


def build(cfg: Config, info: EnvInfo) -> Agent:
    """One MLP with a value, a mean and a std output (sec. 2, App. A), the V-RACER loss and its stored estimates."""
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
        **loss_options(algo, VRACERLoss, BUILD_READS, lr=cfg.optim.lr,
                       network_call=WrittenOutNetwork.of(encoder, head)),
    )
    estimates = VRACEREstimates(loss, encoder.standardize, gamma=cfg.gamma, n_start=cfg.replay.min_size,
                                reward_scale_interval=algo.reward_scale_interval, epsilon=algo.epsilon)
    policy = acting_policy(torso.module, head, algo.truncation)
    return Agent(loss=loss, policy=policy, torsos=[torso], estimates=estimates)
