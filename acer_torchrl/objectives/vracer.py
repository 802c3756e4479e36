"""V-RACER's loss with ReF-ER (Novati & Koumoutsakos 2019, "Remember and Forget for Experience Replay").

``papers/refer-vracer-novati2019.txt``: sec. 2 (V-RACER), sec. 3 (ReF-ER), App. A-C (network,
preprocessing, Algorithms 1-3). One network outputs ``V(s)``, the Gaussian mean ``m(s)`` and a
state-independent diagonal std; training samples single time steps from the replay:

* **Targets (sec. 2).** A sampled step's gradient uses ``V^tbc_k`` (value target, eq. 9) and
  ``Q^ret_k = r_{k+1} + gamma V^tbc_{k+1}`` (eq. 6-7 with ``Q := V``), eq. 8 over its episode's stored
  estimates. The loss reads both from the batch (:attr:`VRACERLoss.default_keys`): in this package
  :class:`~acer_torchrl.estimates.vracer.VRACEREstimates` keeps the stored estimates beside the
  replay and adds them to each drawn batch (Algorithm 3's write-back included); for one episode held in
  hand, :func:`~acer_torchrl.estimates.vracer.episode_targets` computes them.
* **ReF-ER (sec. 3).** Rules 1-2, the ``beta`` controller over the whole replay's stored ``rho`` and the
  annealing of ``c_max`` and of the learning rate (eq. 10-13) live in :class:`~acer_torchrl.objectives.refer.ReFER`.
* **Preprocessing (App. B).** States are standardised by a :class:`~acer_torchrl.modules.Standardize` layer
  inside the network, rewards divided by ``sigma_r`` (both fitted by ``VRACEREstimates``). Actions: a normal
  truncated at 3 std (App. A, :class:`~acer_torchrl.modules.TruncatedGaussian`) in [-1, 1] units, scaled
  linearly to the env's bounds (App. B).

Deviations and choices: ``rho`` and ``D_KL`` use the Gaussian densities (the truncation constant is the same
for ``pi`` and ``mu`` and cancels in ``rho``); as in Algorithm 3, ``beta`` weighs the value gradient as well
as the policy gradient and the batch mean counts the far-policy steps (with zero gradient).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from tensordict.utils import NestedKey

from acer_torchrl.objectives.common import ReplayLoss, masked_mean, padding_mask
from acer_torchrl.objectives.functional import truncated_normal_log_prob, truncation_log_z
from acer_torchrl.objectives.names import BEHAVIOUR
from acer_torchrl.objectives.network_call import NetworkCall
from acer_torchrl.objectives.refer import ReFER, gaussian_kl

if TYPE_CHECKING:
    import numpy as np

STORED = "vracer"  # root of a batch's V^tbc and Q^ret (VRACEREstimates.before_update adds them)


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

    For a batch of single steps ``k``, each with its ``V^tbc_k`` and ``Q^ret_k`` (eq. 8 over its episode's stored
    estimates, under :attr:`tensor_keys` ``value_target`` and ``q_ret``):

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
        lr: the optimiser's initial learning rate (annealed by eq. 13, also ``eta`` of eq. 12).
        network_call: ``network`` with its gradient written out (``algorithms.vracer.WrittenOutNetwork``: called
            ``observation -> (V, loc, scale)`` on its first in_key, and ``parameters``, ``evaluate``, ``gradients``
            for :meth:`forward_backward`), called instead of it; None: ``network`` (under autograd).
        The other keyword arguments are the fields of :class:`VRACERConfig`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule, TensorDictSequential
        >>> from torch import nn
        >>> from torchrl.modules import NormalParamExtractor
        >>> from acer_torchrl.modules import TruncatedGaussian
        >>> from acer_torchrl.objectives import VRACERLoss
        >>> from acer_torchrl.estimates.vracer import episode_targets
        >>> _ = torch.manual_seed(0)
        >>> T, n_obs, n_act = 8, 4, 2
        >>> policy_head = nn.Sequential(nn.Linear(16, 2 * n_act), NormalParamExtractor())
        >>> network = TensorDictSequential(
        ...     TensorDictModule(nn.Sequential(nn.Linear(n_obs, 16), nn.Tanh()), ["observation"], ["core"]),
        ...     TensorDictModule(nn.Linear(16, 1), ["core"], ["state_value"]),
        ...     TensorDictModule(policy_head, ["core"], ["loc", "scale"]),
        ... )
        >>> loss = VRACERLoss(network, lr=1e-4)
        >>> mu_loc, mu_scale = torch.randn(T, n_act), torch.ones(T, n_act)  # the acting policy's
        >>> mu = TruncatedGaussian(mu_loc, mu_scale)
        >>> action = mu.sample()
        >>> # eq. 8 over one episode of T steps (truncated after the last: bootstrap V(s_T)) from the V(s_t) and rho_t
        >>> # stored for its steps (the pipeline keeps them beside the replay: VRACEREstimates)
        >>> v_tbc, q_ret = episode_targets(value=torch.randn(T), rho=2 * torch.rand(T), reward=torch.randn(T),
        ...                                bootstrap=0.5, gamma=0.99)
        >>> batch = TensorDict({
        ...     "observation": torch.randn(T, n_obs),
        ...     "action": action,
        ...     ("behaviour", "loc"): mu_loc,
        ...     ("behaviour", "scale"): mu_scale,
        ...     ("behaviour", "log_prob"): mu.log_prob(action),
        ...     ("vracer", "vtbc"): v_tbc.unsqueeze(-1),
        ...     ("vracer", "qret"): q_ret.unsqueeze(-1),
        ... }, batch_size=[T])
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
            value_target: ``V^tbc_k`` (eq. 8-9), ``[*, 1]``.
            q_ret: ``Q^ret_k = r_{k+1} + gamma V^tbc_{k+1}`` (eq. 6-7), ``[*, 1]``.
        """

        action: NestedKey = "action"
        behaviour: NestedKey = BEHAVIOUR
        behaviour_log_prob: NestedKey = (BEHAVIOUR, "log_prob")
        value: NestedKey = "state_value"
        loc: NestedKey = "loc"
        scale: NestedKey = "scale"
        value_target: NestedKey = (STORED, "vtbc")
        q_ret: NestedKey = (STORED, "qret")

    default_keys = _AcceptedKeys
    tensor_keys: _AcceptedKeys
    value_keys = ("state_value",)

    def __init__(
        self,
        network: TensorDictModule | TensorDictSequential,
        *,
        lr: float,
        C: float = 4.0,
        A: float = 5e-7,
        D: float = 0.1,
        rule1: bool = True,
        rule2: bool = True,
        steps_per_update: float = 1.0,
        truncation: float = 3.0,
        network_call: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
    ):
        super().__init__()
        self.network = network
        self._network = NetworkCall(network)
        self.network_call = network_call
        self.refer = ReFER(C=C, A=A, D=D, lr=lr, rule1=rule1, rule2=rule2)
        self.steps_per_update = steps_per_update
        self.truncation = truncation
        self._log_z = truncation_log_z(truncation)
        self._plan_from: int | None = None  # ReFER's env steps t before the batches collected since the last plan

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        """No value estimator object: ``V^tbc`` and ``Q^ret`` come with the batch."""

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = self.tensor_keys
        return [
            *self.network.in_keys,
            keys.action,
            (keys.behaviour, "loc"),
            (keys.behaviour, "scale"),
            keys.behaviour_log_prob,
        ]  # and V^tbc, Q^ret, which VRACEREstimates.before_update adds (they are not gathered with the batch)

    @property
    def out_keys(self) -> list[str]:
        return [
            "loss_objective", "loss_critic", "loss_kl", "rho", "state_value", "kl", "far_batch", "far_fraction",
            "refer_beta", "c_max", "policy_std",
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

    @property
    def fresh_estimate_keys(self) -> list[NestedKey]:
        """What :meth:`fresh_estimates` reads of a step."""
        keys = self.tensor_keys
        observations = self.network.in_keys
        return [*observations, *[("next", k) for k in observations], keys.action, keys.behaviour_log_prob]

    @torch.no_grad()
    def next_value(self, td: TensorDictBase) -> torch.Tensor:
        """``V(s_{k+1})`` from ``("next", observation)``, ``[*td.shape, 1]`` on the loss's device (eq. 8's bootstrap
        at an episode's last stored step)."""
        return self._outputs(td.get("next").to(self.refer.beta.device))[0]

    @torch.no_grad()
    def fresh_estimates(self, td: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``V(s_k)``, ``rho_k`` and ``V(s_{k+1})`` of the current network for the steps of ``td`` (its
        :attr:`fresh_estimate_keys`), each ``[*td.shape]`` on the CPU: what Algorithm 1 stores with a new step and
        eq. 8 runs over."""
        td = td.to(self.refer.beta.device)
        value, loc, scale = self._outputs(td)
        fresh = value, self._log_rho(td, loc, scale).exp(), self.next_value(td)
        return tuple(x.reshape(td.shape).cpu() for x in fresh)

    # ------------------------------------------------------------------ loss
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        return self._terms(td, *self._outputs(td), terms=_ReFERTerms.apply)[0]

    def forward_backward(self, td: TensorDictBase, params: list[torch.Tensor]) -> TensorDictBase:
        """:meth:`forward`, with the gradient of its losses' sum in the ``.grad`` of ``params``: with the written-out
        network (``network_call``), Algorithm 3's ``g^ReF-ER`` (:func:`refer_terms`) through its written-out backward,
        without an autograd graph (what autograd computes from those two nodes, the same bits: ``tests/test_vracer.py``;
        faster than forward and ``backward()`` at V-RACER's batch of 256, ``benchmarks/results/learner.md``);
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
            td.get(keys.value_target), td.get(keys.q_ret),
            self.refer, mask := padding_mask(td),
        )
        out = TensorDict(
            {
                "loss_objective": loss_objective,
                "loss_critic": loss_critic,
                "loss_kl": loss_kl,
                # per-step fresh estimates (their means are logged; VRACEREstimates.after_update writes them back)
                "rho": log_rho.exp(),
                "state_value": value.detach(),
                "kl": masked_mean(kl, mask),
                "far_batch": masked_mean((~near).float(), mask),
                "far_fraction": self.refer.far_fraction.clone(),
                "refer_beta": self.refer.beta.clone(),
                "c_max": torch.tensor(self.refer.c_max),
                "policy_std": scale.detach().mean(),  # env units, mean over action dims
            },
            batch_size=[],
        )
        return out, tuple(partials)

    # ------------------------------------------------------------------ trainer hooks
    def preprocess(self, batch: TensorDictBase) -> TensorDictBase:
        """Counts the collected env steps (ReF-ER's annealing, the gradient steps they are owed: :meth:`update_plan`)."""
        if self._plan_from is None:
            self._plan_from = int(self.refer.steps)
        self.refer.advance(batch.numel())
        return batch

    def stored_steps_before_first_update(self, min_size: int) -> int:
        """The replay's ``min_size``, and at least ``F`` collected steps: the first gradient step is owed after ``F``."""
        return max(super().stored_steps_before_first_update(min_size), math.ceil(self.steps_per_update))

    def update_plan(self, rng: np.random.Generator) -> list[float]:
        """One replay-only gradient step per ``F`` collected env steps (App. A, Algorithm 1): the steps owed to the
        batches collected since the last plan, ``floor(t / F) - floor(t0 / F)`` with ``t`` the env steps so far and
        ``t0`` those before these batches. Counted from ``t`` (ReF-ER's, in the checkpoint) rather than by adding up
        ``steps / F``, so that a resumed run owes what an uninterrupted one does and no rounding builds up."""
        now = int(self.refer.steps)
        start = now if self._plan_from is None else self._plan_from
        self._plan_from = None
        return [0.0] * (math.floor(now / self.steps_per_update) - math.floor(start / self.steps_per_update))

    def lr_scale(self) -> float:
        """``eta(t) / eta`` of eq. 13."""
        return self.refer.lr_scale
