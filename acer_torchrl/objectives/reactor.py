"""Reactor (Gruslys et al. 2018, "The Reactor: A Sample-Efficient Actor-Critic Architecture").

* Critic: Retrace(lambda) (eq. 1-2) towards targets built with a target network Q_T (eq. 7), updated every
  ``T_update`` learner steps (sec. 3.4), L2 loss (sec. 3.5).
* Or, with ``distributional=True``, the distributional critic (sec. 3.2 and eq. 12 of the ICLR 2018 version, as
  every "ICLR" citation here; the arXiv text the other numbers cite has no such section): ``q_i(x, a)``, a softmax over ``N`` atoms
  ``z_i = v_min + i (v_max - v_min) / (N - 1)`` per action (C51), from dueling logits (sec. 3.4.1), ``Q(x, a) =
  sum_i q_i(x, a) z_i``. Its target is Retrace written as a mixture of ``n``-step backups of Q_T's distributions,
  ``q*_i(x_t, a_t) = sum_n sum_a alpha_{n,a} sum_j q_j(x_{t+n}, a) h_{z_i}(z^n_j)``, ``z^n_j = sum_{s<n}
  gamma^s r_{t+s} + gamma^n z_j``, ``alpha_{n,a} = (c_{t+1} ... c_{t+n-1}) (pi(a|x_{t+n}) - 1{a = a_{t+n}}
  c_{t+n})`` (signed; they sum to 1), ``h`` C51's projection on the grid
  (:func:`~acer_torchrl.objectives.functional.distributional_retrace`); the loss is eq. 12's KL
  ``-sum_i q*_i log q_i(x_t, a_t)``, ``q*`` not renormalised. A window's replay priority (ICLR sec. 3.3) is the mean
  total variation ``1/2 sum_i |q*_i - q_i|`` over its steps (the ``priority`` output). The actor, the action gap
  and ``R(A)`` read the means: ``Q`` and the mean of ``q*``, which is the scalar ``Q^ret`` of Q_T's means where
  the projection is exact.
* Actor: the beta-leave-one-out policy gradient (eq. 5) with ``beta = min(c, 1/mu(A))`` (sec. 2.2):
  ``c = 1`` is LOO (eq. 4), ``c = inf`` the unbiased 1/mu-LOO (eq. 6); or TISLR (sec. 2.2) for comparison.
  ``R(A)`` is the Retrace-corrected return. Entropy bonus scaled by 0.1 x the mean action gap (sec. 3.5).
* Behaviour probabilities memorised (mu stored at acting time, "M" variants) or learned (a mu-hat head
  trained by cross-entropy on replayed actions, "L" variants, sec. 3.2), used for the traces and beta.
* Network (Table 1, arXiv sec. 3.3): a shared encoder (Atari: conv net with concatenated ReLUs; vectors: an MLP
  with concatenated ReLUs), separate LSTMs for Q, pi and mu-hat, a dueling Q head and softmax heads mixed
  with a uniform epsilon. Only the Q branch back-propagates into the shared encoder.
* Purely off-policy: every learner step replays sequences (sec. 3.6); acting overlaps learning through the
  asynchronous collector.

Deviations from the paper, and why:

* The LSTM state at a sequence's start is the replay's exact refresh by default (the paper resets it to
  zero; ``replay.recurrent_state=zero`` does that). The target network starts from the same state as the
  current network (the refresh recomputes the current network's state only).
* Figure 2 unrolls the target network on the window shifted by one. Here both networks are unrolled once on
  the ``T + 1`` observations ``x_0, x_1, ..., x_T`` of a ``T``-step window (``x_{t+1}`` is each step's next
  observation, so the last real step of an episode bootstraps on its own final observation); the current
  network learns on rows ``0..T-1`` and ``Q_T(x_{t+1}, .)``, ``pi(.|x_{t+1})`` are read on rows ``1..T``.
  The target network thus sees ``x_0`` once more as burn-in than in Figure 2.
* ``tau = replay.seq_len = 33`` learned steps per sequence (34 observations); the paper's 33 observations
  give 32 learned steps (``replay.seq_len=32`` matches it exactly).
* The mean action gap uses the expectation over the uniformly chosen other action,
  ``A/(A-1) (max_a Q - mean_a Q)``, instead of one random draw (same mean, no sampling noise).
* TISLR's correction term uses the current estimate ``Q(a)`` in place of the unknown ``Q^pi(a)``.
* Distributional Retrace ends each mixture where the scalar Retrace ends its recursion: at the window's last step,
  a ``done`` step or the last real step before padding the last backup takes ``c_{t+n} = 0``, i.e. bootstraps on
  ``E_pi`` of Q_T's distributions (a truncated step too, at its final observation); a terminated step's backup is
  a Dirac at the accumulated return. The dueling logits subtract the advantages' mean over actions per atom
  (Rainbow's form; sec. 3.4.1 only says "summing"). Sec. 3.2 gives no ``v_min``, ``v_max`` or ``N``: the
  defaults are C51's (-10, 10, 51); CartPole's returns need a wider support (``reactor.v_min=0
  reactor.v_max=1000``).
* MinAtar's 10x10 grids get MinAtar's own ReLU encoder (Young & Tian 2019): Table 1's 84x84 convolutions
  do not fit them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictParams, TensorDictSequential
from tensordict.utils import NestedKey

from acer_torchrl.objectives.common import (
    ReplayLoss,
    masked_mean,
    sequence_mask,
    trace_cut,
    weighted_mean,
    window_priority,
    window_weight,
)
from acer_torchrl.objectives.functional import distributional_retrace, retrace
from acer_torchrl.objectives.names import BEHAVIOUR, PG_ESTIMATORS, PRIORITY_WEIGHT_KEY
from acer_torchrl.objectives.network_call import NetworkCall

if TYPE_CHECKING:
    import numpy as np

# ----------------------------------------------------------------------------------------------
# Policy-gradient surrogates (sec. 2.2)
# ----------------------------------------------------------------------------------------------


def beta_loo_surrogate(
    pi: torch.Tensor, q: torch.Tensor, ret: torch.Tensor, action: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """Surrogate whose gradient is the beta-LOO estimate (eq. 5):

    ``grad = beta (R(A) - Q(A)) grad pi(A) + sum_a Q(a) grad pi(a)``.

    Args:
        pi: policy probabilities ``[*, A]`` (carrying the gradient).
        q: Q estimates ``[*, A]``; ret: ``R(A)`` ``[*, 1]``; beta: ``[*, 1]``; action: int64 ``[*, 1]``
        (all treated as constants).

    Returns:
        ``[*, 1]`` per-step surrogate (to be maximised).
    """
    q, ret, beta = q.detach(), ret.detach(), beta.detach()
    q_taken = q.gather(-1, action)
    return beta * (ret - q_taken) * pi.gather(-1, action) + (q * pi).sum(-1, keepdim=True)


def tislr_surrogate(
    log_pi: torch.Tensor,
    q: torch.Tensor,
    ret: torch.Tensor,
    action: torch.Tensor,
    log_mu: torch.Tensor,
    c: float,
) -> torch.Tensor:
    """Surrogate whose gradient is the truncated-ISLR estimate (sec. 2.2, ACER's truncation with bias
    correction), with ``V = sum_a pi(a) Q(a)`` and the estimate ``Q`` in place of ``Q^pi``:

    ``grad = min(c, rho(A)) (R(A) - V) grad log pi(A)
             + sum_a (rho(a) - c)_+ mu(a) (Q(a) - V) grad log pi(a)``,  ``rho = pi / mu``.

    Args:
        log_pi: ``[*, A]`` (carrying the gradient); q, log_mu: ``[*, A]``; ret: ``[*, 1]``; action ``[*, 1]``.
    """
    q, ret, log_mu = q.detach(), ret.detach(), log_mu.detach()
    pi = log_pi.detach().exp()
    v = (pi * q).sum(-1, keepdim=True)
    rho = (log_pi.detach() - log_mu).exp()
    truncated = rho.gather(-1, action).clamp_max(c) * (ret - v) * log_pi.gather(-1, action)
    correction = ((rho - c).clamp_min(0.0) * log_mu.exp() * (q - v) * log_pi).sum(-1, keepdim=True)
    return truncated + correction


def mean_action_gap(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over real steps of ``max_a Q(a) - Q(a')`` with ``a'`` uniform among the other actions (sec. 3.5),
    in expectation over ``a'``: ``A/(A-1) (max_a Q(a) - mean_a Q(a))``."""
    n = q.shape[-1]
    gap = (q.max(-1, keepdim=True).values - q.mean(-1, keepdim=True)) * (n / max(n - 1, 1))
    return masked_mean(gap, mask)


