"""Pure tensor estimators shared by the ACER, Reactor, V-RACER and LASER losses.

No modules, no TensorDicts: plain functions on tensors, in the layout of
``torchrl.objectives.value.functional``.

Conventions (all estimators)
----------------------------
* Per-step tensors are ``[*B, T, 1]``: any number of batch dims, time on dim -2 (distributions over ``N``
  atoms: ``[*B, T, N]``).
* ``terminated[t]`` and ``done[t]`` (bool) describe the transition ``s_t -> s_{t+1}``, with
  ``done = terminated | truncated``. ``next_state_value[t]`` is ``V(s_{t+1})``.
* A **terminated** step does not bootstrap (``V(s_{t+1})`` is multiplied by 0). A **truncated**
  step bootstraps on ``V(s_{t+1}) = next_state_value[t]`` (the value of the state where the episode
  was cut) but, like any ``done`` step, cuts the trace: row ``t+1`` of the window then belongs to a
  new episode and nothing from it leaks back into row ``t``.
* The last row of the window bootstraps on ``next_state_value[T-1]`` with no correction beyond the
  window (ACER Alg. 2-3 start the backward recursion from ``V(x_k)``, resp. 0 when terminal).
* Within one episode ``next_state_value[t]`` and ``state_value[t+1]`` (resp. ``Q``) are the same
  number ``V(s_{t+1})``; the estimators use ``next_state_value`` for one-step bootstraps and the
  row ``t+1`` quantities for the multi-step corrections, as TorchRL's ``vtrace_advantage_estimate``.

Gradients: the estimators are ordinary differentiable torch functions (the scans below are
autograd-safe). They do **not** detach anything: callers must ``.detach()`` the targets (or call
them under ``torch.no_grad()``) when they use them as regression targets or advantages.

Definitions and fast forms: each estimator with a recursion over time has a plain reference
function, a Python loop over ``t`` written straight from the paper's equation
(:func:`retrace_reference`, :func:`vtrace_reference`, :func:`distributional_retrace_reference`): that loop is
the definition. The function beside it (:func:`retrace`, :func:`vtrace_from_weights`,
:func:`distributional_retrace`) computes the same numbers, up to float rounding (``tests/test_functional.py`` and
``tests/test_distributional.py`` check it), faster: the scalar recursions are first-order linear
recurrences ``x_t = a_t * x_{t+1} + b_t`` whose coefficients are computed for all ``t`` at once and
then solved by :func:`_affine_scan`, vectorised over every batch dim: a plain loop over ``t`` for
short windows, a log-depth associative scan (odd-even reduction) on the affine maps ``x -> a x + b``
for long ones (see ``benchmarks/results/estimators.md``); distributional Retrace's ``n``-step backups are
projected all at once, with no loop.

Several outputs come back as named tuples (:class:`VTraceReturns`, :class:`ImportanceWeights`).
LASER's relevance mask (Schmitt et al. 2019, eq. 7) is not part of V-trace: it is
:func:`laser_relevant_weights`, applied to V-trace's truncated importance weights before
:func:`vtrace_from_weights`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "ImportanceWeights",
    "VTraceReturns",
    "retrace_reference",
    "retrace",
    "project_on_support",
    "distributional_retrace_reference",
    "distributional_retrace",
    "truncated_importance_weights",
    "laser_relevant_weights",
    "vtrace_reference",
    "vtrace_from_weights",
    "vtrace",
    "implied_policy_kl",
    "acer_trust_region",
    "refer_c_max",
    "refer_lr",
    "refer_beta_update",
    "truncation_log_z",
    "truncated_normal_log_prob",
    "truncated_normal_sample",
]

# The odd-even reduction of :func:`_affine_scan` halves the window until it is at most this long,
# then a plain loop over t finishes it: below this length the loop's few small ops cost less than
# the reduction's levels (see benchmarks/results/estimators.md); windows this short are solved by
# the loop alone.
SCAN_MIN_T = 16

_LOG2_E = math.log2(math.e)


def _backward_loop(a: Tensor, b: Tensor) -> Tensor:
    """Solves ``x_t = a_t x_{t+1} + b_t`` over dim 0 backwards (``x_T = 0``), one step at a time."""
    a_rows, b_rows = a.unbind(0), b.unbind(0)
    x = b_rows[-1]
    xs = [x]
    for t in range(len(b_rows) - 2, -1, -1):
        x = torch.addcmul(b_rows[t], a_rows[t], x)
        xs.append(x)
    xs.reverse()
    return torch.stack(xs, dim=0)


def _affine_scan(a: Tensor, b: Tensor) -> Tensor:
    """Solves ``x_t = a_t x_{t+1} + b_t`` for ``t = T-1, ..., 0`` with ``x_T = 0``; time is dim -2.

    Equal to :func:`_backward_loop` on the time-major tensors (up to float rounding and the flush of
    underflowing products below); faster on long windows, whose loop would run ``T`` small ops in a
    row where this runs ``O(log T)`` levels of whole-tensor ops. Vectorised over every other dim. Log-depth for long windows: odd-even (cyclic) reduction,
    the work-efficient associative scan on the affine maps ``f_t(x) = a_t x + b_t``. Composing two
    consecutive maps, ``f_{2i} o f_{2i+1} = (a_{2i} a_{2i+1}, a_{2i} b_{2i+1} + b_{2i})``, gives a
    recurrence of the same form on the even rows alone, half as long; this repeats until at most
    ``SCAN_MIN_T`` rows remain, which a loop over t solves; then each odd row follows from the
    even row after it, ``x_{2i+1} = a_{2i+1} x_{2i+2} + b_{2i+1}``, level by level. O(T) work,
    ``2 log2(T / SCAN_MIN_T)`` vectorised levels plus ``SCAN_MIN_T`` loop steps. Composing maps
    only multiplies and adds (no division by products of traces), so it is as stable as the loop.

    Products of many small coefficients underflow, and float32 denormals make CPU arithmetic
    many times slower, so composed coefficients ``a <= sqrt(finfo.tiny)`` (1e-19 in float32) are
    set to 0. That changes ``x`` by at most ``sqrt(tiny) * max|x|``, far below float rounding,
    and keeps every product of two coefficients a normal number. Requires ``a >= 0`` (in every
    caller a discount times a trace).
    """
    a, b = a.movedim(-2, 0), b.movedim(-2, 0)  # time-major views, no copy
    tiny = torch.finfo(b.dtype).tiny ** 0.5
    odd_rows = []
    while b.shape[0] > SCAN_MIN_T:
        n, m = b.shape[0], b.shape[0] // 2
        a_even, a_odd, b_even, b_odd = a[0::2], a[1::2], b[0::2], b[1::2]
        odd_rows.append((a_odd, b_odd))
        b_next = torch.addcmul(b_even[:m], a_even[:m], b_odd)
        a_next = torch.threshold_(a_even[:m] * a_odd, tiny, 0.0)
        if n % 2:  # the last even row has no odd partner: its map is unchanged
            b_next = torch.cat([b_next, b_even[m:]])
            a_next = torch.cat([a_next, a_even[m:]])
        a, b = a_next, b_next
    x = _backward_loop(a, b)
    for a_odd, b_odd in reversed(odd_rows):
        m = a_odd.shape[0]
        if x.shape[0] > m:  # odd length: every odd row has an even row after it
            x_odd = torch.addcmul(b_odd, a_odd, x[1:])
            x = torch.cat([torch.stack([x[:m], x_odd], dim=1).flatten(0, 1), x[m:]])
        else:  # even length: the last odd row is the window's last row, x_T = 0
            x_odd = torch.cat([torch.addcmul(b_odd[:-1], a_odd[:-1], x[1:]), b_odd[-1:]])
            x = torch.stack([x, x_odd], dim=1).flatten(0, 1)
    return x.movedim(0, -2)


def _check_shapes(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) < 2 or any(s != first for s in shapes.values()):
        raise ValueError(
            "estimator inputs must all have the same shape [*B, T, 1] (time on dim -2); "
            f"got {shapes}"
        )


def _as_float(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """0/1 float copy of a bool mask (through uint8: a plain copy of the bytes, where ``mask.to(dtype)``
    takes a slower conversion path on CPU)."""
    return mask.view(torch.uint8).to(dtype)


def _shift_up(x: Tensor) -> Tensor:
    """Row ``t`` of the result is row ``t+1`` of ``x``; the last row is 0 (nothing beyond it)."""
    return torch.cat([x[..., 1:, :], torch.zeros_like(x[..., :1, :])], dim=-2)


class ImportanceWeights(NamedTuple):
    """V-trace's truncated importance weights of each step, ``[*B, T, 1]`` (IMPALA, Espeholt et al. 2018, eq. 1)."""

    rho: Tensor
    """``rhō_t``: weighs step ``t``'s own TD error ``delta_t`` (and its policy-gradient advantage)."""
    c: Tensor
    """``c_t``: carries the corrections of later steps back through step ``t`` (the trace)."""


