"""V-RACER with ReF-ER (Novati & Koumoutsakos 2019, "Remember and Forget for Experience Replay").

``papers/refer-vracer-novati2019.txt``: sec. 2 (V-RACER), sec. 3 (ReF-ER), App. A-C (network,
preprocessing, Algorithms 1-3). One network outputs ``V(s)``, the Gaussian mean ``m(s)`` and a
state-independent diagonal std; training samples single time steps from the replay:

* **Stored estimates (sec. 2, Algorithm 3).** For every stored step ``k`` the loss keeps the most recent
  ``V(s_k)``, ``rho_k`` and ``V(s_{k+1})``, indexed by the replay's slot (:class:`SlotEstimates`, beside the
  replay rather than in it: each agent of a shared-replay sweep keeps its own); a step's are computed when
  the loss first sees it in the replay. A sampled step's gradient uses ``V^tbc_k`` (value target, eq. 9) and
  ``Q^ret_k = r_{k+1} + gamma V^tbc_{k+1}`` (eq. 5-6 with ``Q := V``), eq. 8 run from its episode's last
  stored step over these stored values; its fresh ``V`` and ``rho`` (and ``V(s_{k+1})``, the bootstrap
  where it is its episode's last stored step) are written back (:meth:`VRACERLoss.after_update`). Terminal
  steps bootstrap on 0, a truncated (or still open) episode's last stored step on ``V(s_{T})``.
  Algorithm 3 stores ``V^tbc`` and recomputes it for every earlier step of the episode after each write-back
  (O(episode prefix) per sampled step); that keeps every stored ``V^tbc_t`` equal to eq. 8 over the stored
  values from ``t`` on, which is what is computed here when ``t`` is sampled (:meth:`VRACERLoss.estimates`:
  a segment tree over eq. 8's affine steps, O(log replay) per sampled step, the same numbers).
* **ReF-ER (sec. 3).** Rules 1-2, the ``beta`` controller over the whole replay's stored ``rho`` and the
  annealing of ``c_max`` and of the learning rate (eq. 10-13) live in :class:`~acer_torchrl.objectives.refer.ReFER`.
* **Preprocessing (App. B).** States are standardised with the mean and std of the first ``N_start``
  stored observations (eq. 14-15) by a :class:`Standardize` layer inside the network, so the acting
  policy on the workers receives it with the weights; rewards are divided by
  ``sigma_r = sqrt(mean r^2)`` over the replay (eq. 16), recomputed every ``reward_scale_interval``
  gradient steps. Actions: a normal truncated at 3 std (App. A) in [-1, 1] units, scaled linearly to
  the env's bounds (App. B).

Deviations and choices: the hidden-layer initialisation is Glorot's uniform ``sqrt(6 / (f_i + f_o))``
(App. A prints ``6 / sqrt(f_i + f_o)`` while citing Glorot & Bengio); ``rho`` and ``D_KL`` use the
Gaussian densities (the truncation constant is the same for ``pi`` and ``mu`` and cancels in ``rho``);
when ``sigma_r`` changes, the stored values are rescaled by ``sigma_old / sigma_new`` so that they stay
in the units of the current reward scale; as in Algorithm 3, ``beta`` weighs the value gradient as well as
the policy gradient and the batch mean counts the far-policy steps (with zero gradient).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn

from acer_torchrl.objectives.common import NetworkCall, ReplayLoss, masked_mean, padding_mask
from acer_torchrl.objectives.episode_recursion import EpisodeRecursion
from acer_torchrl.objectives.names import BEHAVIOUR, MASK_KEY, SLOT_KEY, WRITE_KEY
from acer_torchrl.objectives.refer import FarPolicyCount, ReFER, gaussian_kl
from acer_torchrl.objectives.stored_estimates import EpisodeStore, SlotEstimates, as_array, write_index

STORED = "vracer"  # root of a sampled batch's stored estimates (added by before_update)
VALUE, RHO, NEXT_VALUE, VTBC, QRET = "value", "rho", "next_value", "vtbc", "qret"  # the last two: computed when sampled
REWARD, TERMINAL = "reward", "terminal"  # a stored step's r_{k+1} and whether s_{k+1} is terminal (kept with them)
_WRITTEN_BACK = {VALUE: "state_value", RHO: "rho", NEXT_VALUE: "next_state_value"}  # stored <- loss output


# ---------------------------------------------------------------------------------------------- network


class Standardize(nn.Module):
    """``s_hat = (s - mu_s) / (sigma_s + eps)`` (App. B, eq. 14-15); the identity until :meth:`fit`.

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


_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def truncation_log_z(width: float) -> float:
    """``log Z``, ``Z = erf(width / sqrt 2)``: the mass of a normal within ``width`` std of its mean."""
    return math.log(math.erf(width / math.sqrt(2.0)))


