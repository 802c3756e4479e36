"""Tests of the pure estimators: each fast form against its reference loop in ``functional``, and the references
against the papers' equations in other forms (sums, hand numbers).

The loops below run over batch elements and time in Python floats; they share no code with
``acer_torchrl.objectives.functional``. Windows hold terminated steps, truncated steps and episode
boundaries mid-window.
"""

import math

import pytest
import torch

from acer_torchrl.estimates.affine_tree import AffineSuffixTree
from acer_torchrl.objectives import functional as F
from acer_torchrl.objectives.functional import (
    ImportanceWeights,
    VTraceReturns,
    acer_trust_region,
    implied_policy_kl,
    laser_relevant_weights,
    refer_beta_update,
    refer_c_max,
    refer_lr,
    retrace,
    retrace_reference,
    truncated_importance_weights,
    vtrace,
    vtrace_from_weights,
    vtrace_reference,
)

GAMMA = 0.9
SHORT_T = F.SCAN_MIN_T - 3  # solved by the loop over t
LONG_T = 2 * F.SCAN_MIN_T + 5  # solved by the log-depth scan
BATCH = (2, 3)


# ----------------------------------------------------------------------------- data


def make_window(batch=BATCH, T=LONG_T, seed=0, p_done=0.15, dtype=torch.float64):
    """Random window: episode boundaries, terminated and truncated steps mid-window and at the end.

    Values are consistent: within an episode ``next_state_value[t] == state_value[t+1]`` (and the
    same for Q); across a boundary ``next_state_value[t]`` is the value of the episode's last state
    (arbitrary for a terminated step: the estimators must ignore it).
    """
    g = torch.Generator().manual_seed(seed)
    shape = (*batch, T, 1)
    n = math.prod(batch)
    done = torch.rand(shape, generator=g) < p_done
    terminated = done & (torch.rand(shape, generator=g) < 0.5)
    flat_done, flat_term = done.view(n, T), terminated.view(n, T)
    # every kind of step appears mid-window and at the window end in some rows
    flat_done[0, T // 3] = flat_term[0, T // 3] = True
    flat_done[0, T // 2], flat_term[0, T // 2] = True, False
    flat_done[1 % n, T - 1] = flat_term[1 % n, T - 1] = True
    flat_done[2 % n, T - 1], flat_term[2 % n, T - 1] = True, False
    state_value = torch.randn(shape, generator=g, dtype=dtype)
    q = torch.randn(shape, generator=g, dtype=dtype)
    boundary_value = torch.randn(shape, generator=g, dtype=dtype)
    next_sv = torch.cat([state_value[..., 1:, :], boundary_value[..., -1:, :]], dim=-2)
    next_sv = torch.where(done, boundary_value, next_sv)
    return dict(
        reward=torch.randn(shape, generator=g, dtype=dtype),
        state_value=state_value,
        state_action_value=q,
        next_state_value=next_sv,
        log_rho=0.7 * torch.randn(shape, generator=g, dtype=dtype),
        terminated=terminated,
        done=done,
        relevance=torch.rand(shape, generator=g) < 0.8,
    )


def rows(x):
    """[*B, T, 1] -> list (batch elements) of lists (time) of Python numbers."""
    return x.reshape(-1, x.shape[-2]).tolist()


def from_rows(values, like):
    return torch.tensor(values, dtype=like.dtype).reshape(like.shape)


# ------------------------------------------------------------------ reference loops


def vtrace_sum(gamma, reward, v, next_v, log_rho, terminated, done, rho_bar, c_bar, relevance):
    """IMPALA eq. 1 as a sum, with LASER eq. 7's lambda in the trace product and on rho delta:
    v_s = V(x_s) + sum_{t=s}^{end} gamma^{t-s} (prod_{i=s}^{t-1} lambda_i c_i) lambda_t rho_t
    delta_t,
    end = last step of s's episode inside the window. A_s = rho_s (r_s + gamma v_{s+1} - V(x_s))."""
    out_v, out_a = [], []
    for r, vv, nv, lr, te, do, lam in zip(
        *map(rows, (reward, v, next_v, log_rho, terminated, done, relevance))
    ):
        T = len(r)
        rho = [min(rho_bar, math.exp(x)) * l for x, l in zip(lr, lam)]
        cc = [min(c_bar, math.exp(x)) * l for x, l in zip(lr, lam)]
        delta = [r[t] + gamma * (0.0 if te[t] else nv[t]) - vv[t] for t in range(T)]
        vs = []
        for s in range(T):
            total, weight = vv[s], 1.0
            for t in range(s, T):
                total += weight * rho[t] * delta[t]
                if do[t]:
                    break
                weight *= gamma * cc[t]
            vs.append(total)
        adv = []
        for s in range(T):
            v_next = vs[s + 1] if (s < T - 1 and not do[s]) else nv[s]
            adv.append(rho[s] * (r[s] + gamma * (0.0 if te[s] else v_next) - vv[s]))
        out_v.append(vs)
        out_a.append(adv)
    return from_rows(out_v, reward), from_rows(out_a, reward)


def vtbc_reference(gamma, reward, v, next_v, log_rho, terminated, done):
    """ReF-ER eq. 8: V^tbc_t = V(s_t) + min(1, rho_t) [r_{t+1} + gamma V^tbc_{t+1} - V(s_t)]."""
    out = []
    for r, vv, nv, lr, te, do in zip(*map(rows, (reward, v, next_v, log_rho, terminated, done))):
        T = len(r)
        res = [0.0] * T
        for t in range(T - 1, -1, -1):
            if te[t]:
                nxt = 0.0
            elif do[t] or t == T - 1:
                nxt = nv[t]
            else:
                nxt = res[t + 1]
            res[t] = vv[t] + min(1.0, math.exp(lr[t])) * (r[t] + gamma * nxt - vv[t])
        out.append(res)
    return from_rows(out, reward)


def affine_reference(a, b):
    out = []
    for aa, bb in zip(rows(a), rows(b)):
        x, res = 0.0, [0.0] * len(bb)
        for t in range(len(bb) - 1, -1, -1):
            x = aa[t] * x + bb[t]
            res[t] = x
        out.append(res)
    return from_rows(out, b)


def call_retrace(w, trace, estimator=retrace):
    return estimator(
        GAMMA, w["reward"], w["state_action_value"], w["next_state_value"], trace,
        w["terminated"], w["done"],
    )


def window_weights(w, rho_bar=1.0, c_bar=1.0, relevance=None):
    """V-trace's truncated weights of the window, under LASER's relevance mask where one is given."""
    weights = truncated_importance_weights(w["log_rho"], rho_bar, c_bar)
    return weights if relevance is None else laser_relevant_weights(weights, relevance)


def call_vtrace(w, rho_bar=1.0, c_bar=1.0, relevance=None, estimator=vtrace_from_weights):
    """V-trace on the window as LASER's loss composes it (plain V-trace without ``relevance``)."""
    return estimator(
        GAMMA, w["reward"], w["state_value"], w["next_state_value"], window_weights(w, rho_bar, c_bar, relevance),
        w["terminated"], w["done"],
    )


# ----------------------------------------------------------------------------- scans


@pytest.mark.parametrize(
    "T",
    [1, 2, 3, F.SCAN_MIN_T, F.SCAN_MIN_T + 1, 2 * F.SCAN_MIN_T + 1, 2 * F.SCAN_MIN_T + 2, 100, 257],
)
def test_scan_matches_the_recursion(T):
    # T <= SCAN_MIN_T: loop alone; longer: odd-even reduction (odd and even lengths) + loop
    g = torch.Generator().manual_seed(T)
    a = torch.rand(4, 3, T, 1, generator=g, dtype=torch.float64) * 1.2
    a[..., :: max(T // 3, 1), :] = 0.0  # cuts
    b = torch.randn(4, 3, T, 1, generator=g, dtype=torch.float64)
    torch.testing.assert_close(F._affine_scan(a, b), affine_reference(a, b), rtol=1e-12, atol=1e-12)


def test_scan_flushes_underflowing_products_and_stays_exact_in_float32():
    T = 300
    a = torch.full((8, T, 1), 1e-3)  # products underflow after a few steps
    a[:, ::7] = 0.999
    b = torch.randn(8, T, 1, generator=torch.Generator().manual_seed(1))
    out = F._affine_scan(a, b)
    assert out.dtype == torch.float32
    expected = affine_reference(a.double(), b.double())
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- retrace


@pytest.mark.parametrize("T", [SHORT_T, LONG_T])
@pytest.mark.parametrize("traces", ["truncated rho", "Q^opc ones", "random"])
def test_retrace_equals_its_reference(T, traces):
    w = make_window(T=T, seed=T)
    trace = {
        "truncated rho": w["log_rho"].exp().clamp_max(1.0),
        "Q^opc ones": torch.ones_like(w["reward"]),
        "random": 1.2 * torch.rand_like(w["reward"]),
    }[traces]
    expected = call_retrace(w, trace, estimator=retrace_reference)
    torch.testing.assert_close(call_retrace(w, trace), expected, rtol=1e-10, atol=1e-10)


def test_retrace_without_batch_dims_and_float32():
    w = make_window(batch=(), T=LONG_T, seed=4, dtype=torch.float32)
    trace = torch.rand_like(w["reward"])
    out = call_retrace(w, trace)
    assert out.shape == (LONG_T, 1) and out.dtype == torch.float32
    expected = call_retrace(w, trace, estimator=retrace_reference)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("estimator", [retrace_reference, retrace])
def test_retrace_hand_numbers(estimator):
    # ACER eq. 5 by hand; rows: t=0 continues, t=1 truncated (bootstraps on V(s_2) = 4, cuts the trace),
    # t=2 a new episode that terminates
    r, q, v = [1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [5.0, 4.0, 7.0]  # v[t] = V(s_{t+1})
    c, g = [0.5, 0.25, 0.5], 0.5
    q_ret_1 = r[1] + g * v[1]  # truncated: V(s_2), no correction from the next episode
    q_ret_0 = r[0] + g * (v[0] + c[1] * (q_ret_1 - q[1]))
    q_ret_2 = r[2]  # terminated: no bootstrap
    as_column = lambda x: torch.tensor(x, dtype=torch.float64).reshape(3, 1)  # noqa: E731
    out = estimator(
        g, as_column(r), as_column(q), as_column(v), as_column(c),
        as_column([False, False, True]).bool(), as_column([False, True, True]).bool(),
    )
    assert out.flatten().tolist() == pytest.approx([q_ret_0, q_ret_1, q_ret_2], rel=1e-15)


@pytest.mark.parametrize("T", [SHORT_T, LONG_T])
def test_termination_and_truncation_differ(T):
    w = make_window(batch=(3,), T=T, seed=5, p_done=0.0)
    trace = torch.ones_like(w["reward"])
    term, trunc = dict(w), dict(w)
    ends = torch.zeros_like(w["done"])
    ends[..., -1, :] = True
    term["terminated"], term["done"] = ends, ends
    trunc["terminated"], trunc["done"] = torch.zeros_like(ends), ends
    q_term, q_trunc = call_retrace(term, trace), call_retrace(trunc, trace)
    r, nv = w["reward"][..., -1, :], w["next_state_value"][..., -1, :]
    torch.testing.assert_close(q_term[..., -1, :], r)  # no bootstrap
    torch.testing.assert_close(q_trunc[..., -1, :], r + GAMMA * nv)  # bootstraps on V(s_T)
    assert not torch.allclose(q_term, q_trunc)
    v_term, a_term = call_vtrace(term)
    v_trunc, a_trunc = call_vtrace(trunc)
    rho = w["log_rho"][..., -1, :].exp().clamp_max(1.0)
    v = w["state_value"][..., -1, :]
    torch.testing.assert_close(v_term[..., -1, :], v + rho * (r - v))
    torch.testing.assert_close(v_trunc[..., -1, :], v + rho * (r + GAMMA * nv - v))
    torch.testing.assert_close(a_trunc[..., -1, :], rho * (r + GAMMA * nv - v))
    assert not torch.allclose(v_term, v_trunc) and not torch.allclose(a_term, a_trunc)


@pytest.mark.parametrize("kind", ["terminated", "truncated"])
def test_nothing_leaks_back_across_a_mid_window_boundary(kind):
    T, j = LONG_T, LONG_T // 2
    w = make_window(batch=(4,), T=T, seed=6, p_done=0.0)
    w["done"][..., j, :] = True
    w["terminated"][..., j, :] = kind == "terminated"
    trace = torch.rand_like(w["reward"]) + 0.5
    q1, (v1, a1) = call_retrace(w, trace), call_vtrace(w)
    w2 = {k: x.clone() for k, x in w.items()}
    for key in ("reward", "state_value", "state_action_value", "log_rho"):
        w2[key][..., j + 1 :, :] += 3.0  # the next episode changes entirely
    w2["next_state_value"][..., j + 1 :, :] += 3.0
    trace2 = trace.clone()
    trace2[..., j + 1 :, :] *= 0.3
    q2, (v2, a2) = call_retrace(w2, trace2), call_vtrace(w2)
    for x, y in ((q1, q2), (v1, v2), (a1, a2)):
        torch.testing.assert_close(x[..., : j + 1, :], y[..., : j + 1, :])
        assert not torch.allclose(x[..., j + 1 :, :], y[..., j + 1 :, :])


# ---------------------------------------------------------------------------- vtrace


@pytest.mark.parametrize("T", [SHORT_T, LONG_T])
@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (2.0, 1.0), (1.5, 0.8)])
@pytest.mark.parametrize("masked", [False, True])
def test_vtrace_reference_matches_impala_and_laser_sums(T, rho_bar, c_bar, masked):
    w = make_window(T=T, seed=T + int(10 * rho_bar))
    relevance = w["relevance"] if masked else torch.ones_like(w["done"])
    expected_v, expected_a = vtrace_sum(
        GAMMA, w["reward"], w["state_value"], w["next_state_value"], w["log_rho"],
        w["terminated"], w["done"], rho_bar, c_bar, relevance,
    )
    value_target, advantage = call_vtrace(
        w, rho_bar=rho_bar, c_bar=c_bar, relevance=relevance if masked else None, estimator=vtrace_reference
    )
    torch.testing.assert_close(value_target, expected_v, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(advantage, expected_a, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("T", [SHORT_T, LONG_T])
@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (2.0, 1.0), (1.5, 0.8)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("batch", [BATCH, ()])
def test_vtrace_equals_its_reference(T, rho_bar, c_bar, masked, batch):
    w = make_window(batch=batch, T=T, seed=T + int(10 * c_bar))
    relevance = w["relevance"] if masked else None
    expected = call_vtrace(w, rho_bar, c_bar, relevance, estimator=vtrace_reference)
    out = call_vtrace(w, rho_bar, c_bar, relevance)
    assert isinstance(out, VTraceReturns) and isinstance(expected, VTraceReturns)
    torch.testing.assert_close(out.value_target, expected.value_target, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.pg_advantage, expected.pg_advantage, rtol=1e-10, atol=1e-10)
    if not masked:  # vtrace is the same on log_rho
        plain = vtrace(
            GAMMA, w["reward"], w["state_value"], w["next_state_value"], w["log_rho"], w["terminated"], w["done"],
            rho_bar=rho_bar, c_bar=c_bar,
        )
        torch.testing.assert_close(plain, out, rtol=0, atol=0)


@pytest.mark.parametrize("T", [SHORT_T, LONG_T])
def test_vtrace_is_refer_vtbc_with_unit_clipping(T):
    w = make_window(T=T, seed=7)
    expected = vtbc_reference(
        GAMMA, w["reward"], w["state_value"], w["next_state_value"], w["log_rho"],
        w["terminated"], w["done"],
    )
    torch.testing.assert_close(call_vtrace(w)[0], expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("T", [SHORT_T, LONG_T])
@pytest.mark.parametrize("mid_window_done", [False, True])
def test_vtrace_matches_torchrl(T, mid_window_done):
    from torchrl.objectives.value.functional import vtrace_advantage_estimate

    # float32: TorchRL builds its discounts as float32 (``gamma * (~done).int()``)
    w = make_window(T=T, seed=8, p_done=0.15 if mid_window_done else 0.0, dtype=torch.float32)
    if not mid_window_done:  # TorchRL's documented case: boundaries only at the window end
        w["done"][..., -1, :] = True
        w["terminated"][..., -1, :] = torch.rand(w["done"][..., -1, :].shape) < 0.5
    for rho_bar, c_bar in [(1.0, 1.0), (2.0, 1.2)]:
        advantage, value_target = vtrace_advantage_estimate(
            GAMMA, w["log_rho"], torch.zeros_like(w["log_rho"]), w["state_value"],
            w["next_state_value"], w["reward"], w["done"], w["terminated"],
            rho_thresh=rho_bar, c_thresh=c_bar,
        )
        ours_v, ours_a = vtrace(
            GAMMA, w["reward"], w["state_value"], w["next_state_value"], w["log_rho"], w["terminated"], w["done"],
            rho_bar=rho_bar, c_bar=c_bar,
        )
        torch.testing.assert_close(ours_v, value_target, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours_a, advantage, rtol=1e-5, atol=1e-5)


def test_all_relevant_weights_are_the_plain_weights_and_a_rejection_zeroes_both():
    w = make_window(seed=9)
    plain = window_weights(w, rho_bar=1.5)
    assert isinstance(plain, ImportanceWeights)
    torch.testing.assert_close(window_weights(w, 1.5, relevance=torch.ones_like(w["done"])), plain, rtol=0, atol=0)
    masked = window_weights(w, 1.5, relevance=w["relevance"])
    for kept, full in zip(masked, plain):
        torch.testing.assert_close(kept, torch.where(w["relevance"], full, 0.0), rtol=0, atol=0)


@pytest.mark.parametrize("T", [SHORT_T, LONG_T])
def test_rejected_step_outputs_and_bootstrap_cut(T):
    j = T // 2
    w = make_window(batch=(5,), T=T, seed=10, p_done=0.0)
    relevance = torch.ones_like(w["done"])
    relevance[..., j, :] = False
    v, a = call_vtrace(w, relevance=relevance)
    sv, nv, r = w["state_value"], w["next_state_value"], w["reward"]
    torch.testing.assert_close(v[..., j, :], sv[..., j, :])  # rejected: target = V(s_j)
    assert (a[..., j, :] == 0).all()  # and no policy gradient
    # the step before bootstraps on V(s_j) after one step: v_{j-1} = V + rho (r + gamma V(s_j) - V)
    rho = w["log_rho"][..., j - 1, :].exp().clamp_max(1.0)
    one_step = rho * (r[..., j - 1, :] + GAMMA * nv[..., j - 1, :] - sv[..., j - 1, :])
    torch.testing.assert_close(v[..., j - 1, :], sv[..., j - 1, :] + one_step)
    torch.testing.assert_close(a[..., j - 1, :], one_step)
    # nothing at or beyond j (other than V(s_j) itself) reaches the steps before j ...
    w2 = {k: x.clone() for k, x in w.items()}
    for key in ("reward", "log_rho"):
        w2[key][..., j:, :] += 2.0
    w2["state_value"][..., j + 1 :, :] += 2.0
    w2["next_state_value"][..., j:, :] += 2.0
    w2["next_state_value"][..., j - 1, :] = w["next_state_value"][..., j - 1, :]
    v2, a2 = call_vtrace(w2, relevance=relevance)
    torch.testing.assert_close(v2[..., :j, :], v[..., :j, :])
    torch.testing.assert_close(a2[..., :j, :], a[..., :j, :])
    # ... whereas without the mask they do
    v3, _ = call_vtrace(w)
    v4, _ = call_vtrace(w2)
    assert not torch.allclose(v3[..., : j - 1, :], v4[..., : j - 1, :])


# ------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("T", [SHORT_T, LONG_T])
def test_estimators_are_differentiable_and_not_detached(T):
    w = make_window(batch=(2,), T=T, seed=11)
    r = w["reward"].clone().requires_grad_()
    nv = w["next_state_value"].clone().requires_grad_()
    sv = w["state_value"].clone().requires_grad_()
    log_rho = w["log_rho"].clone().requires_grad_()
    trace = torch.rand_like(r).requires_grad_()
    q = w["state_action_value"].clone().requires_grad_()
    flags = (w["terminated"], w["done"])

    def ret(r, q, nv, trace):
        return retrace(GAMMA, r, q, nv, trace, *flags)

    def vt(r, sv, nv, log_rho):
        weights = laser_relevant_weights(truncated_importance_weights(log_rho, 1.5), w["relevance"])
        return vtrace_from_weights(GAMMA, r, sv, nv, weights, *flags)

    assert ret(r, q, nv, trace).requires_grad  # callers must detach targets themselves
    assert torch.autograd.gradcheck(ret, (r, q, nv, trace), fast_mode=True)
    assert torch.autograd.gradcheck(vt, (r, sv, nv, log_rho), fast_mode=True)


def test_shape_mismatch_is_a_clear_error():
    w = make_window(seed=12)
    with pytest.raises(ValueError, match="same shape"):
        retrace(
            GAMMA, w["reward"], w["state_action_value"][..., :-1, :], w["next_state_value"],
            torch.ones_like(w["reward"]), w["terminated"], w["done"],
        )


# ------------------------------------------------------------------ implied policy KL


def implied_kl_reference(log_pi, log_mu, rho_bar):
    out = []
    n_actions = log_pi.shape[-1]
    pairs = zip(log_pi.reshape(-1, n_actions).tolist(), log_mu.reshape(-1, n_actions).tolist())
    for lp, lm in pairs:
        pi, mu = [math.exp(x) for x in lp], [math.exp(x) for x in lm]
        m = [min(rho_bar * b, p) for p, b in zip(pi, mu)]  # LASER eq. 3
        z = sum(m)
        out.append(sum(p * math.log(p / (mm / z)) for p, mm in zip(pi, m) if p > 0))
    return torch.tensor(out, dtype=log_pi.dtype).reshape(*log_pi.shape[:-1], 1)


def test_implied_kl_zero_on_policy():
    log_pi = torch.randn(3, 4, 6, dtype=torch.float64).log_softmax(-1)
    for rho_bar in (1.0, 3.0):
        kl = implied_policy_kl(log_pi, log_pi, rho_bar=rho_bar)
        assert kl.shape == (3, 4, 1)
        torch.testing.assert_close(kl, torch.zeros_like(kl), rtol=0, atol=1e-12)


@pytest.mark.parametrize("rho_bar", [0.5, 1.0, 2.0])
def test_implied_kl_matches_hand_sum_and_is_positive_where_clipped(rho_bar):
    g = torch.Generator().manual_seed(13)
    log_pi = (2 * torch.randn(5, 7, 4, generator=g, dtype=torch.float64)).log_softmax(-1)
    log_mu = (2 * torch.randn(5, 7, 4, generator=g, dtype=torch.float64)).log_softmax(-1)
    kl = implied_policy_kl(log_pi, log_mu, rho_bar=rho_bar)
    expected = implied_kl_reference(log_pi, log_mu, rho_bar)
    torch.testing.assert_close(kl, expected, rtol=1e-10, atol=1e-12)
    # pi~ = pi (KL 0) exactly where no action has pi(a) > rho_bar mu(a); positive elsewhere
    clipped = (log_pi > log_mu + math.log(rho_bar)).any(-1, keepdim=True)
    assert clipped.any() and (rho_bar <= 1 or (~clipped).any())
    assert (kl[clipped] > 1e-9).all()
    torch.testing.assert_close(kl[~clipped], torch.zeros_like(kl[~clipped]), rtol=0, atol=1e-12)


def test_implied_kl_hand_numbers():
    # pi = (0.9, 0.1), mu = (0.5, 0.5), rho_bar = 1: min = (0.5, 0.1), pi~ = (5/6, 1/6)
    log_pi = torch.tensor([[0.9, 0.1]], dtype=torch.float64).log()
    log_mu = torch.tensor([[0.5, 0.5]], dtype=torch.float64).log()
    expected = 0.9 * math.log(0.9 / (5 / 6)) + 0.1 * math.log(0.1 / (1 / 6))
    assert implied_policy_kl(log_pi, log_mu).item() == pytest.approx(expected, rel=1e-12)
    # LASER Sec. 2.3 example: mu = (phi, 1-phi), pi = (1-phi, phi) -> pi~ uniform
    phi = 0.05
    log_pi = torch.tensor([[1 - phi, phi]], dtype=torch.float64).log()
    log_mu = torch.tensor([[phi, 1 - phi]], dtype=torch.float64).log()
    expected = (1 - phi) * math.log((1 - phi) / 0.5) + phi * math.log(phi / 0.5)
    assert implied_policy_kl(log_pi, log_mu).item() == pytest.approx(expected, rel=1e-12)


def test_implied_kl_with_impossible_actions_is_finite():
    # pi = (1, 0)
    log_pi = torch.tensor([[0.0, -math.inf]], dtype=torch.float64, requires_grad=True)
    log_mu = torch.tensor([[0.5, 0.5]], dtype=torch.float64).log()
    # min(mu, pi) = (0.5, 0) -> pi~ = (1, 0) = pi
    kl = implied_policy_kl(log_pi, log_mu)
    assert kl.item() == pytest.approx(0.0, abs=1e-12)
    kl.sum().backward()
    assert torch.isfinite(log_pi.grad).all()


# ----------------------------------------------------------------------- trust region


def trust_region_reference(g, k, delta):
    out = []
    for gg, kk in zip(g.reshape(-1, g.shape[-1]).tolist(), k.reshape(-1, k.shape[-1]).tolist()):
        kg = sum(a * b for a, b in zip(kk, gg))
        k2 = sum(a * a for a in kk)
        scale = max(0.0, (kg - delta) / k2) if k2 > 0 else 0.0  # ACER eq. 12
        out.append([a - scale * b for a, b in zip(gg, kk)])
    return torch.tensor(out, dtype=g.dtype).reshape(g.shape)


def test_trust_region_matches_eq12_and_projects_onto_the_constraint():
    gen = torch.Generator().manual_seed(14)
    g = torch.randn(4, 5, 6, generator=gen, dtype=torch.float64)
    k = torch.randn(4, 5, 6, generator=gen, dtype=torch.float64)
    delta = 0.3
    z = acer_trust_region(g, k, delta)
    torch.testing.assert_close(z, trust_region_reference(g, k, delta), rtol=1e-12, atol=1e-12)
    kg = (k * g).sum(-1)
    inside, outside = kg <= delta, kg > delta
    assert inside.any() and outside.any()
    torch.testing.assert_close(z[inside], g[inside], rtol=0, atol=0)  # constraint holds: untouched
    kz = (k * z).sum(-1)
    torch.testing.assert_close(kz[outside], torch.full_like(kz[outside], delta))  # k.z == delta
    diff = g - z  # removed part is parallel to k (and points along +k)
    cos = (diff * k).sum(-1) / (diff.norm(dim=-1) * k.norm(dim=-1))
    torch.testing.assert_close(cos[outside], torch.ones_like(cos[outside]))


def test_trust_region_with_zero_k_returns_g():
    g = torch.randn(3, 4, dtype=torch.float64)
    k = torch.zeros(3, 4, dtype=torch.float64)
    for delta in (0.0, 1.0):
        z = acer_trust_region(g, k, delta)
        assert torch.isfinite(z).all()
        torch.testing.assert_close(z, g, rtol=0, atol=0)


# ------------------------------------------------------------------ ReF-ER schedules


def test_refer_schedules_hand_numbers():
    C, A = 4.0, 5e-7  # ReF-ER Sec. 4 settings
    assert refer_c_max(0, C, A) == pytest.approx(5.0)
    assert refer_c_max(2_000_000, C, A) == pytest.approx(3.0)  # 1 + 4 / (1 + 1)
    assert refer_c_max(18_000_000, C, A) == pytest.approx(1.4)  # 1 + 4 / 10
    assert refer_lr(0, 1e-4, A) == pytest.approx(1e-4)
    assert refer_lr(2_000_000, 1e-4, A) == pytest.approx(5e-5)
    step = torch.tensor([0.0, 2e6])
    torch.testing.assert_close(refer_c_max(step, C, A), torch.tensor([5.0, 3.0]))


def test_refer_beta_update_eq12():
    # too many far-policy samples: beta shrinks (more weight on the KL penalty)
    assert refer_beta_update(0.5, far_fraction=0.2, D=0.1, lr=0.1) == pytest.approx(0.45)
    # few far-policy samples: beta grows towards 1
    assert refer_beta_update(0.5, far_fraction=0.05, D=0.1, lr=0.1) == pytest.approx(0.55)
    assert refer_beta_update(0.5, far_fraction=0.1, D=0.1, lr=0.1) == pytest.approx(0.55)  # not > D
    out = refer_beta_update(torch.tensor(0.5), torch.tensor(0.2), D=0.1, lr=0.1)
    assert isinstance(out, torch.Tensor) and out.item() == pytest.approx(0.45)
    beta_far, beta_near = 1.0, 0.0  # fixed points 0 and 1
    for _ in range(2000):
        beta_far = refer_beta_update(beta_far, 0.5, 0.1, 0.01)
        beta_near = refer_beta_update(beta_near, 0.0, 0.1, 0.01)
    assert beta_far == pytest.approx(0.0, abs=1e-6) and beta_near == pytest.approx(1.0, abs=1e-6)


# --------------------------------------------------------------------------- affine suffix tree (V-RACER's eq. 8)


def suffix_reference(a, b):
    """x_0, ..., x_n of x_i = a_i x_{i+1} + b_i (a, b: [n]), x_n = 0."""
    return torch.cat([affine_reference(a.unsqueeze(-1), b.unsqueeze(-1)).flatten(), b.new_zeros(1)])


@pytest.mark.parametrize("n", [1, 2, 5, 8, 9, 300])
def test_affine_suffix_tree_matches_the_backward_loop_after_point_and_range_updates(n):
    g = torch.Generator().manual_seed(n)
    a = (0.99 * torch.rand(n, generator=g, dtype=torch.float64)).where(torch.rand(n, generator=g) > 0.1, 0.0)  # cuts
    b = torch.randn(n, generator=g, dtype=torch.float64)
    tree = AffineSuffixTree(a, b)
    everywhere = torch.arange(n + 1)
    torch.testing.assert_close(tree.suffix(everywhere), suffix_reference(a, b), rtol=1e-12, atol=1e-12)
    for _ in range(3):
        where = torch.randint(0, n, (4,), generator=g)
        where = torch.cat([where, where[:1]])  # a position given twice, with the same map
        a[where] = 0.99 * torch.rand(5, generator=g, dtype=torch.float64)[torch.arange(5) % 4]
        b[where] = torch.randn(5, generator=g, dtype=torch.float64)[torch.arange(5) % 4]
        tree.set(where, a[where], b[where])
        torch.testing.assert_close(tree.suffix(everywhere), suffix_reference(a, b), rtol=1e-12, atol=1e-12)
    # maps added after the n given (the room a larger tree leaves), and a run of them replaced
    tree = AffineSuffixTree(a[: n // 2], b[: n // 2], size=4 * tree.size)
    tree.set_range(n // 2, a[n // 2 :], b[n // 2 :])
    a[n // 3 :] = 0.99 * torch.rand(n - n // 3, generator=g, dtype=torch.float64)
    b[n // 3 :] = torch.randn(n - n // 3, generator=g, dtype=torch.float64)
    tree.set_range(n // 3, a[n // 3 :], b[n // 3 :])
    torch.testing.assert_close(tree.suffix(everywhere), suffix_reference(a, b), rtol=1e-12, atol=1e-12)