class VTraceReturns(NamedTuple):
    """V-trace's outputs, each ``[*B, T, 1]``; differentiable, not detached."""

    value_target: Tensor
    """``v_t``, the value target (IMPALA eq. 1)."""
    pg_advantage: Tensor
    """``A_t = rhō_t (r_t + gamma v_{t+1} - V(s_t))``, the policy-gradient advantage (IMPALA Sec. 4.2)."""


def retrace_reference(
    gamma: float | Tensor,
    reward: Tensor,
    state_action_value: Tensor,
    next_state_value: Tensor,
    trace: Tensor,
    terminated: Tensor,
    done: Tensor,
) -> Tensor:
    """Retrace target ``Q^ret``: the definition, ACER's eq. 5 (Wang et al. 2017) run backwards over ``t``.

    ``Q^ret_t = r_t + gamma (1 - terminated_t) [ V(s_{t+1})
                    + (1 - done_t) c_{t+1} (Q^ret_{t+1} - Q(s_{t+1}, a_{t+1})) ]``

    with the last row of the window bootstrapping on ``V(s_T)`` alone (``Q^ret <- V(x_k)`` in
    Alg. 2-3, 0 when ``x_k`` is terminal). ``trace[t]`` is ``c_t`` for step ``t``'s own action, computed
    by the caller, which chooses the truncation: ACER's discrete Retrace passes ``min(1, rho_t)`` (Alg. 2's
    ``rho-bar_i``; eq. 5 writes ``min(c, rho_t)`` but the truncation ``c`` of eq. 9 is used in the policy
    gradient only), its continuous one ``min(1, rho_t^(1/d))`` (Sec. 5.1, Alg. 3), ``Q^opc`` all ones
    (eq. 21, App. B), Reactor ``lambda min(1, rho_t)`` (Gruslys et al. 2018, eq. 2). ``done_t`` cuts the
    trace so that the next episode in the window (from row ``t+1``) never leaks into row ``t``.

    Args:
        gamma: discount, ``>= 0``.
        reward: ``r_t``, ``[*B, T, 1]``.
        state_action_value: ``Q(s_t, a_t)``, ``[*B, T, 1]``.
        next_state_value: ``V(s_{t+1})``, ``[*B, T, 1]``.
        trace: ``c_t >= 0``, ``[*B, T, 1]``, already truncated (no clipping is applied here).
        terminated, done: bool ``[*B, T, 1]``.

    Returns:
        ``Q^ret``, ``[*B, T, 1]``; differentiable, not detached.
    """
    _check_shapes(reward=reward, state_action_value=state_action_value, next_state_value=next_state_value,
                  trace=trace, terminated=terminated, done=done)
    rows = []
    q_ret = None  # Q^ret_{t+1}
    for t in reversed(range(reward.shape[-2])):
        bootstrap = next_state_value[..., t, :]  # V(s_{t+1})
        if q_ret is not None:  # row t+1 is in the window: add its correction unless it is another episode
            correction = trace[..., t + 1, :] * (q_ret - state_action_value[..., t + 1, :])
            bootstrap = bootstrap + torch.where(done[..., t, :], 0.0, correction)
        q_ret = reward[..., t, :] + gamma * torch.where(terminated[..., t, :], 0.0, bootstrap)
        rows.append(q_ret)
    return torch.stack(rows[::-1], dim=-2)