# ----------------------------------------------------------------------------------------------
# The critic: expected (eq. 7) or distributional (sec. 3.2)
# ----------------------------------------------------------------------------------------------


class RetraceWindow(NamedTuple):
    """What the Retrace targets read of a ``[B, T]`` window besides the target network's values."""

    reward: torch.Tensor
    action: torch.Tensor
    trace: torch.Tensor
    """``c_t = lambda min(1, pi/mu)`` (eq. 2)."""
    terminated: torch.Tensor
    cut: torch.Tensor
    """``done``, and the last real step before padding (:func:`~acer_torchrl.objectives.common.trace_cut`)."""
    mask: torch.Tensor
    pi_next: torch.Tensor
    """``pi(.|x_{t+1})``, ``[B, T, A]``, detached."""
    weight: torch.Tensor | None
    """A prioritized replay's importance weight of each window, ``[B, T, 1]`` (None: uniform replay)."""


class Critic(NamedTuple):
    """What the critic gives the rest of the loss, per step ``[B, T, .]`` unless said otherwise."""

    loss: torch.Tensor
    """``loss_critic`` (a scalar)."""
    q: torch.Tensor
    """``Q(x_t, .)`` of the learning network, ``[B, T, A]``, detached (the distributions' means when
    distributional): what the actor and the action gap read."""
    q_ret: torch.Tensor
    """The Retrace target ``Q^ret`` (the mean of ``q*`` when distributional), ``[B, T, 1]``."""
    q_taken: torch.Tensor
    """``Q(x_t, a_t)`` of the learning network, ``[B, T, 1]``, detached."""
    priority: torch.Tensor
    """Each window's replay priority, ``[B]``, detached (ICLR sec. 3.3: the mean ``|Q^ret - Q(x, a)|``; distributional:
    :func:`window_total_variation`)."""
    edge_mass: torch.Tensor | None = None
    """Distributional: ``q*``'s mass on the support's first and last atoms, ``[B, T, 1]`` (returns beyond
    ``[v_min, v_max]`` are projected there: a support too narrow for the task shows here)."""