def truncated_normal_log_prob(action: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor, log_z: float) -> torch.Tensor:
    """``log N(a; m, s) - d log Z`` summed over the last (action) dim, ``[*]``: the density of :class:`TruncatedGaussian`
    inside its support, ``sum_i [-z_i^2 / 2 - log s_i - log sqrt(2 pi)] - d log Z`` with ``z = (a - m) / s``."""
    z = (action - loc) / scale
    return (-0.5 * z.pow(2) - scale.log()).sum(-1) - action.shape[-1] * (_LOG_SQRT_2PI + log_z)


def truncated_normal_sample(loc: torch.Tensor, scale: torch.Tensor, width: float) -> torch.Tensor:
    """A draw of ``loc.shape`` from the normal ``N(loc, scale)`` truncated at ``width`` std from its mean (App. A), by
    the inverse CDF of a uniform draw inside the truncation's quantiles."""
    edge = torch.special.ndtr(torch.tensor(-width, dtype=loc.dtype)).item()
    u = torch.empty(loc.shape, dtype=loc.dtype, device=loc.device).uniform_(edge, 1.0 - edge)
    return loc + scale * torch.special.ndtri(u)


class TruncatedGaussian(D.Independent):
    """Diagonal normal truncated at ``width`` std from its mean in every component (App. A).

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


# ---------------------------------------------------------------------------------------------- loss terms


def refer_terms(value, loc, scale, log_rho, action, mu_loc, mu_scale, v_tbc, q_ret, refer, mask) -> tuple:
    """V-RACER's three loss terms under ReF-ER, the values of :class:`VRACERLoss`'s docstring, with their gradients
    w.r.t. the network's outputs ``V``, ``m`` and ``sigma`` written out, as Algorithm 3 writes ``g^ReF-ER``
    (autograd through the ~30 small tensor ops of the Gaussian log-density, the weights, the gating and the KL
    cost more than the network's own backward at batch 256).

    Per step (``z = (a - m) / sigma``, ``A = Q^ret - V`` not differentiated, eq. 5; ``s_k`` the batch mean's
    weight, ``1/B`` or the padding mask's):

    * off-PG, eq. 5: ``d/d log rho [-rho A] = -rho A`` (0 where far-policy or clipped: :meth:`ReFER.weight`),
      ``d log rho / d m = z / sigma``, ``d log rho / d sigma = (z^2 - 1) / sigma`` (the truncation constant
      does not depend on ``m`` or ``sigma``);
    * value, eq. 9: ``d/dV [(V - V^tbc)^2 / 2] = V - V^tbc`` (0 where far-policy);
    * Rule 2, eq. 11: ``d D_KL(mu || pi) / d m = (m - m_mu) / sigma^2``,
      ``d D_KL / d sigma = 1 / sigma - (sigma_mu^2 + (m - m_mu)^2) / sigma^3``;

    times ``beta s_k`` (the first two) and ``(1 - beta) s_k`` (eq. 10). Returns ``loss_objective``,
    ``loss_critic``, ``loss_kl``, the per-step ``D_KL`` and Rule 1's ``near`` mask, then the partial derivatives
    ``d loss_critic / dV``, ``d loss_objective / dm``, ``d loss_objective / d sigma``, ``d loss_kl / dm`` and
    ``d loss_kl / d sigma``. ``tests/test_vracer.py`` compares them with autograd of the terms written step by step.
    """
    near = refer.near_policy(log_rho)  # Rule 1 (eq. 10)
    rho, slope = refer.weight(log_rho, near)  # far-policy: 1; ReF-ER-2: min(rho, 10^3) (sec. 5.3)
    advantage = q_ret - value
    kl = gaussian_kl(mu_loc, mu_scale, loc, scale)
    losses = (
        refer.gate(-rho * advantage, near, mask),  # off-PG, eq. 5
        refer.gate(0.5 * (value - v_tbc).pow(2), near, mask),  # eq. 9
        refer.penalty(kl, mask),  # Rule 2, eq. 10-11
    )
    share = 1.0 / value.numel() if mask is None else mask.to(value.dtype) / mask.sum().clamp_min(1)
    on, off = refer.beta * share, (1.0 - refer.beta) * share
    z = (action - loc) / scale
    pg = torch.where(near, -slope * advantage, 0.0) * on
    diff = loc - mu_loc
    partials = (
        torch.where(near, value - v_tbc, 0.0) * on,  # d loss_critic / dV
        pg * z / scale,  # d loss_objective / dm
        pg * (z.pow(2) - 1.0) / scale,  # d loss_objective / d sigma
        off * diff / scale.pow(2),  # d loss_kl / dm
        off * (1.0 / scale - (mu_scale.pow(2) + diff.pow(2)) / scale.pow(3)),  # d loss_kl / d sigma
    )
    return *losses, kl, near, *partials


class _ReFERTerms(torch.autograd.Function):
    """:func:`refer_terms` as one autograd node: its backward is the written-out partials times the gradients of
    the three losses."""

    @staticmethod
    def forward(ctx, *inputs):
        *outputs, critic_v, objective_m, objective_s, kl_m, kl_s = refer_terms(*inputs)
        ctx.save_for_backward(critic_v, objective_m, objective_s, kl_m, kl_s)
        ctx.mark_non_differentiable(*outputs[3:])  # kl, near
        return tuple(outputs)

    @staticmethod
    def backward(ctx, d_objective, d_critic, d_kl, *_):
        critic_v, objective_m, objective_s, kl_m, kl_s = ctx.saved_tensors
        grads = (d_critic * critic_v, d_objective * objective_m + d_kl * kl_m, d_objective * objective_s + d_kl * kl_s)
        return *grads, *([None] * 8)


# ---------------------------------------------------------------------------------------------- loss


class VRACERLoss(ReplayLoss):
    """V-RACER's loss with ReF-ER (Novati & Koumoutsakos 2019, eq. 5-13, Algorithm 3).

    For a batch of single steps ``k`` (each with its stored ``V^tbc_k`` and ``Q^ret_k``):

    * ``rho_k = pi(a_k|s_k) / mu_k(a_k|s_k)`` from the behaviour log-probability stored at acting time;
    * ``loss_objective = beta mean_k[near_k * (-rho_k (Q^ret_k - V(s_k)))]`` (off-PG, eq. 5; the advantage is
      not differentiated, ``grad rho = rho grad log pi``);
    * ``loss_critic = beta mean_k[near_k * (V(s_k) - V^tbc_k)^2 / 2]`` (eq. 9);
    * ``loss_kl = (1 - beta) mean_k D_KL(mu_k || pi(.|s_k))`` (Rule 2, eq. 10-11);

    with ``near_k = 1/c_max < rho_k < c_max`` (Rule 1; without it every step is near, and with Rule 2
    alone ``rho_k`` is clipped at 10^3 in the off-PG, sec. 5.3: :meth:`ReFER.weight`). The three terms sum
    to the objective whose gradient is Algorithm 3's ``-(1/B) sum_k g^ReF-ER_k``.

    Args:
        network: learning module ``observation -> state_value, loc, scale`` (env units).
        normalizer: the :class:`Standardize` layer inside ``network`` (fitted on the first ``n_start`` steps).
        gamma: discount.
        n_start: stored steps before the state and reward statistics are fitted (``N_start``, Alg. 1;
            the trainer starts updating at ``replay.min_size``, pass that).
        lr: the optimiser's initial learning rate (annealed by eq. 13, also ``eta`` of eq. 12).
        network_call: ``network`` with its gradient written out (``algorithms.vracer.WrittenOutNetwork``: called
            ``observation -> (V, loc, scale)`` on its first in_key, and ``parameters``, ``evaluate``, ``gradients``
            for :meth:`forward_backward`), called instead of it; None: ``network`` (under autograd).
        The other keyword arguments are the fields of :class:`VRACERConfig`.

    A sampled batch carries, besides :attr:`in_keys`, the stored estimates of its steps under ``"vracer"``
    (``vtbc``, ``qret``, ``next_value``, ``[B, 1]``), which :meth:`before_update` adds from the replay.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule, TensorDictSequential
        >>> from torch import nn
        >>> from torchrl.modules import NormalParamExtractor
        >>> from acer_torchrl.objectives import VRACERLoss
        >>> from acer_torchrl.objectives.vracer import Standardize, TruncatedGaussian
        >>> _ = torch.manual_seed(0)
        >>> B, n_obs, n_act = 8, 4, 2
        >>> normalizer = Standardize(n_obs)
        >>> torso = nn.Sequential(normalizer, nn.Linear(n_obs, 16), nn.Tanh())
        >>> policy_head = nn.Sequential(nn.Linear(16, 2 * n_act), NormalParamExtractor())
        >>> network = TensorDictSequential(
        ...     TensorDictModule(torso, ["observation"], ["core"]),
        ...     TensorDictModule(nn.Linear(16, 1), ["core"], ["state_value"]),
        ...     TensorDictModule(policy_head, ["core"], ["loc", "scale"]),
        ... )
        >>> loss = VRACERLoss(network, normalizer, gamma=0.99, n_start=B, lr=1e-4)
        >>> mu_loc, mu_scale = torch.randn(B, n_act), torch.ones(B, n_act)  # the acting policy's
        >>> mu = TruncatedGaussian(mu_loc, mu_scale)
        >>> action = mu.sample()
        >>> batch = TensorDict({
        ...     "observation": torch.randn(B, n_obs),
        ...     "action": action,
        ...     ("behaviour", "loc"): mu_loc,
        ...     ("behaviour", "scale"): mu_scale,
        ...     ("behaviour", "log_prob"): mu.log_prob(action),
        ...     ("vracer", "vtbc"): torch.randn(B, 1),  # stored estimates (before_update)
        ...     ("vracer", "qret"): torch.randn(B, 1),
        ...     ("vracer", "next_value"): torch.randn(B, 1),
        ... }, batch_size=[B])
        >>> out = loss(batch)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_critic', 'loss_kl', 'loss_objective']
        >>> out["loss_objective"].shape
        torch.Size([])
    """

    @dataclass
    class _AcceptedKeys:
        """Keys of the input batch (``set_keys`` renames them).

        Attributes:
            action: the action taken (float vector, env units).
            behaviour: root of the behaviour statistics ``loc``/``scale`` stored at acting time.
            behaviour_log_prob: ``log mu(a_k|s_k)`` stored at acting time.
            value, loc, scale: outputs of the learning network.
            reward, terminated: under ``"next"``.
            stored: root of the per-step estimates kept in the replay (value, rho, next_value, vtbc, qret).
        """

        action: NestedKey = "action"
        behaviour: NestedKey = BEHAVIOUR
        behaviour_log_prob: NestedKey = (BEHAVIOUR, "log_prob")
        value: NestedKey = "state_value"
        loc: NestedKey = "loc"
        scale: NestedKey = "scale"
        reward: NestedKey = "reward"
        terminated: NestedKey = "terminated"
        stored: NestedKey = STORED

    default_keys = _AcceptedKeys
    tensor_keys: _AcceptedKeys
    value_keys = ("state_value", "next_state_value")

    def __init__(
        self,
        network: TensorDictModule | TensorDictSequential,
        normalizer: Standardize,
        *,
        gamma: float,
        n_start: int,
        lr: float,
        C: float = 4.0,
        A: float = 5e-7,
        D: float = 0.1,
        rule1: bool = True,
        rule2: bool = True,
        steps_per_update: float = 1.0,
        truncation: float = 3.0,
        reward_scale_interval: int = 1000,
        epsilon: float = 1e-7,
        network_call: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
    ):
        super().__init__()
        self.network = network
        self._network = NetworkCall(network)  # on tensors when its modules allow (common.TensorCall)
        self.network_call = network_call
        self.normalizer = normalizer
        self.refer = ReFER(C=C, A=A, D=D, lr=lr, rule1=rule1, rule2=rule2)
        self.gamma = gamma
        self.n_start = n_start
        self.steps_per_update = steps_per_update
        self.truncation = truncation
        self._log_z = truncation_log_z(truncation)
        self.reward_scale_interval = reward_scale_interval
        self.epsilon = epsilon
        self.seq_len = 1
        self.register_buffer("reward_scale", torch.tensor(1.0))  # sigma_r (eq. 16)
        self.register_buffer("fitted", torch.tensor(False))  # state/reward statistics fitted (Alg. 1)
        self.register_buffer("updates", torch.tensor(0, dtype=torch.long))  # gradient steps k
        self._pending_updates = 0.0  # gradient steps owed to the env steps collected (F, App. A)
        self.stored = SlotEstimates()  # V, rho, V(s_{k+1}), r and terminal of every stored step, by slot
        self._far = FarPolicyCount()  # eq. 12's far-policy count over the stored rho
        self._recursion: EpisodeRecursion | None = None  # eq. 8 over the stored steps (None: to be built)
        self._drawn: tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | slice] | None = None  # see before_update

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        """No value estimator object: the V^tbc recursion runs on the replay's stored estimates."""

    def _stored_key(self, name: str) -> NestedKey:
        root = self.tensor_keys.stored
        return (*root, name) if isinstance(root, tuple) else (root, name)

    def get_extra_state(self) -> dict:
        """The stored estimates (:class:`SlotEstimates`) go into the loss's checkpoint."""
        return self.stored.state()

    def set_extra_state(self, state: dict | None) -> None:
        """``None``: a checkpoint without stored estimates (written before they moved into the loss); they are
        recomputed with the current network for every stored step at the next :meth:`sync`, as Algorithm 1
        recomputes them after fitting."""
        self.stored = SlotEstimates()
        if state is not None:
            self.stored.load_state(state)
        self._far = FarPolicyCount()
        self._recursion = self._drawn = None

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:
        state_dict.setdefault(f"{prefix}_extra_state", None)  # see set_extra_state
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = self.tensor_keys
        return [
            *self.network.in_keys,
            keys.action,
            (keys.behaviour, "loc"),
            (keys.behaviour, "scale"),
            keys.behaviour_log_prob,
        ]  # and the stored V^tbc, Q^ret and V(s_{k+1}), which before_update adds (they are not gathered with the batch)

    @property
    def out_keys(self) -> list[str]:
        return [
            "loss_objective", "loss_critic", "loss_kl", "rho", "state_value", "next_state_value", "kl",
            "far_batch", "far_fraction", "beta", "c_max", "reward_scale", "policy_std",
        ]

    # ------------------------------------------------------------------ network evaluations
    def _outputs(self, td: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``V(s)``, the mean and the std of the network at the observation keys of ``td``."""
        keys = self.tensor_keys
        if self.network_call is not None:
            return self.network_call(self._observation(td))
        out = self._network(td)
        return out[keys.value], out[keys.loc], out[keys.scale]

    def _observation(self, td: TensorDictBase) -> torch.Tensor:
        """The network's input (its first in_key) in ``td``, for ``network_call``."""
        return td.get(self.network.in_keys[0])

    def _log_rho(self, td: TensorDictBase, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``log rho = log pi(a|s) - log mu(a|s)`` for the policy ``(loc, scale)``, ``[*td.shape, 1]``."""
        keys = self.tensor_keys
        log_pi = truncated_normal_log_prob(td.get(keys.action), loc, scale, self._log_z)
        return (log_pi - td.get(keys.behaviour_log_prob).reshape(log_pi.shape)).unsqueeze(-1)

    @torch.no_grad()
    def _next_value(self, td: TensorDictBase) -> torch.Tensor:
        """``V(s_{k+1})`` from ``("next", observation)`` (bootstrap of an episode's last stored step)."""
        return self._outputs(td.get("next"))[0]

    @torch.no_grad()
    def _fresh_estimates(self, td: TensorDictBase) -> dict[str, torch.Tensor]:
        """``V(s_k)``, ``rho_k``, ``V(s_{k+1})`` of the current network for the steps of ``td``, each ``[*td.shape]``
        on the CPU (beside the replay, whatever the learner's device)."""
        td = td.to(self.reward_scale.device)
        value, loc, scale = self._outputs(td)
        fresh = {VALUE: value, RHO: self._log_rho(td, loc, scale).exp(), NEXT_VALUE: self._next_value(td)}
        return {name: value.reshape(td.shape).cpu() for name, value in fresh.items()}

    # ------------------------------------------------------------------ loss
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        return self._terms(td, *self._outputs(td), terms=_ReFERTerms.apply)[0]

    def forward_backward(self, td: TensorDictBase, params: list[torch.Tensor]) -> TensorDictBase:
        """:meth:`forward`, with the gradient of its losses' sum in the ``.grad`` of ``params``: with the written-out
        network (``network_call``), Algorithm 3's ``g^ReF-ER`` (:func:`refer_terms`) through its written-out backward,
        without an autograd graph (what autograd computes from those two nodes, the same bits: ``tests/test_vracer.py``;
        0.2-0.25 ms less than forward and ``backward()`` at V-RACER's batch of 256, ``benchmarks/results/learner.md``);
        otherwise autograd (:meth:`ReplayLoss.forward_backward`)."""
        network = self.network_call
        if network is None:
            return super().forward_backward(td, params)
        with torch.no_grad():
            network_params = network.parameters()
            outputs, activations = network.evaluate(self._observation(td), network_params)
            out, (critic_v, objective_m, objective_s, kl_m, kl_s) = self._terms(td, *outputs, terms=refer_terms)
            # the sum's gradient reaches V, m and sigma as backward() takes it: 1 x each loss's partials, added
            grads = network.gradients(activations, network_params, critic_v, objective_m + kl_m, objective_s + kl_s,
                                      observation=False)[1:]
        for param in params:
            param.grad = None
        for param, grad in zip(network_params, grads):
            param.grad = grad
        return out

    def compile_networks(self, **options) -> None:
        """The TensorDict network's calls and the written-out network's (``network_call``: what the update runs)."""
        super().compile_networks(**options)
        if self.network_call is not None:
            self.network_call.compile(**options)

    def _terms(self, td: TensorDictBase, value, loc, scale, terms: Callable) -> tuple[TensorDictBase, tuple]:
        """The loss's output for the network's ``V``, mean and std at ``td``'s steps, computed by ``terms``
        (:func:`refer_terms` or its autograd node :class:`_ReFERTerms`), and the partial derivatives ``terms`` returns
        after the values (:func:`refer_terms`'; none from the node, which keeps them for its backward)."""
        keys = self.tensor_keys
        mu = td.get(keys.behaviour)
        with torch.no_grad():
            log_rho = self._log_rho(td, loc, scale)
        loss_objective, loss_critic, loss_kl, kl, near, *partials = terms(
            value, loc, scale, log_rho, td.get(keys.action), mu.get("loc"), mu.get("scale"),
            td[self._stored_key(VTBC)], td[self._stored_key(QRET)],  # added by before_update
            self.refer, mask := padding_mask(td),
        )
        out = TensorDict(
            {
                "loss_objective": loss_objective,
                "loss_critic": loss_critic,
                "loss_kl": loss_kl,
                # per-step fresh estimates, written back by after_update (their means are logged)
                "rho": log_rho.exp(),
                "state_value": value.detach(),
                "next_state_value": td[self._stored_key(NEXT_VALUE)],  # fresh where eq. 8 reads it (before_update)
                "kl": masked_mean(kl, mask),
                "far_batch": masked_mean((~near).float(), mask),
                "far_fraction": self.refer.far_fraction.clone(),
                "beta": self.refer.beta.clone(),
                "c_max": torch.tensor(self.refer.c_max),
                "reward_scale": self.reward_scale.clone(),
                "policy_std": scale.detach().mean(),  # env units, mean over action dims
            },
            batch_size=[],
        )
        return out, tuple(partials)

    # ------------------------------------------------------------------ trainer hooks
    def preprocess(self, batch: TensorDictBase) -> TensorDictBase:
        """Counts the collected env steps (ReF-ER's annealing, the gradient steps they are owed)."""
        steps = batch.numel()
        self.refer.advance(steps)
        self._pending_updates += steps / self.steps_per_update
        return batch

    def update_plan(self, rng: np.random.Generator) -> list[float]:
        """One replay-only gradient step per ``F`` collected env steps (App. A, Algorithm 1)."""
        n = int(self._pending_updates)
        self._pending_updates -= n
        return [0.0] * n

    def lr_scale(self) -> float:
        """``eta(t) / eta`` of eq. 13."""
        return self.refer.lr_scale

    def after_extend(self, batch: TensorDictBase, slots: torch.Tensor, replay: EpisodeStore) -> None:
        """The new steps' estimates (:meth:`sync`); once ``n_start`` steps are stored, the state and reward
        statistics are fitted and every stored value recomputed (Algorithm 1)."""
        self.sync(replay)

    def sync(self, replay: EpisodeStore) -> None:
        """Estimates for the steps written into ``replay`` since the last look (the loss's own collected ones,
        or, in a shared replay, anyone's): ``V(s_k)``, ``rho_k`` and ``V(s_{k+1})`` of the current network (what
        Algorithm 1 stores with a new step), with their reward and terminal flag."""
        new = self.stored.sync(replay)
        if new is None:
            return
        if new.numel():
            self._store_fresh(replay, new)
        if self._recursion is not None:  # episodes were added or evicted
            self._recursion.refresh(self.stored.links, new, self._eq8_maps_at)
        if not bool(self.fitted) and self.stored.links.alive.sum() >= self.n_start:
            self._fit(replay)

    def _store_fresh(self, replay: EpisodeStore, slots: torch.Tensor) -> None:
        keys = self.tensor_keys
        steps = replay.gather(slots, [*self._estimate_keys(), ("next", keys.reward), ("next", keys.terminated)])
        self.stored.write(
            slots,
            **self._fresh_estimates(steps),
            **{REWARD: steps.get(("next", keys.reward)), TERMINAL: steps.get(("next", keys.terminated))},
        )

    def _estimate_keys(self) -> list[NestedKey]:
        """What :meth:`_fresh_estimates` reads of a stored step."""
        keys = self.tensor_keys
        return [*self.network.in_keys, *[("next", k) for k in self.network.in_keys], keys.action, keys.behaviour_log_prob]

    def before_update(self, sample: TensorDictBase, replay: EpisodeStore) -> TensorDictBase:
        """Adds the sampled steps' ``V^tbc`` and ``Q^ret`` (:meth:`estimates`) and the ``V(s_{k+1})`` to write
        back (:meth:`_bootstrap_values`) under the stored root.

        In a shared replay the other agents write while this one draws: a step replaced in its slot between the
        draw and this look (the sample holds the old step, the stored estimates are now the new one's) is masked
        out of this update and not written back (:meth:`_still_stored`)."""
        self.sync(replay)  # in a shared replay, steps others wrote since this loss's last look
        slots = as_array(sample.get(SLOT_KEY)).reshape(-1)
        kept = self._still_stored(sample, slots)
        if isinstance(kept, np.ndarray):
            sample.set(MASK_KEY, torch.from_numpy(kept).reshape(sample.shape).to(sample.device))
        terms = self._eq8_terms(slots)
        v_tbc, q_ret = self._targets(slots, terms)
        next_value = self._bootstrap_values(replay, slots, terms)
        self._drawn = slots, terms, kept  # after_update's eq. 8 maps: these steps' terms with the written-back values
        for name, value in ((VTBC, v_tbc), (QRET, q_ret), (NEXT_VALUE, next_value)):
            sample.set(self._stored_key(name), torch.from_numpy(value).reshape(*sample.shape, 1).to(sample.device))
        return sample

    def _still_stored(self, sample: TensorDictBase, slots: np.ndarray) -> np.ndarray | slice:
        """Which sampled steps still hold their slots as of the last :meth:`sync` (bool ``[k]``), or
        ``slice(None)`` when all do (always, but in a shared replay): the write that stored each when it was
        drawn (``"write_index"``, set by the replay's ``sample_steps``; a batch without it is taken as current)
        against the last write into its slot."""
        drawn_as = sample.get(WRITE_KEY, None)
        if drawn_as is None:
            return slice(None)
        kept = write_index(slots, self.stored.synced, self.stored.capacity) == as_array(drawn_as).reshape(-1)
        return slice(None) if kept.all() else kept

    @torch.no_grad()
    def _bootstrap_values(self, replay: EpisodeStore, slots: np.ndarray, terms: dict[str, np.ndarray]) -> np.ndarray:
        """``V(s_{k+1})`` of the sampled steps to write back, ``[k, 1]`` on the CPU: the current network's where
        ``k`` is its episode's last stored step and not terminal (eq. 8's bootstrap: the only place the stored
        ``V(s_{k+1})`` is read), the stored one elsewhere. Evaluated before the optimiser step, as Algorithm 3's
        write-back of the values of its gradient pass; ``s_{k+1}`` gathered and evaluated for those few steps
        only, not for every step of the batch."""
        values = terms["next_value"].copy()
        rows = np.flatnonzero(terms["last"] & ~terms["terminal"])
        if rows.size:
            ends = replay.gather(torch.from_numpy(slots[rows]), [("next", k) for k in self.network.in_keys])
            values[rows] = as_array(self._next_value(ends.to(self.reward_scale.device))).reshape(-1)
        return values

    def after_update(self, sample: TensorDictBase, output: TensorDictBase, replay: EpisodeStore) -> None:
        """Algorithm 3's write-back, the ``sigma_r`` refresh (Algorithm 1) and ReF-ER's ``beta`` (eq. 12).

        The sampled steps get the fresh ``V(s_k)``, ``rho_k`` and ``V(s_{k+1})`` of this update (the last
        is used only at an episode's last stored step: the bootstrap of eq. 8 there), except those replaced
        before :meth:`before_update` looked. (A step replaced after it looked gets the new step's estimates
        at the next :meth:`sync`, which overwrites what is written here.)"""
        slots, drawn, kept = self._drawn_for(sample)
        slots = slots[kept]
        fresh = {name: as_array(output.get(out_key)).reshape(-1)[kept] for name, out_key in _WRITTEN_BACK.items()}
        version = self.stored.version
        self.stored.write(slots, **fresh)
        self._far.rewritten(slots, self.stored.array(RHO), version, self.stored.version)
        if self._recursion is not None:
            # eq. 8's terms at the written slots: before_update's (reward, episode end, terminal: unchanged)
            # with the stored V, rho and V(s_{k+1}) now written back
            drawn = {name: value[kept] for name, value in drawn.items()}
            self._recursion.set(slots, *self._eq8_maps({**drawn, **self._written_terms(slots, drawn["terminal"])}))
        self.updates += 1
        if int(self.updates) % self.reward_scale_interval == 0:
            self._rescale_rewards()
        rho, alive = self.stored.written(RHO)  # eq. 12's n_far / N over the replay's latest weights
        self.refer.step_beta(self._far.share(rho.numpy(), alive.numpy(), self.refer.c_max, self.stored.version))

    def _drawn_for(self, sample: TensorDictBase) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | slice]:
        """:meth:`before_update`'s slots, eq. 8 terms and kept rows for ``sample``."""
        if self._drawn is None or not np.array_equal(self._drawn[0], as_array(sample.get(SLOT_KEY)).reshape(-1)):
            raise RuntimeError("VRACERLoss.after_update: the sample is not the one before_update prepared")
        return self._drawn

    # ------------------------------------------------------------------ stored estimates
    def _eq8_terms(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """What eq. 8 reads at ``slots``, each ``[k]``: the stored ``V`` and ``rhō = min(1, rho)``, the
        reward scaled by ``sigma_r`` (App. B), whether the step is its episode's last stored one, and the
        bootstrap there (0 when terminal, else the stored ``V(s_{k+1})``). In NumPy, as the rest of the
        stored-estimate bookkeeping: a few hundred entries an update, where a NumPy call costs ~1 us and a
        torch call ~5 (the same float32 arithmetic)."""
        terminal = self.stored.array(TERMINAL)[slots]
        return {
            "reward": self.stored.array(REWARD)[slots] / (float(self.reward_scale) + self.epsilon),
            "last": self.stored.links.next.numpy()[slots] < 0,
            "terminal": terminal,
            **self._written_terms(slots, terminal),
        }

    def _written_terms(self, slots: np.ndarray, terminal: np.ndarray) -> dict[str, np.ndarray]:
        """The terms of :meth:`_eq8_terms` that the write-back changes: the stored ``V``, ``rhō`` and ``V(s_{k+1})``,
        and the bootstrap (0 where ``terminal``)."""
        value, rho, next_value = (self.stored.array(name)[slots] for name in (VALUE, RHO, NEXT_VALUE))
        bootstrap = np.where(terminal, 0.0, next_value)
        return {"value": value, "rho_bar": np.minimum(rho, 1.0), "next_value": next_value, "bootstrap": bootstrap}

    def _eq8_maps(self, terms: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Eq. 8 as ``V^tbc_t = a_t V^tbc_{t+1} + b_t``: ``a_t = gamma rhō_t``, ``b_t = (1 - rhō_t) V_t +
        rhō_t r_{t+1}``; at an episode's last stored step ``a = 0`` and ``b`` adds ``rhō gamma V_boot``."""
        rho_bar, last = terms["rho_bar"], terms["last"]
        q_end = terms["reward"] + self.gamma * np.where(last, terms["bootstrap"], 0.0)
        a = np.where(last, 0.0, self.gamma * rho_bar)
        b = (1.0 - rho_bar) * terms["value"] + rho_bar * q_end
        return a, b

    def _eq8_maps_at(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_eq8_maps` of the stored steps ``slots``."""
        return self._eq8_maps(self._eq8_terms(slots))

    def _stored_recursion(self) -> EpisodeRecursion:
        """Eq. 8's maps of every stored step in episode order, in a segment tree; built at the first query (and after
        every stored value changed: fitting, a new ``sigma_r``), then kept current by :meth:`sync` (steps stored or
        evicted) and :meth:`after_update` (values written back)."""
        if self._recursion is None:
            self._recursion = EpisodeRecursion(self.stored.links, self._eq8_maps_at)
        return self._recursion

    @torch.no_grad()
    def estimates(self, replay: EpisodeStore, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``V^tbc_k`` and ``Q^ret_k`` of the stored steps ``slots`` (``[k]``), each ``[k, 1]``.

        Eq. 8, ``V^tbc_t = V_t + rhō_t [r_{t+1} + gamma V^tbc_{t+1} - V_t]``, run backwards from the episode's
        last stored step (bootstrap: 0 when terminal, else the stored ``V(s_{T})``) over the stored ``V`` and
        ``rho``; ``Q^ret_k = r_{k+1} + gamma V^tbc_{k+1}`` (eq. 6 with ``Q := V``). These are the values
        Algorithm 3 would hold for ``k``: it recomputes a step's ``V^tbc`` whenever a later step of its
        episode is written back. ``V^tbc_{k+1}`` is the suffix of the episode-ordered recursion
        (:class:`EpisodeRecursion`, the episode's last step cutting it), O(log n) per step instead of the
        O(episode) of a backward pass."""
        self.sync(replay)
        slots = as_array(slots)
        return tuple(torch.from_numpy(x).unsqueeze(-1) for x in self._targets(slots, self._eq8_terms(slots)))

    def _targets(self, slots: np.ndarray, terms: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`estimates` from the eq. 8 terms of ``slots``, each ``[k]``."""
        after = self._stored_recursion().suffix_after(slots).numpy().astype(terms["value"].dtype)  # V^tbc_{k+1}
        q_ret = terms["reward"] + self.gamma * np.where(terms["last"], terms["bootstrap"], after)
        v_tbc = terms["value"] + terms["rho_bar"] * (q_ret - terms["value"])
        return v_tbc, q_ret

    @torch.no_grad()
    def _fit(self, replay: EpisodeStore) -> None:
        """Algorithm 1's preparation: state statistics (eq. 14-15) and ``sigma_r`` (eq. 16) from the stored
        steps, then every stored value recomputed with the standardised network."""
        slots = self.stored.alive_slots()
        steps = replay.gather(slots, self._estimate_keys())
        self.normalizer.fit(steps.get("observation").flatten(1).float())
        self.reward_scale.copy_(self._reward_rms())
        self.stored.write(slots, **self._fresh_estimates(steps))
        self._recursion = None
        self.fitted.fill_(True)

    def _reward_rms(self) -> torch.Tensor:
        """``sigma_r = sqrt(mean_t r_{t+1}^2)`` over the stored steps (eq. 16)."""
        reward, alive = self.stored.written(REWARD)
        return reward[alive].float().pow(2).mean().sqrt()

    @torch.no_grad()
    def _rescale_rewards(self) -> None:
        """Recompute ``sigma_r`` (eq. 16) and convert the stored values to the new reward units."""
        new = float(self._reward_rms())
        self.stored.scale((float(self.reward_scale) + self.epsilon) / (new + self.epsilon), VALUE, NEXT_VALUE)
        self.reward_scale.fill_(new)
        self._recursion = None