def retrace(
    gamma: float | Tensor,
    reward: Tensor,
    state_action_value: Tensor,
    next_state_value: Tensor,
    trace: Tensor,
    terminated: Tensor,
    done: Tensor,
) -> Tensor:
    """Retrace target ``Q^ret`` (ACER, Wang et al. 2017, eq. 5 and Alg. 2-3): equal to
    :func:`retrace_reference` (same arguments, same conventions), up to float rounding.

    Faster because eq. 5 is the affine recursion ``Q^ret_t = a_t Q^ret_{t+1} + b_t``: ``a`` and ``b``
    are computed for every step in a few whole-tensor ops, and :func:`_affine_scan` solves it in
    log-depth for long windows, where the reference runs several small ops per step.
    """
    _check_shapes(reward=reward, state_action_value=state_action_value, next_state_value=next_state_value,
                  trace=trace, terminated=terminated, done=done)
    continues = _as_float(~(done | terminated), reward.dtype)
    discount = gamma * _as_float(~terminated, reward.dtype)
    # Q^ret_t = a_t Q^ret_{t+1} + b_t, a_t = gamma (1-term_t)(1-done_t) c_{t+1} (0 on the last row),
    # b_t = r_t + gamma (1-term_t) V(s_{t+1}) - a_t Q(s_{t+1}, a_{t+1})         (ACER eq. 5)
    a = gamma * continues * _shift_up(trace)
    b = torch.addcmul(reward, discount, next_state_value)
    b = torch.addcmul(b, a, _shift_up(state_action_value), value=-1)
    return _affine_scan(a, b)


# ---------------------------------------------------------------------------------------------- distributional Retrace
# Reactor's categorical critic (Gruslys et al. 2018, ICLR version, sec. 3.2): return distributions sum_i q_i delta_{z_i}
# on a uniform grid z_0 < ... < z_{N-1} (C51, Bellemare et al. 2017), ``support`` = that grid, ``[N]``.


def project_on_support(values: Tensor, weights: Tensor, support: Tensor) -> Tensor:
    """C51's projection (Bellemare et al. 2017, eq. 7; Reactor sec. 3.2's ``h_{z_i}``) of the signed masses
    ``weights`` at ``values`` (both ``[*, M]``) onto the uniform grid ``support`` (``[N]``), ``[*, N]``:
    ``sum_j weights_j h_{z_i}(values_j)`` with the triangular kernel ``h_{z_i}(z) = [1 - |clip(z) - z_i| / dz]_+``,
    ``clip`` to ``[z_0, z_{N-1}]``: each mass goes to the two atoms around its value, the nearer one getting more.

    Linear in ``weights``; keeps their sum, and their mean ``sum_j weights_j values_j`` when every value lies in
    ``[z_0, z_{N-1}]``. Computed by two scatter-adds (``O(M)``), not the ``[M, N]`` kernel matrix.
    """
    n = support.shape[-1]
    low, high = support[0], support[-1]
    position = (values.clamp(low, high) - low) * ((n - 1) / (high - low))  # in [0, N-1]
    lower = position.floor().clamp_max(n - 2)
    upper_share = position - lower  # h_{z_lower} = 1 - upper_share, h_{z_lower+1} = upper_share
    lower = lower.long()
    out = weights.new_zeros(*weights.shape[:-1], n)
    out.scatter_add_(-1, lower, weights - weights * upper_share)
    return out.scatter_add_(-1, lower + 1, weights * upper_share)