def gather_action(per_action: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Row ``action`` of ``per_action`` ``[B, T, A, N]``: ``[B, T, N]`` (``action``: int64 ``[B, T, 1]``)."""
    index = action.unsqueeze(-1).expand(*action.shape, per_action.shape[-1])
    return per_action.gather(-2, index).squeeze(-2)


def window_total_variation(target: torch.Tensor, probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The distributional critic's replay priority (ICLR sec. 3.3: "total variation in the distributional Retrace case"):
    per window, the mean over its real steps of ``TV(q*, q) = 1/2 sum_i |q*_i - q_i|``, ``[B]`` (``target``,
    ``probs``: ``[B, T, N]``; ``mask``: ``[B, T, 1]``)."""
    return window_priority(0.5 * (target - probs).abs().sum(-1, keepdim=True), mask)


# ----------------------------------------------------------------------------------------------
# The loss
# ----------------------------------------------------------------------------------------------


class ReactorLoss(ReplayLoss):
    """Reactor's summed losses on replayed ``[B, T]`` sequences (Gruslys et al. 2018, sec. 3.5).

    Args:
        network: the learning network (see :class:`ReactorNetworks`), writing ``action_value``, ``logits``
            (log pi) and, when ``learned_behaviour``, ``mu_logits`` (log mu-hat).
        q_network: the Q branch of ``network`` (same modules); it is run with the target parameters
            ``target_network_params`` (updated by :class:`~acer_torchrl.objectives.updaters.FusedHardUpdate`) to give Q_T.

    Keyword Args:
        gamma: discount. lam: Retrace lambda (eq. 2).
        pg: ``"beta_loo"`` (eq. 5) or ``"tislr"``. beta_c: ``beta = min(beta_c, 1/mu(A))``.
        tislr_c: TISLR's truncation. entropy_coeff: entropy bonus per unit of mean action gap.
        learned_behaviour: use mu-hat (trained by cross-entropy) instead of the stored mu.
        hidden_keys: recurrent state keys of the network's LSTMs.
        distributional: the categorical critic (sec. 3.2): the networks write ``action_value_logits``
            ``[.., A, N]`` (logits over the ``atoms`` atoms from ``v_min`` to ``v_max``) instead of
            ``action_value``, trained by distributional Retrace and the KL loss (eq. 12).

    Returns (forward): ``loss_critic`` (eq. 7 regression, or eq. 12's KL when distributional),
    ``loss_objective`` (eq. 5 / TISLR), ``loss_entropy``, ``loss_behaviour`` (learned only) and diagnostics:
    every entry of :attr:`out_keys` (:data:`~acer_torchrl.objectives.names.OUTPUTS` says what each is), among them
    ``priority`` ``[B]``: each window's mean ``|Q^ret - Q(x, a)|``, or when distributional its total variation
    between ``q*`` and ``q`` (ICLR sec. 3.3).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule, TensorDictSequential
        >>> from torch import nn
        >>> from torchrl.objectives import HardUpdate
        >>> from acer_torchrl.objectives import ReactorLoss
        >>> _ = torch.manual_seed(0)
        >>> B, T, n_obs, n_act = 2, 5, 4, 3
        >>> q_network = TensorDictSequential(
        ...     TensorDictModule(nn.Linear(n_obs, n_act), ["observation"], ["action_value"]))
        >>> log_pi = nn.Sequential(nn.Linear(n_obs, n_act), nn.LogSoftmax(-1))
        >>> pi = TensorDictModule(log_pi, ["observation"], ["logits"])  # "logits": log pi
        >>> loss = ReactorLoss(TensorDictSequential(q_network, pi), q_network)
        >>> target_q = HardUpdate(loss, value_network_update_interval=999)  # Q_T: step() after each update
        >>> mu = torch.distributions.Categorical(logits=torch.randn(B, T, n_act))  # the acting policy
        >>> action = mu.sample()
        >>> batch = TensorDict({
        ...     "observation": torch.randn(B, T, n_obs),
        ...     "action": action,
        ...     ("behaviour", "log_prob"): mu.log_prob(action),
        ...     ("next", "observation"): torch.randn(B, T, n_obs),
        ...     ("next", "reward"): torch.randn(B, T, 1),
        ...     ("next", "done"): torch.zeros(B, T, 1, dtype=torch.bool),
        ...     ("next", "terminated"): torch.zeros(B, T, 1, dtype=torch.bool),
        ... }, batch_size=[B, T])
        >>> out = loss(batch)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_critic', 'loss_entropy', 'loss_objective']
        >>> out["loss_critic"].shape
        torch.Size([])
    """

    @dataclass
    class _AcceptedKeys:
        """Tensordict keys read by the loss (``set_keys`` to rename).

        Attributes:
            observation, action: the step's observation and int64 action index.
            reward, done, terminated: read under ``"next"``.
            is_init: episode-start flag (resets the LSTMs).
            behaviour_log_prob, behaviour_logits: mu written at acting time (never recomputed).
            action_value, logits, mu_logits: the network's outputs (Q, log pi, log mu-hat).
            priority_weight: a prioritized replay's importance weight of each window (optional: every loss
                term is then weighted by it, ICLR sec. 3.3).
            action_value_logits: the categorical critic's logits ``[.., A, N]`` (distributional only).
        """

        observation: NestedKey = "observation"
        action: NestedKey = "action"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"
        is_init: NestedKey = "is_init"
        behaviour_log_prob: NestedKey = (BEHAVIOUR, "log_prob")
        behaviour_logits: NestedKey = (BEHAVIOUR, "logits")
        action_value: NestedKey = "action_value"
        logits: NestedKey = "logits"
        mu_logits: NestedKey = "mu_logits"
        action_value_logits: NestedKey = "action_value_logits"
        priority_weight: NestedKey = PRIORITY_WEIGHT_KEY

    default_keys = _AcceptedKeys
    tensor_keys: _AcceptedKeys
    value_keys = ("q_ret", "q_taken")

    network: TensorDictSequential
    network_params: TensorDictParams
    target_network_params: TensorDictParams

    def __init__(
        self,
        network: TensorDictSequential,
        q_network: TensorDictSequential,
        *,
        gamma: float = 0.99,
        lam: float = 1.0,
        pg: str = "beta_loo",
        beta_c: float = 1.0,
        tislr_c: float = 10.0,
        entropy_coeff: float = 0.1,
        learned_behaviour: bool = False,
        hidden_keys: list[str] | tuple[str, ...] = (),
        updates_per_batch: float = 1.0,
        distributional: bool = False,
        atoms: int = 51,
        v_min: float = -10.0,
        v_max: float = 10.0,
    ):
        super().__init__()
        if pg not in PG_ESTIMATORS:
            raise ValueError(f"pg must be one of {PG_ESTIMATORS}, got {pg!r}")
        own = {id(p) for p in network.parameters()}
        if any(id(p) not in own for p in q_network.parameters()):
            raise ValueError("q_network must be made of network's own modules (its Q branch)")
        self.convert_to_functional(network, "network", create_target_params=True)
        self.__dict__["q_network"] = q_network  # Q branch of `network`; its parameters live in network_params
        self._network, self._q_network = NetworkCall(self.network), NetworkCall(q_network)
        self.gamma, self.lam, self.pg = gamma, lam, pg
        self.beta_c, self.tislr_c, self.entropy_coeff = beta_c, tislr_c, entropy_coeff
        self.learned_behaviour = learned_behaviour
        self.hidden_keys = list(hidden_keys)
        self.updates_per_batch = updates_per_batch
        self.distributional = distributional
        if distributional and not (atoms >= 2 and v_min < v_max):
            raise ValueError(f"the support needs atoms >= 2 and v_min < v_max, got atoms={atoms}, v_min={v_min}, "
                             f"v_max={v_max}")
        self.register_buffer("support", torch.linspace(v_min, v_max, atoms) if distributional else None)
        self._in_keys = None

    # ------------------------------------------------------------------ TorchRL plumbing
    def _set_in_keys(self):
        k = self.tensor_keys
        keys = [k.observation, ("next", k.observation), k.action, ("next", k.reward), ("next", k.done),
                ("next", k.terminated), k.behaviour_log_prob, *self.hidden_keys]
        if self.hidden_keys:
            keys.append(k.is_init)
        if self.pg == "tislr" and not self.learned_behaviour:
            keys.append(k.behaviour_logits)
        self._in_keys = keys

    @property
    def in_keys(self):
        if self._in_keys is None:
            self._set_in_keys()
        return self._in_keys

    @property
    def out_keys(self) -> list[str]:
        keys = ["loss_critic", "loss_objective", "loss_entropy", "entropy", "action_gap", "rho", "trace", "beta",
                "q_ret", "q_taken", "priority"]
        return (keys + (["support_edge_mass"] if self.distributional else [])
                + (["loss_behaviour", "mu_hat_log_error"] if self.learned_behaviour else []))

    def update_plan(self, rng: np.random.Generator) -> list[float]:
        """Replay-only learner steps (sec. 3.6): ``updates_per_batch`` per collected batch (the fraction
        drawn at random)."""
        whole = int(self.updates_per_batch)
        extra = int(rng.random() < self.updates_per_batch - whole)
        return [0.0] * (whole + extra)

    # ------------------------------------------------------------------ forward
    def _shifted_window(self, td: TensorDictBase) -> TensorDictBase:
        """The ``[B, T+1]`` observation sequence ``x_0, x_1, ..., x_T`` of a ``[B, T]`` window (``x_{t+1}``
        = step t's next observation), starting from the window's recurrent state (Figure 2)."""
        k = self.tensor_keys
        B, T = td.shape
        obs = td.get(k.observation)
        ext = TensorDict(
            {k.observation: torch.cat([obs[:, :1], td.get(("next", k.observation))], dim=1)},
            batch_size=[B, T + 1],
            device=td.device,
        )
        if self.hidden_keys:
            is_init = td.get(k.is_init).reshape(B, T, 1)
            ext.set(k.is_init, torch.cat([is_init[:, :1], torch.zeros_like(is_init)], dim=1))
            for key in self.hidden_keys:
                state = td.get(key)[:, :1]  # the LSTMs read the state of the first step only
                ext.set(key, state.expand(B, T + 1, *state.shape[2:]))
        return ext

    def _expected_critic(self, q: torch.Tensor, q_target: torch.Tensor, window: RetraceWindow) -> Critic:
        """Q (``q``: ``[B, T, A]``) regressed on Retrace's ``Q^ret`` built with ``Q_T`` (``q_target``: ``[B, T+1, A]``)
        (eq. 7, L2 loss, sec. 3.5)."""
        w = window
        with torch.no_grad():
            next_value = (w.pi_next * q_target[:, 1:]).sum(-1, keepdim=True)  # E_pi Q_T(x_{t+1}, .)
            q_ret = retrace(
                self.gamma, w.reward, q_target[:, : w.reward.shape[1]].gather(-1, w.action), next_value, w.trace,
                w.terminated, w.cut,
            )
        q_taken = q.gather(-1, w.action)
        loss = 0.5 * weighted_mean((q_ret - q_taken).pow(2), w.mask, w.weight)
        priority = window_priority(q_ret - q_taken.detach(), w.mask)  # ICLR sec. 3.3: mean |Q^ret - Q(x, a)|
        return Critic(loss, q.detach(), q_ret, q_taken.detach(), priority)

    def _distributional_critic(
        self, logits: torch.Tensor, target_logits: torch.Tensor, window: RetraceWindow
    ) -> Critic:
        """The categorical critic (``logits``: ``[B, T, A, N]``) moved towards distributional Retrace's ``q*`` built
        with ``Q_T``'s distributions (``target_logits``: ``[B, T+1, A, N]``) by the KL loss (sec. 3.2, eq. 12), and
        each window's priority (:func:`window_total_variation`). ``Q`` is the distributions' mean."""
        w = window
        with torch.no_grad():
            target = target_logits.softmax(-1)  # q_j(x_t, a) of Q_T, t = 0..T
            next_probs = (w.pi_next.unsqueeze(-1) * target[:, 1:]).sum(-2)  # sum_a pi(a|x_{t+1}) q(x_{t+1}, a)
            q_star = distributional_retrace(
                self.gamma, w.reward, gather_action(target[:, : w.reward.shape[1]], w.action), next_probs, w.trace,
                w.terminated, w.cut, self.support,
            )
        log_q = logits.log_softmax(-1)
        log_q_taken = gather_action(log_q, w.action)
        loss = weighted_mean(-(q_star * log_q_taken).sum(-1, keepdim=True), w.mask, w.weight)  # eq. 12
        probs = log_q.detach().exp()
        q = (probs * self.support).sum(-1)
        priority = window_total_variation(q_star, gather_action(probs, w.action), w.mask)
        edge_mass = q_star[..., :1] + q_star[..., -1:]
        return Critic(loss, q, (q_star * self.support).sum(-1, keepdim=True), q.gather(-1, w.action), priority,
                      edge_mass)

    @staticmethod
    def _check_episode_aligned(done: torch.Tensor, mask: torch.Tensor) -> None:
        """Replayed sequences never cross an episode boundary: a done step is the last real one."""
        if bool((done[:, :-1] & mask[:, 1:]).any()):
            raise ValueError(
                "ReactorLoss expects replayed sequences that never cross an episode boundary "
                "(EpisodeReplay.sample_sequences); got a done step followed by a real step"
            )

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        k = self.tensor_keys
        td = tensordict
        B, T = td.shape
        mask = sequence_mask(td)
        reward = td.get(("next", k.reward)).reshape(B, T, 1)
        terminated = td.get(("next", k.terminated)).reshape(B, T, 1)
        done = td.get(("next", k.done)).reshape(B, T, 1) | terminated
        self._check_episode_aligned(done, mask)
        action = td.get(k.action).reshape(B, T, 1)

        ext = self._shifted_window(td)
        critic_key = k.action_value_logits if self.distributional else k.action_value
        with self.network_params.to_module(self.network):
            out = self._network(ext)
        with torch.no_grad(), self.target_network_params.to_module(self.network):
            q_target = self._q_network(ext).get(critic_key)  # Q_T(x_t, .) (its logits), t = 0..T

        log_pi_ext = out.get(k.logits)
        log_pi, log_pi_next = log_pi_ext[:, :T], log_pi_ext[:, 1:].detach()
        log_pi_taken = log_pi.detach().gather(-1, action)
        if self.learned_behaviour:
            log_mu_hat = out.get(k.mu_logits)[:, :T]
            log_mu_all = log_mu_hat.detach()
            log_mu = log_mu_all.gather(-1, action)
        else:
            log_mu = td.get(k.behaviour_log_prob).reshape(B, T, 1)
            log_mu_all = (
                torch.log_softmax(td.get(k.behaviour_logits), dim=-1) if self.pg == "tislr" else None
            )

        # Critic: Retrace target with Q_T (eq. 7), traces c_t = lambda min(1, pi/mu) (eq. 2)
        with torch.no_grad():
            rho = (log_pi_taken - log_mu).exp()
            trace = self.lam * rho.clamp_max(1.0)
        window = RetraceWindow(reward, action, trace, terminated, trace_cut(done, mask), mask, log_pi_next.exp(),
                               window_weight(td, k.priority_weight))
        critic_of = self._distributional_critic if self.distributional else self._expected_critic
        critic = critic_of(out.get(critic_key)[:, :T], q_target, window)
        q_now, q_ret = critic.q, critic.q_ret

        # Actor: beta-LOO (eq. 5) with R(A) = Q^ret, or TISLR; Q is the current estimate
        if self.pg == "beta_loo":
            beta = (-log_mu).exp().clamp_max(self.beta_c)
            surrogate = beta_loo_surrogate(log_pi.exp(), q_now, q_ret, action, beta)
        else:
            beta = rho.clamp_max(self.tislr_c)
            surrogate = tislr_surrogate(log_pi, q_now, q_ret, action, log_mu_all, self.tislr_c)
        loss_objective = -weighted_mean(surrogate, mask, window.weight)

        # Entropy bonus scaled by the mean action gap (sec. 3.5)
        entropy = -(log_pi.exp() * log_pi).sum(-1, keepdim=True)
        gap = mean_action_gap(q_now, mask)
        loss_entropy = -self.entropy_coeff * gap * weighted_mean(entropy, mask, window.weight)

        result = TensorDict(
            {
                "loss_critic": critic.loss,
                "loss_objective": loss_objective,
                "loss_entropy": loss_entropy,
                "entropy": masked_mean(entropy.detach(), mask),
                "action_gap": gap,
                "rho": masked_mean(rho, mask),
                "trace": masked_mean(trace, mask),
                "beta": masked_mean(beta, mask),
                "q_ret": masked_mean(q_ret, mask),
                "q_taken": masked_mean(critic.q_taken, mask),
                "priority": critic.priority,
            },
            batch_size=[],
        )
        if critic.edge_mass is not None:
            result.set("support_edge_mass", masked_mean(critic.edge_mass, mask))
        if self.learned_behaviour:
            # mu-hat: cross-entropy on the replayed actions (sec. 3.5)
            result.set("loss_behaviour", -weighted_mean(log_mu_hat.gather(-1, action), mask, window.weight))
            gap_mu = (log_mu - td.get(k.behaviour_log_prob).reshape(B, T, 1)).abs()
            result.set("mu_hat_log_error", masked_mean(gap_mu, mask))
        return result
