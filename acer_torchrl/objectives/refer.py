"""ReF-ER, Remember and Forget Experience Replay (Novati & Koumoutsakos 2019, sec. 3), as a reusable piece.

ReF-ER classifies each replayed step by its importance weight ``rho_t = pi(a_t|s_t) / mu_t(a_t|s_t)``:
*near-policy* when ``1/c_max < rho_t < c_max``, *far-policy* otherwise, and

* **Rule 1** sets the gradients of far-policy samples to zero (policy *and* value gradients, sec. 4);
* **Rule 2** adds a penalty ``(1 - beta) grad D_KL(mu_t || pi)`` over every sampled step (eq. 10-11);
* the weight ``beta`` follows the far-policy fraction of the *whole* replay, computed from the most
  recent ``rho`` stored for every step (eq. 12);
* ``c_max`` and the learning rate are annealed with the number of environment steps (eq. 13).

Without Rule 1 nothing bounds ``rho_t``: for the "Rule 2 only" ablation (ReF-ER-2) the paper clips every
importance weight, ``rho_t <- min(rho_t, 10^3)`` (sec. 5.3); :meth:`ReFER.weight` does that, and only there.

:class:`ReFER` holds that state (``beta``, the step counter ``t``, the last far fraction) as buffers, so
it is checkpointed with the loss that owns it. It knows nothing of V-RACER: any loss that computes a
per-step objective from importance weights of a parametric policy and can write the latest ``rho``
back into the replay (V-RACER here; ACER's, Reactor's and LASER's per-step policy/value terms alike)
can use it: classify its steps with :meth:`ReFER.near_policy`, weigh its per-step losses with
:meth:`ReFER.gate`, add :meth:`ReFER.penalty` of ``D_KL(mu || pi)`` and, after each optimiser step, call
:meth:`ReFER.update_beta` on the weights stored in the replay. The learning-rate annealing reaches the
optimiser through ``ReplayLoss.lr_scale`` (return :attr:`ReFER.lr_scale` there).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from acer_torchrl.objectives.common import masked_mean
from acer_torchrl.objectives.functional import refer_beta_update, refer_c_max

RHO_CLIP_RULE2_ONLY = 1e3  # ReF-ER-2 (Rule 2 without Rule 1) clips rho_t <- min(rho_t, 10^3) (sec. 5.3)


def far_policy(rho: Tensor, c_max: float) -> Tensor:
    """Rule 1's far-policy weights (eq. 10): ``rho <= 1/c_max`` or ``rho >= c_max`` (bool, elementwise; a NumPy
    array gives an array)."""
    return (rho <= 1.0 / c_max) | (rho >= c_max)


def gaussian_kl(loc_p: Tensor, scale_p: Tensor, loc_q: Tensor, scale_q: Tensor) -> Tensor:
    """``D_KL(p || q)`` of two diagonal Gaussians, summed over the last (action) dim, ``[*, 1]``.

    ``sum_i log(s_q,i / s_p,i) + (s_p,i^2 + (m_p,i - m_q,i)^2) / (2 s_q,i^2) - 1/2``: the divergence
    ``D_KL(mu_t || pi(.|s_t))`` penalised by ReF-ER's Rule 2 (eq. 11) with ``p = mu_t``, ``q = pi``.
    """
    var_ratio = (scale_p / scale_q).pow(2)
    mean_term = ((loc_p - loc_q) / scale_q).pow(2)
    return 0.5 * (var_ratio + mean_term - 1.0 - var_ratio.log()).sum(-1, keepdim=True)


class ReFER(nn.Module):
    """ReF-ER's rules, its ``beta`` controller and its annealing schedules (Novati & Koumoutsakos 2019).

    Args:
        C: initial excess of the cut-off, ``c_max(t) = 1 + C / (1 + A t)`` (eq. 13; paper: 4).
        A: annealing rate of ``c_max`` and of the learning rate (eq. 13; paper: 5e-7).
        D: tolerated far-policy fraction of the replay (eq. 12; paper: 0.1).
        lr: the optimiser's initial learning rate ``eta``, also the step of the ``beta`` update (eq. 12).
        beta: initial ``beta`` (1: the plain objective, no penalty).
        rule1, rule2: switch each rule off for the paper's ablation (sec. 5, Fig. 4): without Rule 1 every
            sample counts as near-policy; without Rule 2 ``beta`` stays 1 (no penalty). Both off is plain ER
            (with ``c_max`` and the learning rate still annealed).
    """

    def __init__(
        self,
        C: float = 4.0,
        A: float = 5e-7,
        D: float = 0.1,
        lr: float = 1e-4,
        beta: float = 1.0,
        rule1: bool = True,
        rule2: bool = True,
    ):
        super().__init__()
        self.C, self.A, self.D, self.lr = C, A, D, lr
        self.rule1, self.rule2 = rule1, rule2
        self.register_buffer("beta", torch.tensor(float(beta)))
        self.register_buffer("steps", torch.tensor(0, dtype=torch.long))  # t: environment steps so far
        self.register_buffer("far_fraction", torch.tensor(0.0))  # n_far / N at the last beta update

    # ------------------------------------------------------------------ annealing (eq. 13)
    def advance(self, env_steps: int) -> None:
        """Count ``env_steps`` more environment steps (the time index ``t`` of eq. 13)."""
        self.steps += env_steps

    @property
    def c_max(self) -> float:
        """``c_max(t) = 1 + C / (1 + A t)`` (eq. 13)."""
        return float(refer_c_max(int(self.steps), self.C, self.A))

    @property
    def lr_scale(self) -> float:
        """``eta(t) / eta = 1 / (1 + A t)`` (eq. 13)."""
        return 1.0 / (1.0 + self.A * int(self.steps))

    # ------------------------------------------------------------------ Rules 1 and 2 (eq. 10-11)
    def near_policy(self, log_rho: Tensor) -> Tensor:
        """Rule 1's classification: ``1/c_max < rho < c_max``, i.e. ``|log rho| < log c_max`` (bool);
        all True without Rule 1."""
        if not self.rule1:
            return torch.ones_like(log_rho, dtype=torch.bool)
        return log_rho.abs() < math.log(self.c_max)

    def weight(self, log_rho: Tensor, near: Tensor) -> tuple[Tensor, Tensor]:
        """The importance weight ``rho_t`` entering the per-step objective (e.g. V-RACER's off-PG, eq. 5), and its
        derivative ``d rho_t / d log rho_t`` (the chain rule's factor towards the policy's log-density).

        Far-policy steps (``near`` False) get log-weight 0 (``rho = 1``) and slope 0: :meth:`gate` drops their gradient,
        which thus stays finite. With Rule 2 but not Rule 1 (ReF-ER-2), ``rho_t <- min(rho_t, 10^3)`` as in
        sec. 5.3 ("the results of ReF-ER-2 are obtained by clipping all importance weights"), clipped in log
        space so that it cannot overflow; a clipped step has slope 0. The other uses of ``rho`` (``min(1, rho)``
        in V^tbc, eq. 8; ``rho >= c_max`` in eq. 12, ``c_max <= 1 + C``) do not change under the clip while
        ``C < 999``, so the ``rho`` stored in the replay is not clipped. Plain ER (both rules off) is left
        unbounded: the paper states the clip for ReF-ER-2 only.
        """
        follows = near
        if self.rule2 and not self.rule1:
            follows = near & (log_rho < math.log(RHO_CLIP_RULE2_ONLY))
            log_rho = log_rho.clamp_max(math.log(RHO_CLIP_RULE2_ONLY))
        rho = torch.where(near, log_rho, torch.zeros_like(log_rho)).exp()
        return rho, torch.where(follows, rho, torch.zeros_like(rho))

    def far_share(self, rho: Tensor, where: Tensor | None = None) -> Tensor:
        """Fraction of far-policy weights among ``rho`` (any shape), or among those where ``where`` (bool, as many
        elements as ``rho``) holds: ``n_far / N`` of eq. 12 over the replay. (The pipeline counts it incrementally
        instead: :class:`~acer_torchrl.estimates.far_count.FarPolicyCount`.)"""
        far = far_policy(rho.detach().reshape(-1), self.c_max)
        n = far.numel()
        if where is not None:
            keep = where.reshape(-1)
            far, n = far & keep, int(keep.sum())
        return torch.tensor(int(far.sum()) / n if n else 0.0, dtype=torch.float32)

    def gate(self, objective: Tensor, near: Tensor, mask: Tensor | None = None) -> Tensor:
        """Rule 1 and the ``beta`` weight of eq. 10: ``beta * mean_t(near_t * objective_t)``.

        ``objective`` is a per-step loss of the underlying algorithm (its negative gradient is ``g_t``),
        ``near`` the mask of :meth:`near_policy`, ``mask`` the real (not padding) steps (all if ``None``);
        all ``[*, 1]``. Far-policy steps contribute exactly zero gradient; the mean still counts them
        (``1/B sum_i`` of Algorithm 3).
        """
        gated = torch.where(near, objective, torch.zeros_like(objective))
        return self.beta * masked_mean(gated, mask)

    def penalty(self, kl: Tensor, mask: Tensor | None = None) -> Tensor:
        """Rule 2 (eq. 10-11): ``(1 - beta) * mean_t D_KL(mu_t || pi(.|s_t))`` over every sampled step."""
        return (1.0 - self.beta) * masked_mean(kl, mask)

    # ------------------------------------------------------------------ beta controller (eq. 12)
    @torch.no_grad()
    def update_beta(self, stored_rho: Tensor, where: Tensor | None = None) -> None:
        """One step of eq. 12 from the far-policy fraction of ``stored_rho`` (the replay's latest weights; those
        where ``where`` holds when given, e.g. the slots holding a step), with the annealed learning rate
        ``eta(t)`` as step size. Without Rule 2 ``beta`` stays 1."""
        self.step_beta(self.far_share(stored_rho, where))

    @torch.no_grad()
    def step_beta(self, far_fraction: Tensor | float) -> None:
        """:meth:`update_beta` from the far-policy fraction ``n_far / N`` already counted (e.g. by a
        :class:`~acer_torchrl.estimates.far_count.FarPolicyCount`)."""
        self.far_fraction.fill_(far_fraction)
        if not self.rule2:
            return
        eta = self.lr * self.lr_scale
        self.beta.copy_(refer_beta_update(self.beta, self.far_fraction, self.D, eta))