def _check_distributions(support: Tensor, per_step: Tensor, **probs: Tensor) -> None:
    """Every one of ``probs`` is ``[*B, T, N]``: the per-step ``[*B, T, 1]`` shape with ``N = len(support)``."""
    want = (*per_step.shape[:-1], support.shape[-1])
    shapes = {name: tuple(p.shape) for name, p in probs.items()}
    if support.ndim != 1 or any(s != want for s in shapes.values()):
        raise ValueError(f"distributions must be [*B, T, N] with N = len(support) = {support.shape[-1]} and "
                         f"[*B, T] = {tuple(per_step.shape[:-1])}; got {shapes}")


def distributional_retrace_reference(
    gamma: float | Tensor,
    reward: Tensor,
    next_probs: Tensor,
    next_policy: Tensor,
    action: Tensor,
    trace: Tensor,
    terminated: Tensor,
    done: Tensor,
    support: Tensor,
) -> Tensor:
    """Distributional Retrace's target ``q*``: the definition, Reactor sec. 3.2 (Gruslys et al. 2018) term by term,
    a loop over ``t``, ``n`` and the action ``a``.

    ``q*_i(x_t, a_t) = sum_{n >= 1} sum_a alpha_{n,a} sum_j q_j(x_{t+n}, a) h_{z_i}(z^n_j)``, with the ``n``-step
    atoms ``z^n_j = sum_{s=t}^{t+n-1} gamma^{s-t} r_s + gamma^n z_j`` and the (signed) mixture weights
    ``alpha_{n,a} = (c_{t+1} ... c_{t+n-1}) (pi(a|x_{t+n}) - 1{a = a_{t+n}} c_{t+n})``; ``h`` is
    :func:`project_on_support`'s kernel, written out here. Where the window holds the episode no further (``done``,
    the window's last row: as in :func:`retrace_reference`) the mixture ends: its last ``n`` takes
    ``c_{t+n} = 0``, so that it bootstraps on ``E_pi`` (``sum_{n,a} alpha_{n,a} = 1`` still); a terminated last
    step bootstraps on nothing: its backup is a Dirac at the accumulated return (``gamma^n z_j`` times 0).

    Args:
        gamma: discount, ``>= 0``.
        reward: ``r_t``, ``[*B, T, 1]``.
        next_probs: ``q_j(x_{t+1}, a)`` for every action, ``[*B, T, A, N]``.
        next_policy: ``pi(a|x_{t+1})``, ``[*B, T, A]``.
        action: ``a_t`` (int64), ``[*B, T, 1]``.
        trace: ``c_t``, ``[*B, T, 1]``. terminated, done: bool ``[*B, T, 1]``.
        support: the grid ``z``, ``[N]``, uniform and increasing.

    Returns:
        ``q*``, ``[*B, T, N]`` (its entries may be negative; they sum to 1).
    """
    T, num_actions = reward.shape[-2], next_policy.shape[-1]
    dz = (support[-1] - support[0]) / (support.shape[-1] - 1)

    def h(values: Tensor) -> Tensor:  # [*, N] values -> [*, N values, N atoms]
        clipped = values.clamp(support[0], support[-1]).unsqueeze(-1)
        return (1 - (clipped - support).abs() / dz).clamp_min(0.0)

    rows = []
    for t in range(T):
        target = torch.zeros(*reward.shape[:-2], support.shape[-1], dtype=reward.dtype, device=reward.device)
        open_ = torch.ones_like(done[..., t, :])  # the window still holds the episode at x_{t+n}
        traces = torch.ones_like(reward[..., t, :])  # c_{t+1} ... c_{t+n-1}
        accumulated = torch.zeros_like(reward[..., t, :])  # sum_{s=t}^{t+n-1} gamma^{s-t} r_s
        for n in range(1, T - t + 1):
            k = t + n - 1  # the n-step backup's last step: x_k -> x_{t+n}
            accumulated = accumulated + gamma ** (n - 1) * reward[..., k, :]
            ends = done[..., k, :] | terminated[..., k, :] | (k == T - 1)
            atoms = accumulated + torch.where(terminated[..., k, :], 0.0, gamma**n * support)
            for a in range(num_actions):
                alpha = next_policy[..., k, a : a + 1]
                if k < T - 1:  # a_{t+n} and c_{t+n} are row t+n's
                    taken = (action[..., k + 1, :] == a) & ~ends
                    alpha = alpha - torch.where(taken, trace[..., k + 1, :], 0.0)
                backup = (next_probs[..., k, a, :].unsqueeze(-1) * h(atoms)).sum(-2)  # sum_j q_j h_{z_i}(z^n_j)
                target = target + torch.where(open_, traces * alpha, 0.0) * backup
            if k < T - 1:
                traces = traces * trace[..., k + 1, :]
            open_ = open_ & ~ends
        rows.append(target)
    return torch.stack(rows, dim=-2)


