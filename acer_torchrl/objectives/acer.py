"""ACER: actor-critic with experience replay (Wang et al. 2017, "Sample efficient actor-critic with
experience replay", ICLR 2017; ``../shared/papers/acer-wang2017.txt``). Equation numbers below are the
paper's; "Alg. 2/3" are its appendix A pseudo-code.

Discrete actions (sec. 3, Alg. 2): a policy head (logits) and a Q head on one torso, ``V = sum_a pi Q``,
the Retrace target ``Q^ret`` with ``c_t = min(1, rho_t)`` (eq. 5), the critic regression on ``Q^ret``
(eq. 6), and the truncated importance-weighted policy gradient with bias correction over all actions
(eq. 9), plus an entropy bonus.

Continuous actions (sec. 5, Alg. 3): a Gaussian policy and a stochastic dueling network (SDN, eq. 13)
giving ``V(x)`` and ``Q~(x, a) = V(x) + A(x, a) - 1/n sum_i A(x, u_i)``, ``u_i ~ pi``; ``Q^ret`` with
``c_t = min(1, rho_t^(1/d))`` trains ``Q~`` and ``V`` (eq. 14), ``Q^opc`` (App. B, eq. 21) drives the
policy term, and the bias correction uses one action sampled from pi (eq. 16).

Efficient trust region (sec. 3.3): the policy gradient is taken w.r.t. the distribution statistics
``phi`` (logits; loc, and scale when it is learned), projected with eq. 12 against
``k = grad_phi KL(f(.|phi_avg) || f(.|phi))`` of an average policy network
``theta_a <- alpha theta_a + (1 - alpha) theta`` (TorchRL's ``SoftUpdate`` pairing, fused: :class:`~acer_torchrl.objectives.updaters.FusedSoftUpdate`),
and back-propagated into theta through phi only. In TorchRL terms this is a surrogate loss: ``g`` (and
``k``) is computed in closed form for logits (``d log f(a) / d phi = onehot(a) - f``, ``k = f - f_avg``) and by
autograd w.r.t. a detached copy of the Gaussian's ``phi`` (exact, per step), projected to ``z*``, and
``loss_objective = -mean_t (z*_t.detach() . phi_t)`` so that ``d loss / d theta = -mean_t z*_t dphi_t/dtheta``
(Alg. 2: ``dtheta += dphi/dtheta z*``). The critic's gradient is not projected.

Deviations from the paper, and why:

* Gradients are averaged over the real steps of a batch of sequences (one Adam step per batch)
  instead of summed per thread and applied asynchronously (Alg. 2's ``dtheta`` accumulation).
* The critic loss is ``1/2 (Q^ret - Q)^2`` so that its gradient is exactly eq. 6 (Alg. 2 writes the
  gradient of the square without the 1/2).
* Eq. 9 / Alg. 2 weigh the bias correction of action ``a`` by ``Q(x_t, a) - V(x_t)`` (Alg. 2's
  ``Q(x_i, a_i)`` there is a typo for ``Q(x_i, a)``); we follow eq. 9.
* phi for discrete actions is the logits vector rather than the probability vector: it is what the
  network outputs, its KL gradient is simply ``pi - pi_avg`` and the projection keeps its meaning.
* The entropy bonus is a separate ``loss_entropy`` term, not part of the projected ``g`` (Alg. 2 has
  none; A3C's entropy regulariser is added to the objective directly).
* A window's last row (and a row whose episode was truncated) bootstraps on ``V`` of the stored
  next observation evaluated by the current network, as in Alg. 2-3's ``Q^ret <- V(x_k)``; with an
  LSTM that evaluation starts from the state the learning network's own unroll reached after that row
  (from the sequence's refreshed start state), not from the one stored at acting time
  (:func:`~acer_torchrl.objectives.common.next_state_values`, shared with LASER). Feed-forward, that
  evaluation rides in the same forward pass as the batch (:func:`~acer_torchrl.objectives.common.evaluate_with_next_steps`).
* Optional, off by default (``target_update > 0``, discrete only): ``Q^ret`` reads ``Q`` of a target copy of
  the network (torso and critic head) instead of the learning one, ``Q_T(x_t, a_t)`` and
  ``V(x_{t+1}) = sum_a pi(a|x_{t+1}) Q_T(x_{t+1}, a)`` with pi the learning policy, as Reactor's Retrace reads its
  target network (Gruslys et al. 2018, eq. 7); the copy is refreshed every ``target_update`` updates
  (:func:`~acer_torchrl.objectives.updaters.target_updater`), as LASER's optional one. ACER bootstraps on the
  network it trains (sec. 3.1); on CartPole that critic ran past ``1 / (1 - gamma)`` once episodes stopped
  ending (``benchmarks/results/cartpole-stability.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from tensordict.utils import NestedKey
from torch import nn
from torchrl.modules.distributions import IndependentNormal

from acer_torchrl.objectives import functional
from acer_torchrl.objectives.common import (
    LinearDecay,
    ReplayLoss,
    close_segments_at_padding,
    evaluate_with_next_steps,
    masked_mean,
    observation_keys,
    poisson_plan,
    sequence_mask,
    weighted_mean,
    window_priority,
    window_weight,
    shift_in_bootstraps,
    trace_cut,
)
from acer_torchrl.objectives.names import BEHAVIOUR, MASK_KEY, PRIORITY_WEIGHT_KEY
from acer_torchrl.objectives.network_call import NetworkCall


class ACERLoss(ReplayLoss):
    """ACER's loss on ``[B, T]`` sequences (on-policy windows or replayed ones).

    Args:
        actor_network: ``observation`` (+ ``is_init`` and recurrent state) -> the policy statistics
            (``"logits"``; or ``"loc"`` and ``"scale"``) and the torso features the critic reads. The
            average policy network is a copy of its parameters (``target_actor_network_params``),
            updated by ``FusedSoftUpdate(loss, eps=alpha)`` after each step when ``trust_region``.
        critic_network: reads the actor's output and writes ``"action_value"`` ``[.., A]`` (discrete)
            or ``"state_value"`` ``[.., 1]`` (continuous).
        advantage_network: continuous only: ``A(core, action) -> [.., 1]`` of the SDN (eq. 13).
        discrete: categorical (True) or diagonal Gaussian (False) policy.
        gamma: discount.
        c: truncation of the policy-gradient importance weights (eq. 9 / 16).
        trust_region, delta: the efficient trust region (sec. 3.3, eq. 11-12).
        entropy_coeff, critic_coeff: weights of the entropy bonus and of the critic loss.
        critic_coeff_end, critic_decay: not in ACER: when ``critic_coeff_end`` is given, the critic's weight falls
            linearly from ``critic_coeff`` to it over the env steps ``critic_decay = (start, end)``
            (:class:`~acer_torchrl.objectives.common.LinearDecay`, set by :meth:`at_env_steps`).
        sdn_samples: ``n`` of eq. 13.
        target_update: discrete only: when > 0, ``Q^ret`` reads the ``Q`` of ``value_network`` (actor then
            critic) run with ``target_value_network_params``, a copy refreshed every ``target_update`` updates;
            not in ACER, see above.
        replay_ratio, on_policy: Alg. 1's master loop (:meth:`update_plan`).
        hidden_keys: recurrent state keys of ``actor_network``'s LSTM, written under ``("next", key)``
            (empty when feed-forward).

    The continuous loss draws ``sdn_samples + 1`` actions from the current policy in one
    ``dist.sample((n + 1,))`` call per forward: the first is eq. 16's ``a'_t``, the others eq. 13's ``u_i``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torch import nn
        >>> from torchrl.objectives import SoftUpdate
        >>> from acer_torchrl.objectives import ACERLoss
        >>> _ = torch.manual_seed(0)
        >>> B, T, n_obs, n_act = 2, 5, 4, 3
        >>> actor = TensorDictModule(nn.Linear(n_obs, n_act), ["observation"], ["logits"])
        >>> critic = TensorDictModule(nn.Linear(n_obs, n_act), ["observation"], ["action_value"])
        >>> loss = ACERLoss(actor, critic, discrete=True)
        >>> average_policy = SoftUpdate(loss, eps=0.99)  # its step() after each optimiser step
        >>> mu = torch.distributions.Categorical(logits=torch.randn(B, T, n_act))  # the acting policy
        >>> batch = TensorDict({
        ...     "observation": torch.randn(B, T, n_obs),
        ...     "action": mu.sample(),
        ...     ("behaviour", "logits"): mu.logits,
        ...     ("next", "observation"): torch.randn(B, T, n_obs),
        ...     ("next", "reward"): torch.randn(B, T, 1),
        ...     ("next", "done"): torch.zeros(B, T, 1, dtype=torch.bool),
        ...     ("next", "terminated"): torch.zeros(B, T, 1, dtype=torch.bool),
        ... }, batch_size=[B, T])
        >>> out = loss(batch)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_critic', 'loss_entropy', 'loss_objective']
        >>> out["loss_objective"].shape
        torch.Size([])
    """

    @dataclass
    class _AcceptedKeys:
        """Configurable tensordict keys (``loss.set_keys(name=key)``).

        Attributes:
            action: taken action (int index, or float ``[.., d]``).
            reward, done, terminated: read under ``"next"``.
            behaviour_logits, behaviour_loc, behaviour_scale: mu's statistics stored at acting time.
            logits, loc, scale: the learning network's policy statistics phi.
            action_value: Q over actions (discrete); state_value: V (continuous).
            core: torso features the SDN advantage network reads (continuous).
            priority_weight: a prioritized replay's importance weight of each window (optional: every loss
                term is then weighted by it, Reactor ICLR sec. 3.3).
        """

        action: NestedKey = "action"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"
        behaviour_logits: NestedKey = (BEHAVIOUR, "logits")
        behaviour_loc: NestedKey = (BEHAVIOUR, "loc")
        behaviour_scale: NestedKey = (BEHAVIOUR, "scale")
        logits: NestedKey = "logits"
        loc: NestedKey = "loc"
        scale: NestedKey = "scale"
        action_value: NestedKey = "action_value"
        state_value: NestedKey = "state_value"
        core: NestedKey = "core"
        priority_weight: NestedKey = PRIORITY_WEIGHT_KEY

    default_keys = _AcceptedKeys
    tensor_keys: _AcceptedKeys
    value_keys = ("state_value", "q_ret")

    actor_network: TensorDictModuleBase
    actor_network_params: TensorDictParams
    target_actor_network_params: TensorDictParams
    value_network: TensorDictModuleBase
    value_network_params: TensorDictParams
    target_value_network_params: TensorDictParams

    def __init__(
        self,
        actor_network: TensorDictModuleBase,
        critic_network: TensorDictModuleBase,
        advantage_network: nn.Module | None = None,
        *,
        discrete: bool,
        gamma: float = 0.99,
        c: float = 10.0,
        trust_region: bool = True,
        delta: float = 1.0,
        entropy_coeff: float = 0.001,
        critic_coeff: float = 1.0,
        critic_coeff_end: float | None = None,
        critic_decay: Sequence[int] = (50_000, 100_000),
        sdn_samples: int = 5,
        target_update: int = 0,
        replay_ratio: float = 4.0,
        on_policy: bool = True,
        hidden_keys: list[str] | tuple[str, ...] = (),
    ):
        super().__init__()
        if not discrete and advantage_network is None:
            raise ValueError("continuous ACER needs the SDN advantage network (eq. 13)")
        if target_update and not discrete:
            raise ValueError("target_update is for discrete actions: the continuous Q^ret reads the SDN's sampled Q~")
        self.convert_to_functional(actor_network, "actor_network", create_target_params=trust_region)
        self.critic_network = critic_network
        if target_update:  # the same parameters (trained once) and their copy, target_value_network_params
            value_network = TensorDictSequential(actor_network, critic_network)
            self.convert_to_functional(value_network, "value_network", create_target_params=True)
            self._value = NetworkCall(self.value_network)
        self._actor = NetworkCall(self.actor_network)
        self._actor_critic = NetworkCall(self.actor_network, critic_network)
        self.advantage_network = advantage_network
        self.discrete = discrete
        self.gamma = gamma
        self.c = c
        self.trust_region = trust_region
        self.delta = delta
        self.entropy_coeff = entropy_coeff
        self.critic_weight = LinearDecay(critic_coeff, critic_coeff_end, critic_decay)
        self.sdn_samples = sdn_samples
        self.target_update = target_update
        self.replay_ratio = replay_ratio
        self.on_policy = on_policy
        self.hidden_keys = list(hidden_keys)

    # ------------------------------------------------------------------ TorchRL key plumbing
    @property
    def _stat_keys(self) -> list[NestedKey]:
        k = self.tensor_keys
        return [k.logits] if self.discrete else [k.loc, k.scale]

    @property
    def in_keys(self) -> list[NestedKey]:
        k = self.tensor_keys
        behaviour = [k.behaviour_logits] if self.discrete else [k.behaviour_loc, k.behaviour_scale]
        actor_in = list(self.actor_network.in_keys)
        return [
            k.action,
            *behaviour,
            *[("next", key) for key in (k.reward, k.done, k.terminated)],
            *actor_in,
            *[("next", key) for key in observation_keys(actor_in, self.hidden_keys)],
            MASK_KEY,
        ]

    @property
    def out_keys(self) -> list[str]:
        diagnostics = ["rho", "rho_clipped_share", "entropy", "state_value", "q_ret"]
        if self.trust_region:
            diagnostics += ["kl_average", "trust_region_active"]
        if self.critic_weight.end_value is not None:
            diagnostics.append("critic_weight")
        return ["loss_objective", "loss_critic", "loss_entropy", *diagnostics, "priority"]

    # ------------------------------------------------------------------ Alg. 1
    def update_plan(self, rng) -> list[float]:
        """ACER Alg. 1: one on-policy update on the fresh batch (when ``on_policy``), then
        ``Poisson(replay_ratio)`` replay updates."""
        return poisson_plan(rng, self.replay_ratio, self.on_policy)

    def _critic_weight_stat(self) -> dict[str, torch.Tensor]:
        return {} if self.critic_weight.end_value is None else {"critic_weight": torch.tensor(self.critic_weight.value)}

    def at_env_steps(self, env_steps: int) -> None:
        """The critic's weight at this point of the run (``critic_coeff_end``; not in ACER)."""
        self.critic_weight.at(env_steps)

    def stored_steps_before_first_update(self, min_size: int) -> int:
        """None with an on-policy update (the fresh batch, Alg. 1), else the replay's ``min_size``."""
        return 0 if self.on_policy else super().stored_steps_before_first_update(min_size)

    # ------------------------------------------------------------------ networks
    def _evaluate(self, inputs: TensorDictBase | dict[NestedKey, torch.Tensor]) -> Mapping:
        """The learning network (actor then critic) on ``inputs``, its outputs by key."""
        with self.actor_network_params.to_module(self.actor_network):
            return self._actor_critic(inputs)

    def _distribution(self, stats: list[torch.Tensor]) -> torch.distributions.Distribution:
        if self.discrete:
            return torch.distributions.Categorical(logits=stats[0])
        return IndependentNormal(*stats)

    def _entropy(self, stats: list[torch.Tensor]) -> torch.Tensor:
        """The policy's entropy per step, ``[.., 1]`` (discrete: from the logits, no distribution object)."""
        if self.discrete:
            log_pi = stats[0].log_softmax(-1)
            return -(log_pi.exp() * log_pi).sum(-1, keepdim=True)
        return self._distribution(stats).entropy().unsqueeze(-1)

    def _evaluate_target(self, inputs: TensorDictBase | dict[NestedKey, torch.Tensor]) -> Mapping:
        """The target copy of the network (actor then critic) on ``inputs``."""
        with torch.no_grad(), self.target_value_network_params.to_module(self.value_network):
            return self._value(inputs)

    def _state_value(self, out: Mapping, critic: Mapping | None = None) -> torch.Tensor:
        """``V(x)``: ``sum_a pi(a|x) Q(x, a)`` (discrete, sec. 3.1; pi from ``out``, Q from ``critic``, by default
        ``out`` too) or the SDN's V head (continuous)."""
        if self.discrete:
            pi = out.get(self.tensor_keys.logits).softmax(-1)
            return (pi * (out if critic is None else critic).get(self.tensor_keys.action_value)).sum(-1, keepdim=True)
        return out.get(self.tensor_keys.state_value)

    # ------------------------------------------------------------------ trust region (sec. 3.3)
    def _trained_phi(self, stats: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Detached copies of the statistics (the distribution's arguments) and, among them, the leaves
        that are phi: only the statistics that depend on theta (a fixed Gaussian std does not, sec. 5.2)."""
        leaves = [s.detach().requires_grad_(s.requires_grad) for s in stats]
        return leaves, [leaf for leaf in leaves if leaf.requires_grad]

    def _phi_gradient(self, stats: list[torch.Tensor], objective) -> torch.Tensor:
        """``g_t``: autograd of ``objective(dist)`` (the sum over steps of a per-step policy objective, all
        coefficients detached) w.r.t. a detached copy of phi: exact per step, since steps do not interact."""
        leaves, phi = self._trained_phi(stats)
        with torch.enable_grad():
            return torch.cat(torch.autograd.grad(objective(self._distribution(leaves)), phi), -1)

    def _kl_gradient(self, stats: list[torch.Tensor], average_stats: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``k_t = grad_phi KL(f(.|phi_avg,t) || f(.|phi_t))`` (eq. 12) and the KL itself, ``[.., 1]``.

        Discrete, in closed form: with phi the logits, ``k = pi - pi_avg``. Continuous: autograd.
        """
        if self.discrete:
            log_pi, log_avg = stats[0].detach().log_softmax(-1), average_stats[0].log_softmax(-1)
            avg = log_avg.exp()
            return log_pi.exp() - avg, (avg * (log_avg - log_pi)).sum(-1, keepdim=True)
        leaves, phi = self._trained_phi(stats)
        with torch.enable_grad():
            kl = torch.distributions.kl_divergence(self._distribution(average_stats), self._distribution(leaves))
            k = torch.cat(torch.autograd.grad(kl.sum(), phi), -1)
        return k, kl.detach().unsqueeze(-1)

    def _policy_surrogate(
        self,
        stats: list[torch.Tensor],
        g: torch.Tensor,
        average_stats: list[torch.Tensor] | None,
        mask: torch.Tensor,
        weight: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The phi-surrogate of the (projected) policy gradient.

        ``g`` is the gradient of the per-step policy objective w.r.t. ``phi_t`` (eq. 10 discrete, whose correction
        term as printed reads ``log f(a_t|phi)`` where eq. 9 and Alg. 2 have ``log f(a|phi)``, taken here; eq. 16
        continuous), projected to ``z*_t`` by eq. 12 against ``k_t`` (:meth:`_kl_gradient`), and returned as
        ``-mean_t z*_t . phi_t`` whose gradient carries ``z*`` into theta (each window's steps ``weight``-ed).
        """
        diagnostics = {}
        if average_stats is not None:
            k, kl = self._kl_gradient(stats, average_stats)
            z = functional.acer_trust_region(g, k, self.delta)  # eq. 12
            diagnostics["kl_average"] = masked_mean(kl, mask)
            active = (k * g).sum(-1, keepdim=True) > self.delta
            diagnostics["trust_region_active"] = masked_mean(active.float(), mask)
        else:
            z = g
        phi = torch.cat([s for s in stats if s.requires_grad], -1)
        return -weighted_mean((z.detach() * phi).sum(-1, keepdim=True), mask, weight), diagnostics

    # ------------------------------------------------------------------ forward
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        keys = self.tensor_keys
        td = tensordict
        mask = sequence_mask(td)
        reward = td.get(("next", keys.reward))
        terminated = td.get(("next", keys.terminated)).bool()
        # the estimators' done: also cut at the last real step before padding (common.trace_cut)
        done = trace_cut(td.get(("next", keys.done)).bool(), mask)
        # with an LSTM the unroll's segments end at the last real step: its state there is the bootstrap's
        inputs = close_segments_at_padding(td, mask) if self.hidden_keys else td
        # V(x_{t+1}) where row t+1 is not x_{t+1} (window end, last real step before padding, truncation):
        # the current network on the stored next observation, as Alg. 2-3's Q^ret <- V(x_k); with an LSTM from
        # the state the unroll reached after row t (common.next_state_values)
        bootstrap = mask & done & ~terminated
        out, next_out = evaluate_with_next_steps(
            self._evaluate, td, inputs, bootstrap, self.actor_network.in_keys, self.hidden_keys
        )
        stats = [out.get(key) for key in self._stat_keys]
        average_stats = None
        if self.trust_region:
            with torch.no_grad(), self.target_actor_network_params.to_module(self.actor_network):
                average = self._actor(inputs)
            average_stats = [average.get(key) for key in self._stat_keys]
        # the critic whose values Q^ret reads: the learning one, or its target copy (target_update)
        target, next_target = out, next_out
        if self.target_update:
            target, next_target = evaluate_with_next_steps(
                self._evaluate_target, td, inputs, bootstrap, self.actor_network.in_keys, self.hidden_keys
            )
        value = self._state_value(out)
        next_value = shift_in_bootstraps(
            (value if target is out else self._state_value(out, target)).detach(),
            bootstrap,
            None if next_out is None else self._state_value(next_out, next_target).detach(),
        )
        weight = window_weight(td, keys.priority_weight)
        if self.discrete:
            q_target = target.get(keys.action_value).detach()
            g, critic, rho, q_ret, td_error = self._discrete(
                td, out, q_target, stats, value, next_value, reward, terminated, done, mask, weight
            )
        else:
            g, critic, rho, q_ret, td_error = self._continuous(
                td, out, stats, value, next_value, reward, terminated, done, mask, weight
            )
        loss_objective, diagnostics = self._policy_surrogate(stats, g, average_stats, mask, weight)
        entropy_steps = self._entropy(stats)
        entropy = masked_mean(entropy_steps.detach(), mask)
        return TensorDict(
            {
                "loss_objective": loss_objective,
                "loss_critic": self.critic_weight.value * critic,
                "loss_entropy": -self.entropy_coeff * weighted_mean(entropy_steps, mask, weight),
                "rho": masked_mean(rho, mask),
                "rho_clipped_share": masked_mean((rho > self.c).float(), mask),
                "entropy": entropy,
                "state_value": masked_mean(value.detach(), mask),
                "q_ret": masked_mean(q_ret, mask),
                "priority": window_priority(td_error, mask),  # Reactor ICLR sec. 3.3: mean |Q^ret - Q(x, a)|
                **diagnostics,
                **self._critic_weight_stat(),
            },
            batch_size=[],
        )

    def _discrete(self, td, out, q_target, stats, value, next_value, reward, terminated, done, mask, weight):
        """Discrete ACER (sec. 3, Alg. 2); ``Q^ret`` reads ``q_target`` (the learning critic's Q, or its target's).
        Returns ``g``, the critic loss, rho, ``Q^ret`` and the TD error ``Q^ret - Q(x, a)``."""
        keys = self.tensor_keys
        action = td.get(keys.action).long().unsqueeze(-1)  # [B, T, 1] index
        q = out.get(keys.action_value)
        with torch.no_grad():
            log_pi = stats[0].log_softmax(-1)
            pi = log_pi.exp()
            log_rho_all = log_pi - td.get(keys.behaviour_logits).log_softmax(-1)  # log pi(a)/mu(a), all a
            rho = log_rho_all.gather(-1, action).exp()
            q_all, v = q.detach(), value.detach()
            # Retrace (eq. 5) with c_t = min(1, rho_t) (Alg. 2's rho-bar_i)
            q_ret = functional.retrace(
                self.gamma, reward, q_target.gather(-1, action), next_value, rho.clamp_max(1.0), terminated, done
            )
            rho_bar = rho.clamp_max(self.c)
            # eq. 9 bias correction over all actions: pi(a) [1 - c / rho(a)]_+ (Q(x, a) - V(x))
            correction = pi * (1.0 - self.c * torch.exp(-log_rho_all)).clamp_min(0.0) * (q_all - v)
            advantage = rho_bar * (q_ret - v)
            # g_t of eq. 10 w.r.t. the logits, in closed form: the gradient of advantage * log f(a_t) +
            # sum_a correction(a) log f(a), with d log f(a) / d logits = onehot(a) - f
            g = advantage * (torch.zeros_like(pi).scatter_(-1, action, 1.0) - pi)
            g = g + correction - pi * correction.sum(-1, keepdim=True)

        q_taken = q.gather(-1, action)
        critic = weighted_mean(0.5 * (q_ret - q_taken).pow(2), mask, weight)  # eq. 6
        return g, critic, rho, q_ret, q_ret - q_taken.detach()

    def _continuous(self, td, out, stats, value, next_value, reward, terminated, done, mask, weight):
        """Continuous ACER with a stochastic dueling network (sec. 5, Alg. 3); returns as :meth:`_discrete`."""
        keys = self.tensor_keys
        action = td.get(keys.action)
        d = action.shape[-1]
        n = self.sdn_samples
        with torch.no_grad():
            pi = self._distribution([s.detach() for s in stats])
            mu = IndependentNormal(td.get(keys.behaviour_loc), td.get(keys.behaviour_scale))
            samples = pi.sample((n + 1,))  # a'_t (eq. 16), then u_1..u_n (eq. 13)
            sampled = samples[0]
            log_rho = (pi.log_prob(action) - mu.log_prob(action)).unsqueeze(-1)
            log_rho_sampled = (pi.log_prob(sampled) - mu.log_prob(sampled)).unsqueeze(-1)
        # SDN (eq. 13): Q~(x, a) = V(x) + A(x, a) - 1/n sum_i A(x, u_i), one pass over a_t, a'_t, u_1..u_n
        advantages = self.advantage_network(out.get(keys.core), torch.cat([action.unsqueeze(0), samples], 0))
        q_tilde = value + advantages[0] - advantages[2:].mean(0)
        with torch.no_grad():
            v = value.detach()
            q_tilde_sampled = v + advantages[1] - advantages[2:].mean(0)
            q_taken = q_tilde.detach()
            rho = log_rho.exp()
            # Retrace with c_i = min(1, rho_i^(1/d)) (sec. 5.1) for the critic, Q^opc (c = 1, eq. 21) for pi
            trace = torch.exp((log_rho / d).clamp_max(0.0))
            q_ret = functional.retrace(self.gamma, reward, q_taken, next_value, trace, terminated, done)
            ones = torch.ones_like(trace)
            q_opc = functional.retrace(self.gamma, reward, q_taken, next_value, ones, terminated, done)
            advantage = rho.clamp_max(self.c) * (q_opc - v)
            # eq. 16: [1 - c / rho(a'_t)]_+ (Q~(x_t, a'_t) - V(x_t))
            correction = (1.0 - self.c * torch.exp(-log_rho_sampled)).clamp_min(0.0) * (q_tilde_sampled - v)
            v_target = rho.clamp_max(1.0) * (q_ret - q_taken) + v  # eq. 14

        def objective(dist: IndependentNormal) -> torch.Tensor:
            # sum_t of eq. 16's objective: its gradient w.r.t. phi_t is g_t of eq. 16
            return (advantage.squeeze(-1) * dist.log_prob(action)).sum() + (
                correction.squeeze(-1) * dist.log_prob(sampled)
            ).sum()

        g = self._phi_gradient(stats, objective)

        # Alg. 3: (Q^ret - Q~) grad Q~ + min(1, rho) (Q^ret - Q~) grad V  =  grads of these two squares
        critic = weighted_mean(0.5 * (q_ret - q_tilde).pow(2) + 0.5 * (v_target - value).pow(2), mask, weight)
        return g, critic, rho, q_ret, q_ret - q_taken