def distributional_retrace(
    gamma: float | Tensor,
    reward: Tensor,
    state_action_probs: Tensor,
    next_state_probs: Tensor,
    trace: Tensor,
    terminated: Tensor,
    done: Tensor,
    support: Tensor,
) -> Tensor:
    """Distributional Retrace's target ``q*`` (Reactor sec. 3.2): equal to :func:`distributional_retrace_reference`
    up to float rounding, from the arguments of :func:`retrace` with distributions in place of values:
    ``state_action_probs`` = ``q(x_t, a_t)`` and ``next_state_probs`` = ``sum_a pi(a|x_{t+1}) q(x_{t+1}, a)``, each
    ``[*B, T, N]`` (within an episode row ``t+1`` of the first is ``q(x_{t+1}, a_{t+1})``).

    Summing ``alpha_{n,a}`` over ``a`` leaves two backups per ``n``: with ``k = t + n - 1``,
    ``P_{t,k} = c_{t+1} ... c_{t+n-1}`` and ``end`` the row where ``t``'s mixture ends (see the reference),

    ``q*(x_t, a_t) = sum_{k=t}^{end} P_{t,k} Proj[ (next_state_probs_k - 1{k < end} c_{k+1} state_action_probs_{k+1})
    at the atoms G_{t,k} + gamma^{k-t+1} (1 - terminated_k) z ]``, ``G_{t,k} = sum_{s=t}^{k} gamma^{s-t} r_s``.

    Its mean is :func:`retrace`'s ``Q^ret`` of the means where the projection is exact (every atom inside the
    support): eq. 3 unrolled, the recursion ``Q^ret_t = r_t + gamma [E_pi Q(x_{t+1}) - c_{t+1} (Q(x_{t+1}, a_{t+1})
    - Q^ret_{t+1})]`` on signed distributions. The recursion would shift the support at every step, so each
    ``n``-step backup is projected once, as the definition does, at once for all ``k >= t``: ``[*B, T (T+1) / 2, N]``
    tensors, no loop (a projection per step of the recursion would differ from the definition).
    """
    _check_shapes(reward=reward, trace=trace, terminated=terminated, done=done)
    _check_distributions(support, reward, state_action_probs=state_action_probs, next_state_probs=next_state_probs)
    T = reward.shape[-2]
    steps = torch.arange(T, device=reward.device)
    k_minus_t = (steps - steps[:, None]).to(reward.dtype)  # [t, k]
    ahead = k_minus_t >= 0
    cut = (done | terminated).squeeze(-1).clone()
    cut[..., -1] = True  # the window's last row
    cuts_before = cut.cumsum(-1) - cut.long()  # cuts at rows < k
    # row k's backup is in t's mixture: k >= t and no cut in rows t..k-1; the mixture ends at the first cut
    reach = ahead & (cuts_before.unsqueeze(-1) == cuts_before.unsqueeze(-2))
    ends = reach & cut.unsqueeze(-2)
    c = trace.squeeze(-1).unsqueeze(-2)  # c_s along the last dim
    traces = torch.where(k_minus_t > 0, c, 1.0).cumprod(-1) * reach  # P_{t,k}, 0 outside the mixture
    discounts = torch.as_tensor(gamma, dtype=reward.dtype, device=reward.device) ** k_minus_t.clamp_min(0)
    returns = (torch.where(ahead, discounts, 0.0) * reward.squeeze(-1).unsqueeze(-2)).cumsum(-1)  # G_{t,k}
    scale = gamma * discounts * _as_float(~terminated, reward.dtype).squeeze(-1).unsqueeze(-2)
    # the [.., N] backups of the pairs k >= t only (half of the [T, T] table), projected, then summed per t
    pair_t, pair_k = torch.triu_indices(T, T, device=reward.device)
    atoms = returns[..., pair_t, pair_k, None] + scale[..., pair_t, pair_k, None] * support  # [*B, pairs, N]
    correction = _shift_up(trace * state_action_probs)[..., pair_k, :]  # c_{k+1} q(x_{k+1}, a_{k+1}) at row k
    backups = next_state_probs[..., pair_k, :] - torch.where(ends[..., pair_t, pair_k, None], 0.0, correction)
    projected = project_on_support(atoms, traces[..., pair_t, pair_k, None] * backups, support)
    return projected.new_zeros(state_action_probs.shape).index_add_(-2, pair_t, projected)


def truncated_importance_weights(log_rho: Tensor, rho_bar: float = 1.0, c_bar: float = 1.0) -> ImportanceWeights:
    """``rhō_t = min(rho_bar, rho_t)`` and ``c_t = min(c_bar, rho_t)``, ``rho_t = exp(log_rho_t) =
    pi(a_t|s_t) / mu(a_t|s_t)`` (IMPALA eq. 1)."""
    # rho = exp(log_rho), computed as 2^(log_rho log2 e): same values to 1 ulp, and on CPU torch's
    # exp opens a parallel region even for a few elements, which can cost a scheduler tick whenever
    # the cores are shared with other processes; exp2 does not.
    rho = torch.exp2(log_rho * _LOG2_E)
    return ImportanceWeights(rho=rho.clamp_max(rho_bar), c=rho.clamp_max(c_bar))


def laser_relevant_weights(weights: ImportanceWeights, relevance: Tensor) -> ImportanceWeights:
    """V-trace's weights under LASER's trust region (Schmitt et al. 2019, eq. 7): ``lambda_t rhō_t`` and
    ``lambda_t c_t``, for :func:`vtrace_from_weights`.

    ``relevance`` (bool, ``[*B, T, 1]``) is the paper's ``lambda(s_t) = 1[beta(pi, mu, s_t) < b]``
    (relevant = KL below the threshold, as ``M_beta`` in LASER Sec. 4.1; the ``> b`` printed under eq. 7
    contradicts it). Eq. 7 multiplies every ``c_{t+i}`` in the trace product by ``lambda(s_{t+i})`` and
    the ``rho_{t+k} delta_{t+k}`` term by ``lambda(s_{t+k})``; in V-trace's recursion that is exactly
    ``rhō_t <- lambda_t rhō_t`` and ``c_t <- lambda_t c_t``. For a rejected step ``j`` (``lambda_j = 0``)
    this means:

    * ``value_target[j] = V(s_j)`` and ``pg_advantage[j] = 0`` (its ``rho delta`` term is 0), so
      with a detached target it contributes no value or policy gradient;
    * the bootstrap stops at ``s_j``: an earlier step ``t < j`` of the same episode sums
      corrections only up to ``j - 1`` (its trace product holds ``lambda_j c_j = 0``), so its last
      correction ``delta_{j-1} = r_{j-1} + gamma V(s_j) - V(s_{j-1})`` bootstraps on the rejected
      step's own value ``V(s_j)``, and its advantage uses ``v_j = V(s_j)``;
    * later steps ``t > j`` are unaffected (the recursion runs backwards).
    """
    _check_shapes(rho=weights.rho, c=weights.c, relevance=relevance)
    keep = _as_float(relevance, weights.rho.dtype)
    return ImportanceWeights(rho=weights.rho * keep, c=weights.c * keep)


def vtrace_reference(
    gamma: float | Tensor,
    reward: Tensor,
    state_value: Tensor,
    next_state_value: Tensor,
    weights: ImportanceWeights,
    terminated: Tensor,
    done: Tensor,
) -> VTraceReturns:
    """V-trace targets and policy-gradient advantages: the definition, IMPALA's eq. 1 (Espeholt et al.
    2018) in its recursive form (their Remark 1; LASER Sec. 2.3 gives the sum form) run backwards over ``t``.

    With ``rhō_t, c_t = weights`` (:func:`truncated_importance_weights`, possibly under
    :func:`laser_relevant_weights`) and ``delta_t = r_t + gamma (1 - terminated_t) V(s_{t+1}) - V(s_t)``:

    ``v_t = V(s_t) + rhō_t delta_t + gamma (1 - done_t) c_t (v_{t+1} - V(s_{t+1}))``

    cut at ``done`` and at the window end, where the last row bootstraps on ``V(s_T)`` through
    ``delta``. The policy-gradient advantage (IMPALA Sec. 4.2) is

    ``A_t = rhō_t (r_t + gamma (1 - terminated_t) v_{t+1} - V(s_t))``

    where ``v_{t+1}`` is the target of row ``t+1`` when it is in the same episode (``done_t``
    false) and ``V(s_{t+1}) = next_state_value[t]`` otherwise or on the last row.

    **V-RACER.** ReF-ER's ``V^tbc`` (Novati & Koumoutsakos 2019, eq. 8),
    ``V^tbc_t = V(s_t) + rhō_t [r_{t+1} + gamma V^tbc_{t+1} - V(s_t)]`` with
    ``rhō_t = min(1, rho_t)`` (their ``r_{t+1}`` is our ``r_t``), is V-trace with
    ``rho_bar = c_bar = 1``: then ``c_t = rhō_t`` and the recursion above reads
    ``v_t = V(s_t) + rhō_t (r_t + gamma V(s_{t+1}) - V(s_t)) + gamma rhō_t (v_{t+1} - V(s_{t+1}))
    = V(s_t) + rhō_t (r_t + gamma v_{t+1} - V(s_t))`` (tested in ``tests/test_functional.py``).

    Args:
        gamma: discount, ``>= 0``.
        reward: ``r_t``, ``[*B, T, 1]``.
        state_value: ``V(s_t)``, ``[*B, T, 1]``.
        next_state_value: ``V(s_{t+1})``, ``[*B, T, 1]``.
        weights: ``rhō_t`` and ``c_t``, each ``[*B, T, 1]``.
        terminated, done: bool ``[*B, T, 1]``.
    """
    rho, c = weights
    _check_shapes(reward=reward, state_value=state_value, next_state_value=next_state_value, rho=rho, c=c,
                  terminated=terminated, done=done)
    targets, advantages = [], []
    v_after = None  # v_{t+1}
    for t in reversed(range(reward.shape[-2])):
        r, value, next_value = reward[..., t, :], state_value[..., t, :], next_state_value[..., t, :]
        end = terminated[..., t, :]
        # v_{t+1} where row t+1 is in the window and the same episode, V(s_{t+1}) otherwise
        # (the correction reads next_state_value[t] where vtrace_from_weights reads state_value[t+1]: the same
        # number V(s_{t+1}) within an episode, the module's convention)
        v_next = next_value if v_after is None else torch.where(done[..., t, :], next_value, v_after)
        delta = r + gamma * torch.where(end, 0.0, next_value) - value
        v_t = value + rho[..., t, :] * delta + gamma * c[..., t, :] * (v_next - next_value)
        advantages.append(rho[..., t, :] * (r + gamma * torch.where(end, 0.0, v_next) - value))
        targets.append(v_t)
        v_after = v_t
    return VTraceReturns(torch.stack(targets[::-1], dim=-2), torch.stack(advantages[::-1], dim=-2))


def vtrace_from_weights(
    gamma: float | Tensor,
    reward: Tensor,
    state_value: Tensor,
    next_state_value: Tensor,
    weights: ImportanceWeights,
    terminated: Tensor,
    done: Tensor,
) -> VTraceReturns:
    """V-trace targets and policy-gradient advantages (IMPALA, Espeholt et al. 2018, eq. 1 and Sec. 4.2):
    equal to :func:`vtrace_reference` (same arguments, same conventions), up to float rounding.

    Faster because the recursion is affine in ``v_t - V(s_t)``: its coefficients come from a few
    whole-tensor ops and :func:`_affine_scan` solves it in log-depth for long windows; the advantages
    then follow from the targets in one vectorised op, where the reference runs several small ops per step.
    """
    rho, c = weights
    _check_shapes(reward=reward, state_value=state_value, next_state_value=next_state_value, rho=rho, c=c,
                  terminated=terminated, done=done)
    discount = gamma * _as_float(~terminated, reward.dtype)  # gamma (1 - terminated_t)
    continues = _as_float(~(done | terminated), reward.dtype)  # row t+1 is the same episode
    # rho_t delta_t, delta_t = r_t + gamma (1 - terminated_t) V(s_{t+1}) - V(s_t)
    weighted_td = rho * (torch.addcmul(reward, discount, next_state_value) - state_value)
    # v_t - V(s_t) = rho_t delta_t + gamma (1 - done_t) c_t (v_{t+1} - V(s_{t+1}))  (IMPALA eq. 1)
    value_target = state_value + _affine_scan(gamma * continues * c, weighted_td)
    # A_t = rho_t (r_t + gamma (1 - terminated_t) v_{t+1} - V(s_t))  (IMPALA Sec. 4.2, LASER eq. 2)
    #     = rho_t delta_t + gamma (1 - done_t) rho_t (v_{t+1} - V(s_{t+1})): the bracket is 0
    # where row t+1 is another episode or beyond the window (v_{t+1} := V(s_{t+1}) there)
    next_target = torch.cat([value_target[..., 1:, :], next_state_value[..., -1:, :]], dim=-2)
    pg_advantage = torch.addcmul(weighted_td, gamma * continues * rho, next_target - next_state_value)
    return VTraceReturns(value_target, pg_advantage)


def vtrace(
    gamma: float | Tensor,
    reward: Tensor,
    state_value: Tensor,
    next_state_value: Tensor,
    log_rho: Tensor,
    terminated: Tensor,
    done: Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> VTraceReturns:
    """Plain V-trace (IMPALA, Espeholt et al. 2018, eq. 1 and Sec. 4.2) from ``log_rho_t =
    log pi(a_t|s_t) - log mu(a_t|s_t)``: :func:`vtrace_from_weights` on
    :func:`truncated_importance_weights` ``(log_rho, rho_bar, c_bar)``; see :func:`vtrace_reference`
    for the definition. LASER composes the same two with :func:`laser_relevant_weights` between them.
    """
    weights = truncated_importance_weights(log_rho, rho_bar, c_bar)
    return vtrace_from_weights(gamma, reward, state_value, next_state_value, weights, terminated, done)


def implied_policy_kl(log_pi: Tensor, log_mu: Tensor, rho_bar: float = 1.0) -> Tensor:
    """``KL(pi || pi~_mu)`` over the last (action) dim, LASER (Schmitt et al. 2019) eq. 3 / 8.

    ``pi~_mu(a) = min(rho_bar mu(a), pi(a)) / sum_b min(rho_bar mu(b), pi(b))`` is the policy
    whose value V-trace actually estimates (LASER Prop. 1). LASER Sec. 4.3 uses this KL as the
    behaviour relevance ``beta_KL``. Computed in log space; actions with ``pi(a) = 0`` add 0.

    Args:
        log_pi, log_mu: log-probabilities over actions, ``[*, A]``.
        rho_bar: V-trace's clipping level ``rhō``.

    Returns:
        ``[*, 1]``.
    """
    # log min(rho_bar mu(a), pi(a)), normalised over actions (LASER eq. 3)
    log_min = torch.minimum(log_pi, log_mu + math.log(rho_bar))
    log_implied = log_min - torch.logsumexp(log_min, dim=-1, keepdim=True)
    # sum_a pi(a) (log pi(a) - log pi~(a)); the where keeps 0 * (-inf + inf) out of values and grads
    log_ratio = torch.where(log_pi > -math.inf, log_pi - log_implied, torch.zeros_like(log_pi))
    return (log_pi.exp() * log_ratio).sum(dim=-1, keepdim=True)


def acer_trust_region(g: Tensor, k: Tensor, delta: float | Tensor) -> Tensor:
    """ACER's trust-region projection of a gradient (Wang et al. 2017, eq. 12), row-wise:

    ``z* = g - max(0, (k^T g - delta) / ||k||^2) k``,

    the solution of ``min_z ||g - z||^2 / 2`` s.t. ``k^T z <= delta`` (eq. 11). ``g`` and ``k`` are
    ``[*, D]`` (gradients w.r.t. the policy statistics ``phi``, ``k`` the gradient of
    ``KL(f(.|phi_avg) || f(.|phi))``), ``delta >= 0``. Rows with ``k = 0`` satisfy the
    constraint (``k^T z = 0 <= delta``) and return ``g`` unchanged: the denominator is clamped
    away from 0 and the numerator ``-delta`` then clips the scale to 0.
    """
    k_dot_g = (k * g).sum(dim=-1, keepdim=True)
    k_sq = (k * k).sum(dim=-1, keepdim=True)
    scale = ((k_dot_g - delta) / k_sq.clamp_min(torch.finfo(k_sq.dtype).tiny)).clamp_min(0.0)
    return g - scale * k


def refer_c_max(step: int | float | Tensor, C: float, A: float) -> float | Tensor:
    """ReF-ER's annealed cut-off ``c_max(t) = 1 + C / (1 + A t)`` (Novati & Koumoutsakos 2019,
    eq. 13); a step with ``1/c_max < rho_t < c_max`` is near-policy (eq. 10)."""
    return 1.0 + C / (1.0 + A * step)


def refer_lr(step: int | float | Tensor, lr0: float, A: float) -> float | Tensor:
    """ReF-ER's annealed learning rate ``eta(t) = eta / (1 + A t)`` (ReF-ER eq. 13)."""
    return lr0 / (1.0 + A * step)


def refer_beta_update(
    beta: float | Tensor, far_fraction: float | Tensor, D: float, lr: float | Tensor
) -> float | Tensor:
    """ReF-ER's penalty-weight update (Novati & Koumoutsakos 2019, eq. 12):

    ``beta <- (1 - eta) beta``         if ``n_far / N > D``,
    ``beta <- (1 - eta) beta + eta``   otherwise,

    with ``eta`` the (annealed, :func:`refer_lr`) learning rate. ``beta`` weighs the off-policy
    gradient against the KL penalty (eq. 10): too many far-policy samples shrink ``beta`` towards
    the fixed point 0 (more penalty), few grow it towards 1.
    """
    return (1.0 - lr) * beta + lr * (far_fraction <= D)


# ---------------------------------------------------------------------------------------------- truncated normal
# V-RACER's actions (Novati & Koumoutsakos 2019, App. A): a diagonal normal truncated at ``width`` std from its mean

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def truncation_log_z(width: float) -> float:
    """``log Z``, ``Z = erf(width / sqrt 2)``: the mass of a normal within ``width`` std of its mean."""
    return math.log(math.erf(width / math.sqrt(2.0)))


def truncated_normal_log_prob(action: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor, log_z: float) -> torch.Tensor:
    """``log N(a; m, s) - d log Z`` summed over the last (action) dim, ``[*]``: the density of ``modules.TruncatedGaussian``
    inside its support, ``sum_i [-z_i^2 / 2 - log s_i - log sqrt(2 pi)] - d log Z`` with ``z = (a - m) / s``."""
    z = (action - loc) / scale
    return (-0.5 * z.pow(2) - scale.log()).sum(-1) - action.shape[-1] * (_LOG_SQRT_2PI + log_z)


def truncated_normal_sample(loc: torch.Tensor, scale: torch.Tensor, width: float) -> torch.Tensor:
    """A draw of ``loc.shape`` from the normal ``N(loc, scale)`` truncated at ``width`` std from its mean (App. A), by
    the inverse CDF of a uniform draw inside the truncation's quantiles."""
    edge = torch.special.ndtr(torch.tensor(-width, dtype=loc.dtype)).item()
    u = torch.empty(loc.shape, dtype=loc.dtype, device=loc.device).uniform_(edge, 1.0 - edge)
    return loc + scale * torch.special.ndtri(u)
