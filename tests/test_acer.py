"""ACER loss (Wang et al. 2017) against plain loops written from the paper's equations.

The test networks read the policy statistics phi (and Q, V) straight from the observation, so the gradient
of the loss w.r.t. the observation *is* its gradient w.r.t. phi: it must equal ``-z*_t / N`` with ``z*``
built by hand from eq. 9 (discrete, exact sums over actions) or eq. 16 (continuous, same samples through a
fixed seed) and eq. 12. Every window holds terminated and truncated steps, mid-window and before padding.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.objectives import SoftUpdate

from acer_torchrl.algorithms.acer import SDNAdvantage
from acer_torchrl.config import ConfigError, load_config
from acer_torchrl.objectives.acer import ACERLoss
from acer_torchrl.objectives.updaters import FusedSoftUpdate, average_updater, target_updater
from windows import layout, padded_window, per_window_mean_abs

GAMMA = 0.9
B, T = 4, 6


# ---------------------------------------------------------------------------------------------- data
def make_batch(obs_dim: int, action, behaviour: dict, seed: int = 0) -> TensorDict:
    """A window of ``windows.padded_window`` with the given actions and behaviour statistics."""
    g = torch.Generator().manual_seed(seed)
    td = padded_window(B, T, obs_dim, g, lambda obs: {"action": action, **behaviour})
    td["observation"].requires_grad_()  # the test networks read phi (and Q, V) from it
    return td


def bootstrap_flags(td, b, t):
    """(bootstraps on V(next obs) at row t, is terminal at row t) of the paper's backward recursion."""
    mask, done = td["mask"][b], td["next", "done"][b, :, 0]
    last_real = t == T - 1 or not bool(mask[t + 1])
    return bool(done[t]) or last_real, bool(td["next", "terminated"][b, t, 0])


# ---------------------------------------------------------------------------------------------- discrete
A = 3


class LogitsFromObs(nn.Module):
    """phi = logits = obs[:A] + bias (the bias is the parameter the average network copies)."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(A, dtype=torch.float64))

    def forward(self, obs):
        return obs[..., :A] + self.bias


class QFromObs(nn.Module):
    def forward(self, obs):
        return obs[..., A:]


def discrete_loss(**kwargs) -> ACERLoss:
    actor = TensorDictModule(LogitsFromObs(), ["observation"], ["logits"])
    critic = TensorDictModule(QFromObs(), ["observation"], ["action_value"])
    return ACERLoss(actor, critic, discrete=True, gamma=GAMMA, entropy_coeff=0.0, **kwargs)


def discrete_batch(seed=0, behaviour_noise=None) -> TensorDict:
    g = torch.Generator().manual_seed(seed + 100)
    action = torch.randint(A, (B, T), generator=g)
    behaviour = torch.randn(B, T, A, generator=g, dtype=torch.float64) * 1.5
    td = make_batch(2 * A, action, {("behaviour", "logits"): behaviour}, seed)
    if behaviour_noise is not None:  # mu close to pi: every rho(a) stays small
        with torch.no_grad():
            noise = behaviour_noise * torch.randn(B, T, A, generator=g, dtype=torch.float64)
            td["behaviour", "logits"] = td["observation"][..., :A].detach() + noise
    return td


def discrete_reference(td, c, average_bias=None, delta=None, target_q_bias=None):
    """Plain loop over ACER Alg. 2 / eq. 5, 9, 12: Q^ret [B, T] and the projected z* [B, T, A]. With
    ``target_q_bias``, Q^ret reads ``Q + target_q_bias`` (the average critic), the policy terms Q itself."""
    obs, next_obs = td["observation"].detach(), td["next", "observation"].detach()
    mask = td["mask"]
    q_ret = torch.zeros(B, T, dtype=torch.float64)
    g = torch.zeros(B, T, A, dtype=torch.float64)
    k = torch.zeros(B, T, A, dtype=torch.float64)

    def pi_q(x):
        return torch.softmax(x[:A], -1), x[A:]

    def pi_target_q(x):  # the learning policy with the Q that Q^ret reads
        pi, q = pi_q(x)
        return pi, q if target_q_bias is None else q + target_q_bias

    for b in range(B):
        for t in reversed(range(T)):
            if not mask[b, t]:
                continue
            r = float(td["next", "reward"][b, t])
            bootstrap, terminal = bootstrap_flags(td, b, t)
            if terminal:
                q_ret[b, t] = r
            elif bootstrap:
                pi_n, q_n = pi_target_q(next_obs[b, t])
                q_ret[b, t] = r + GAMMA * (pi_n * q_n).sum()
            else:  # eq. 5 with rho-bar_{t+1} = min(1, rho_{t+1}) (Alg. 2)
                pi_n, q_n = pi_target_q(obs[b, t + 1])
                mu_n = torch.softmax(td["behaviour", "logits"][b, t + 1], -1)
                a_n = int(td["action"][b, t + 1])
                c_n = min(1.0, float(pi_n[a_n] / mu_n[a_n]))
                q_ret[b, t] = r + GAMMA * c_n * (q_ret[b, t + 1] - q_n[a_n]) + GAMMA * (pi_n * q_n).sum()
            pi, q = pi_q(obs[b, t])
            mu = torch.softmax(td["behaviour", "logits"][b, t], -1)
            rho = pi / mu
            v = (pi * q).sum()
            a = int(td["action"][b, t])
            grad_log = torch.eye(A, dtype=torch.float64) - pi  # row a': d log softmax(phi)[a'] / d phi
            g[b, t] = min(c, float(rho[a])) * grad_log[a] * (q_ret[b, t] - v)  # eq. 9, first term
            for a2 in range(A):  # eq. 9, bias correction: exact sum over actions
                weight = max(0.0, 1.0 - c / float(rho[a2]))
                g[b, t] += weight * pi[a2] * grad_log[a2] * (q[a2] - v)
            if average_bias is not None:
                pi_avg = torch.softmax(obs[b, t, :A] + average_bias, -1)
                k[b, t] = pi - pi_avg  # d/d logits of KL(pi_avg || softmax(logits))
    if delta is None:
        return q_ret, g, k, g.clone()
    z = g.clone()
    for b in range(B):
        for t in range(T):
            if not mask[b, t]:
                continue
            kg, kk = float(k[b, t] @ g[b, t]), float(k[b, t] @ k[b, t])
            z[b, t] = g[b, t] - max(0.0, (kg - delta) / kk) * k[b, t]  # eq. 12
    return q_ret, g, k, z


def half_active_delta(k, g, mask):
    """A delta half-way between the two middle values of k.g: half the steps violate the linearised
    constraint (eq. 11), and no step sits on its boundary (where rounding would decide)."""
    kg = (k * g).sum(-1)[mask].sort().values
    middle = kg.numel() // 2
    return float(kg[middle - 1] + kg[middle]) / 2


def grads(loss_module, td):
    """d loss_objective / d phi and d loss_critic / d obs, and the output."""
    out = loss_module(td)
    (g_policy,) = torch.autograd.grad(out["loss_objective"], td["observation"], retain_graph=True)
    (g_critic,) = torch.autograd.grad(out["loss_critic"], td["observation"])
    return g_policy, g_critic, out


def q_ret_from_critic_grad(td, g_critic):
    """Critic loss 1/2 (Q^ret - Q)^2 averaged over N real steps: Q^ret = Q - N dL/dQ(x_t, a_t)."""
    n = td["mask"].sum()
    idx = td["action"].unsqueeze(-1)
    q = td["observation"].detach()[..., A:].gather(-1, idx)
    return (q - n * g_critic[..., A:].gather(-1, idx)).squeeze(-1)


@pytest.mark.parametrize("c", [1.2, 10.0])
def test_discrete_gradient_wrt_phi_is_eq9(c):
    td = discrete_batch()
    loss = discrete_loss(c=c, trust_region=False)
    g_policy, g_critic, out = grads(loss, td)
    q_ret, g, _, _ = discrete_reference(td, c)
    mask = td["mask"]
    n = mask.sum()
    torch.testing.assert_close(g_policy[..., :A], -g / n * mask.unsqueeze(-1))
    torch.testing.assert_close(q_ret_from_critic_grad(td, g_critic)[mask], q_ret[mask])
    assert torch.all(g_policy[..., A:] == 0)  # the policy term does not touch Q
    assert torch.all(g_critic[..., :A] == 0)  # the critic term does not touch phi (V is a target)
    if c < 2:  # the batch exercises the truncation
        assert 0 < float(out["rho_clipped_share"]) < 1


def test_discrete_trust_region_projection_is_eq12():
    td = discrete_batch(seed=1)
    average_bias = torch.tensor([0.8, -0.5, 0.1], dtype=torch.float64)
    c = 3.0
    _, g, k, _ = discrete_reference(td, c, average_bias)
    mask = td["mask"]
    delta = half_active_delta(k, g, mask)
    q_ret, g, k, z = discrete_reference(td, c, average_bias, delta)
    loss = discrete_loss(c=c, trust_region=True, delta=delta)
    SoftUpdate(loss, eps=0.99)
    with torch.no_grad():
        loss.target_actor_network_params["module", "bias"].copy_(average_bias)
    g_policy, _, out = grads(loss, td)
    torch.testing.assert_close(g_policy[..., :A], -z / mask.sum() * mask.unsqueeze(-1))
    active = ((k * g).sum(-1) > delta) & mask
    inactive = ~active & mask
    assert active.any() and inactive.any()
    torch.testing.assert_close(z[inactive], g[inactive])  # feasible gradients are left untouched
    on_boundary = (k * z).sum(-1)[active]
    torch.testing.assert_close(on_boundary, torch.full_like(on_boundary, delta))  # projected onto k.z = delta
    assert float(out["trust_region_active"]) == pytest.approx(float(active.sum() / mask.sum()))
    logits = td["observation"].detach()[..., :A]
    log_avg = torch.log_softmax(logits + average_bias, -1)
    kl = (log_avg.exp() * (log_avg - torch.log_softmax(logits, -1))).sum(-1)  # KL(pi_avg || pi)
    assert float(out["kl_average"]) == pytest.approx(float(kl[mask].mean()))


def test_bias_correction_vanishes_when_every_rho_is_below_c():
    td = discrete_batch(seed=2, behaviour_noise=0.3)
    pi = torch.softmax(td["observation"][..., :A].detach(), -1)
    rho = pi / torch.softmax(td["behaviour", "logits"], -1)
    assert rho.max() < 4.0
    g_c, _, out = grads(discrete_loss(c=4.0, trust_region=False), td)
    g_inf, _, _ = grads(discrete_loss(c=1e9, trust_region=False), td)  # no truncation, no correction
    torch.testing.assert_close(g_c, g_inf)
    assert float(out["rho_clipped_share"]) == 0.0
    g_low, _, _ = grads(discrete_loss(c=1.05, trust_region=False), td)  # some rho > c: the terms differ
    assert not torch.allclose(g_low, g_inf)


def test_terminated_and_truncated_windows_give_different_targets():
    td = discrete_batch(seed=3)
    truncated = td.clone()
    truncated["next", "terminated"][0, 2] = False
    truncated["next", "truncated"][0, 2] = True
    truncated["observation"] = td["observation"].detach().clone().requires_grad_()
    loss = discrete_loss(trust_region=False)
    q_term = q_ret_from_critic_grad(td, grads(loss, td)[1])
    q_trunc = q_ret_from_critic_grad(truncated, grads(loss, truncated)[1])
    torch.testing.assert_close(q_term[td["mask"]], discrete_reference(td, 10.0)[0][td["mask"]])
    torch.testing.assert_close(q_trunc[td["mask"]], discrete_reference(truncated, 10.0)[0][td["mask"]])
    nxt = td["next", "observation"][0, 2].detach()
    v_next = float((torch.softmax(nxt[:A], -1) * nxt[A:]).sum())
    assert float(q_trunc[0, 2] - q_term[0, 2]) == pytest.approx(GAMMA * v_next)  # truncation bootstraps
    torch.testing.assert_close(q_term[1:], q_trunc[1:])  # other rows unaffected
    assert float(td["next", "reward"][0, 2]) == pytest.approx(float(q_term[0, 2]))  # terminal: Q^ret = r


def test_priority_is_each_windows_mean_abs_error_of_the_alg2_q_ret():
    """A prioritized replay's priority (Reactor sec. 3.3) on ACER: each window's mean ``|Q^ret - Q(x_t, a_t)|``
    over its real steps, Q^ret from the plain loop of Alg. 2 (rows that terminate, are truncated and padded)."""
    td = discrete_batch(seed=4)
    q_ret, *_ = discrete_reference(td, 10.0)
    q_taken = td["observation"].detach()[..., A:].gather(-1, td["action"].unsqueeze(-1))[..., 0]
    out = discrete_loss(trust_region=False)(td)
    torch.testing.assert_close(out["priority"], per_window_mean_abs(q_ret - q_taken, td["mask"]))
    assert out["priority"].shape == (B,) and not out["priority"].requires_grad


class QFromObsWithBias(nn.Module):
    """Q = obs[A:] + bias: a critic with a parameter, so that its average copy can differ from it."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(A, dtype=torch.float64))

    def forward(self, obs):
        return obs[..., A:] + self.bias


def target_loss(**kwargs) -> ACERLoss:
    actor = TensorDictModule(LogitsFromObs(), ["observation"], ["logits"])
    critic = TensorDictModule(QFromObsWithBias(), ["observation"], ["action_value"])
    return ACERLoss(actor, critic, discrete=True, gamma=GAMMA, entropy_coeff=0.0, target_update=5, **kwargs)


@pytest.mark.filterwarnings("ignore:No target network updater")  # the loss alone: its test steps no updater
def test_target_network_builds_q_ret_from_its_q_and_the_learning_policy():
    """With ``target_update`` every Q in the Retrace recursion (eq. 5), bootstraps included, is the target
    copy's, weighted by the learning policy (not the copy's); the policy gradient's Q^ret - V and bias
    correction (eq. 9) and the regressed Q stay the learning critic's."""
    td = discrete_batch(seed=4)
    loss = target_loss(c=1.5, trust_region=False)
    target_q_bias = torch.tensor([0.7, -1.1, 0.4], dtype=torch.float64)
    with torch.no_grad():
        loss.target_value_network_params["module", "1", "module", "bias"].copy_(target_q_bias)
        loss.target_value_network_params["module", "0", "module", "bias"].copy_(torch.tensor([2.0, -2.0, 0.5]))
    g_policy, g_critic, _ = grads(loss, td)
    q_ret, g, _, _ = discrete_reference(td, 1.5, target_q_bias=target_q_bias)
    mask = td["mask"]
    torch.testing.assert_close(q_ret_from_critic_grad(td, g_critic)[mask], q_ret[mask])
    torch.testing.assert_close(g_policy[..., :A], -g / mask.sum() * mask.unsqueeze(-1))
    plain_q_ret = discrete_reference(td, 1.5)[0]
    assert not torch.allclose(plain_q_ret[mask], q_ret[mask])  # the target copy changed the targets


def test_target_network_is_copied_every_period_and_the_average_policy_apart():
    """``target_updater`` copies the learning parameters into the target copy on every ``period``-th step only,
    ``average_updater`` moves the average policy after every step and leaves the target copy alone; neither copy
    is trained and the shared parameters are trained once; continuous ACER refuses the option (its Q^ret reads
    the SDN's sampled Q~)."""
    loss = target_loss(trust_region=True)
    average, target = average_updater(loss, 0.9, ("actor_network",)), target_updater(loss, 3, ("value_network",))
    copied = []
    for step in range(6):
        with torch.no_grad():
            loss.critic_network.module.bias.fill_(float(step + 1))
            loss.actor_network_params["module", "bias"].fill_(float(step + 1))
        average_before = loss.target_actor_network_params["module", "bias"].clone()
        average.step()
        target.step()
        copied.append(float(loss.target_value_network_params["module", "1", "module", "bias"][0]))
        torch.testing.assert_close(  # the copy's actor part follows the same schedule
            loss.target_value_network_params["module", "0", "module", "bias"][0], torch.tensor(copied[-1]).double()
        )
        torch.testing.assert_close(
            loss.target_actor_network_params["module", "bias"], 0.9 * average_before + 0.1 * (step + 1)
        )
    assert copied == [0.0, 0.0, 3.0, 3.0, 3.0, 6.0]
    names = [name for name, _ in loss.named_parameters()]
    assert len(names) == 2 and all("target" not in name for name in names)
    with pytest.raises(ValueError, match="discrete"):
        ACERLoss(loss.actor_network, loss.critic_network, nn.Linear(1, 1), discrete=False, target_update=5)


# ---------------------------------------------------------------------------------------------- continuous
D = 2  # action dims; obs = [loc (D), scale (D), V (1), features (2)]
OBS = 2 * D + 3
N_SDN = 3


class GaussianFromObs(nn.Module):
    def __init__(self, learned_scale: bool):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(D, dtype=torch.float64))
        self.learned_scale = learned_scale
        self.register_buffer("fixed", torch.full((D,), 0.7, dtype=torch.float64))

    def forward(self, obs):
        loc = obs[..., :D] + self.bias
        scale = obs[..., D : 2 * D] if self.learned_scale else self.fixed.expand_as(loc)
        return loc, scale


class VFromObs(nn.Module):
    def forward(self, obs):
        return obs[..., 2 * D : 2 * D + 1]


def continuous_setup(learned_scale, seed=0, **kwargs):
    torch.manual_seed(seed)
    actor = TensorDictModule(GaussianFromObs(learned_scale), ["observation"], ["loc", "scale"])
    critic = TensorDictModule(VFromObs(), ["observation"], ["state_value"])
    advantage = SDNAdvantage(OBS, D, [8], "tanh").double()
    loss = ACERLoss(actor, critic, advantage, discrete=False, gamma=GAMMA, sdn_samples=N_SDN, **kwargs)
    loss.set_keys(core="observation")
    g = torch.Generator().manual_seed(seed + 7)
    behaviour_loc = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    behaviour_scale = 0.4 + torch.rand(B, T, D, generator=g, dtype=torch.float64)
    action = behaviour_loc + behaviour_scale * torch.randn(B, T, D, generator=g, dtype=torch.float64)
    behaviour = {("behaviour", "loc"): behaviour_loc, ("behaviour", "scale"): behaviour_scale}
    td = make_batch(OBS, action, behaviour, seed)
    with torch.no_grad():  # positive scale entries (phi = (loc, scale) when the scale is learned)
        for key in ("observation", ("next", "observation")):
            td[key][..., D : 2 * D] = td[key][..., D : 2 * D].abs() + 0.3
    return loss, advantage, td


def log_normal(x, m, s):
    return float((-0.5 * ((x - m) / s) ** 2 - torch.log(s) - 0.5 * math.log(2 * math.pi)).sum())


def continuous_reference(td, advantage, samples, c, learned_scale, average_bias=None, delta=None):
    """Plain loop over ACER Alg. 3 / eq. 13, 14, 16, 21 and eq. 12: the critic loss and z* w.r.t. phi."""
    obs, next_obs = td["observation"].detach(), td["next", "observation"].detach()
    mask = td["mask"]

    def stats(x):
        scale = x[D : 2 * D] if learned_scale else torch.full((D,), 0.7, dtype=torch.float64)
        return x[:D], scale

    with torch.no_grad():
        q_tilde = torch.zeros(B, T, dtype=torch.float64)
        q_tilde_sampled = torch.zeros(B, T, dtype=torch.float64)
        for b in range(B):
            for t in range(T):  # SDN, eq. 13
                adv = [float(advantage(obs[b, t], u)) for u in samples[:, b, t]]
                v = float(obs[b, t, 2 * D])
                baseline = sum(adv[1:]) / N_SDN
                q_tilde[b, t] = v + float(advantage(obs[b, t], td["action"][b, t])) - baseline
                q_tilde_sampled[b, t] = v + adv[0] - baseline

    def rho_of(b, t, a):
        m, s = stats(obs[b, t])
        mu_loc, mu_scale = td["behaviour", "loc"][b, t], td["behaviour", "scale"][b, t]
        return math.exp(log_normal(a, m, s) - log_normal(a, mu_loc, mu_scale))

    q_ret = torch.zeros(B, T, dtype=torch.float64)
    q_opc = torch.zeros(B, T, dtype=torch.float64)
    critic, n = 0.0, int(mask.sum())
    dim = 2 * D if learned_scale else D
    g = torch.zeros(B, T, dim, dtype=torch.float64)
    k = torch.zeros(B, T, dim, dtype=torch.float64)
    for b in range(B):
        for t in reversed(range(T)):
            if not mask[b, t]:
                continue
            r = float(td["next", "reward"][b, t])
            bootstrap, terminal = bootstrap_flags(td, b, t)
            if terminal:
                q_ret[b, t] = q_opc[b, t] = r
            elif bootstrap:
                q_ret[b, t] = q_opc[b, t] = r + GAMMA * float(next_obs[b, t, 2 * D])
            else:  # Alg. 3: Q^ret <- c_i (Q^ret - Q~_i) + V_i, c_i = min(1, rho_i^(1/d)); Q^opc with c = 1
                rho_n = rho_of(b, t + 1, td["action"][b, t + 1])
                v_n = float(obs[b, t + 1, 2 * D])
                c_n = min(1.0, rho_n ** (1.0 / D))
                q_ret[b, t] = r + GAMMA * (c_n * (q_ret[b, t + 1] - q_tilde[b, t + 1]) + v_n)
                q_opc[b, t] = r + GAMMA * (q_opc[b, t + 1] - q_tilde[b, t + 1] + v_n)
            v = float(obs[b, t, 2 * D])
            a, a2 = td["action"][b, t].detach(), samples[0, b, t]
            rho, rho2 = rho_of(b, t, a), rho_of(b, t, a2)
            err = float(q_ret[b, t] - q_tilde[b, t])
            critic += 0.5 * err**2 + 0.5 * (min(1.0, rho) * err) ** 2  # eq. 6 on Q~ and eq. 14 on V
            m, s = stats(obs[b, t])

            def grad_log_f(x):
                d_loc = (x - m) / s**2
                d_scale = -1 / s + (x - m) ** 2 / s**3
                return torch.cat([d_loc, d_scale]) if learned_scale else d_loc

            g[b, t] = min(c, rho) * (q_opc[b, t] - v) * grad_log_f(a)  # eq. 16
            g[b, t] += max(0.0, 1 - c / rho2) * (q_tilde_sampled[b, t] - v) * grad_log_f(a2)
            if average_bias is not None:  # grad_phi KL(N(m_a, s) || N(m, s_phi))
                m_a = m + average_bias
                d_loc = (m - m_a) / s**2
                d_scale = 1 / s - (s**2 + (m_a - m) ** 2) / s**3
                k[b, t] = torch.cat([d_loc, d_scale]) if learned_scale else d_loc
    z = g.clone()
    if delta is not None:
        for b in range(B):
            for t in range(T):
                if not mask[b, t]:
                    continue
                kk = float(k[b, t] @ k[b, t])
                z[b, t] = g[b, t] - max(0.0, (float(k[b, t] @ g[b, t]) - delta) / kk) * k[b, t]
    return critic / n, g, k, z


@pytest.mark.parametrize("learned_scale", [False, True])
@pytest.mark.parametrize("trust_region", [False, True])
def test_continuous_gradient_wrt_phi_is_eq16(learned_scale, trust_region):
    c = 1.5
    loss, advantage, td = continuous_setup(learned_scale, c=c, trust_region=trust_region)
    mask = td["mask"]
    with torch.no_grad():
        m = td["observation"][..., :D]
        s = td["observation"][..., D : 2 * D] if learned_scale else torch.full_like(m, 0.7)
        torch.manual_seed(123)
        samples = torch.distributions.Normal(m, s).sample((N_SDN + 1,))  # a'_t, then u_1..u_n
    average_bias, delta = None, None
    if trust_region:
        average_bias = torch.tensor([0.4, -0.3], dtype=torch.float64)
        _, g, k, _ = continuous_reference(td, advantage, samples, c, learned_scale, average_bias)
        delta = half_active_delta(k, g, mask)
        loss.delta = delta
        SoftUpdate(loss, eps=0.995)
        with torch.no_grad():
            loss.target_actor_network_params["module", "bias"].copy_(average_bias)
    critic, g, k, z = continuous_reference(td, advantage, samples, c, learned_scale, average_bias, delta)
    torch.manual_seed(123)
    g_policy, _, out = grads(loss, td)
    phi_grad = g_policy[..., : 2 * D] if learned_scale else g_policy[..., :D]
    torch.testing.assert_close(phi_grad, -z / mask.sum() * mask.unsqueeze(-1))
    assert float(out["loss_critic"].detach()) == pytest.approx(critic, rel=1e-9)
    assert 0 < float(out["rho_clipped_share"]) < 1
    if trust_region:
        active = ((k * g).sum(-1) > delta) & mask
        assert active.any() and (~active & mask).any()
        assert float(out["trust_region_active"]) == pytest.approx(float(active.sum() / mask.sum()))


# ---------------------------------------------------------------------------------------------- plumbing
class NotPlainModule(TensorDictModule):
    """A TensorDictModule subclass: the loss calls it with TensorDicts (network_call.NetworkCall), not on tensors."""


@pytest.mark.filterwarnings("ignore:No target network updater")  # the loss alone: its test steps no updater
@pytest.mark.parametrize("trust_region", [False, True])
def test_networks_called_on_tensors_or_tensordicts_give_the_same_loss(trust_region):
    """The feed-forward networks and their bootstrap rows go through the network as tensors (network_call.
    TensorCall, common.evaluate_with_next_steps); an actor that needs a TensorDict takes them as one: the same
    outputs and gradients to the last bit."""
    td = discrete_batch(seed=3)
    assert td["next", "done"].any() and not td["next", "terminated"].all()
    plain = discrete_loss(trust_region=trust_region)
    other = ACERLoss(
        NotPlainModule(LogitsFromObs(), ["observation"], ["logits"]),
        TensorDictModule(QFromObs(), ["observation"], ["action_value"]),
        discrete=True, gamma=GAMMA, entropy_coeff=0.0, trust_region=trust_region,
    )
    assert plain._actor_critic.tensors is not None and other._actor_critic.tensors is None
    for ours, theirs in zip(grads(plain, td), grads(other, td.clone())):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_update_plan_follows_algorithm_1():
    rng = np.random.default_rng(0)
    loss = discrete_loss(replay_ratio=4.0, trust_region=False)
    plans = [loss.update_plan(rng) for _ in range(2000)]
    assert all(p[0] == 1.0 and set(p[1:]) <= {0.0} for p in plans)
    assert np.mean([len(p) - 1 for p in plans]) == pytest.approx(4.0, abs=0.15)
    loss.on_policy, loss.replay_ratio = False, 2.0
    assert all(1.0 not in loss.update_plan(rng) for _ in range(100))
    loss.on_policy, loss.replay_ratio = True, 0.0  # A3C-like
    assert loss.update_plan(rng) == [1.0]


def test_average_network_follows_soft_update():
    """theta_a <- alpha theta_a + (1 - alpha) theta (sec. 3.3) for every parameter, step after step, with the
    fused updater the recipes use."""
    loss = discrete_loss(trust_region=True)
    updater = FusedSoftUpdate(loss, eps=0.9)
    source, average = loss.actor_network_params, loss.target_actor_network_params
    with torch.no_grad():
        loss.actor_network_params["module", "bias"].fill_(1.0)
    updater.step()
    torch.testing.assert_close(average["module", "bias"], torch.full((A,), 0.1, dtype=torch.float64))
    for _ in range(2):
        with torch.no_grad():
            for p in source.values(True, True):
                p.copy_(torch.randn_like(p))
        expected = {k: 0.9 * v + 0.1 * source.get(k) for k, v in average.clone().items(True, True)}
        updater.step()
        for key, value in expected.items():
            torch.testing.assert_close(average.get(key), value)
    assert all("target" not in name for name, _ in loss.named_parameters())


@pytest.mark.parametrize(
    "override", ["acer.c=0", "acer.alpha=1.0", "acer.replay_ratio=-1", "acer.sdn_samples=0"]
)
def test_config_errors_name_the_key(override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_config("acer", [override])


def test_the_critic_weight_falls_linearly_over_its_env_steps_then_stays():
    """``acer.critic_coeff_end`` (not in ACER): the critic term is ``w(t) 1/2 (Q^ret - Q)^2`` with ``w`` equal to
    ``critic_coeff`` until ``critic_decay[0]`` env steps, linear to ``critic_coeff_end`` at ``critic_decay[1]``, then
    constant; the policy and entropy terms do not move."""
    td = discrete_batch()
    base = discrete_loss()(td)
    decaying = discrete_loss(critic_coeff=2.0, critic_coeff_end=0.5, critic_decay=(100, 400))
    for env_steps, weight in ((0, 2.0), (100, 2.0), (200, 1.5), (400, 0.5), (10**6, 0.5)):
        decaying.at_env_steps(env_steps)
        out = decaying(td)
        torch.testing.assert_close(out["loss_critic"], weight * base["loss_critic"])
        torch.testing.assert_close(out["loss_objective"], base["loss_objective"])
        assert float(out["critic_weight"]) == pytest.approx(weight)
    constant = discrete_loss(critic_coeff=2.0)
    constant.at_env_steps(10**6)
    torch.testing.assert_close(constant(td)["loss_critic"], 2.0 * base["loss_critic"])
    assert "critic_weight" not in constant.out_keys and "critic_weight" in decaying.out_keys


def test_the_critic_decay_is_checked_and_noted_unused_without_its_end_weight():
    from acer_torchrl.config import unused_settings

    for bad in ("acer.critic_decay=100000,50000", "acer.critic_decay=5", "acer.critic_decay=-1,10"):
        with pytest.raises(ConfigError, match="acer.critic_decay"):
            load_config("acer", ["acer.critic_coeff_end=0.25", bad])
    overrides = ["acer.critic_coeff_end=none", "acer.critic_decay=0,10"]  # the cartpole preset sets an end weight
    assert unused_settings(load_config("acer", overrides), overrides) == [
        "note: acer.critic_decay=0,10 has no effect with acer.critic_coeff_end=none"
    ]
    assert load_config("acer", ["acer.critic_coeff_end=0.25", "acer.critic_decay=0,10"]).algo.critic_decay == [0, 10]


@pytest.mark.parametrize("algo, keys", [
    ("acer", ["acer.sdn_samples=9", "acer.sdn_hidden=32", "acer.init_std=0.5", "acer.learn_std=true"]),
    ("laser", ["laser.kl_samples=9", "laser.init_std=0.2", "laser.learn_std=false"]),
])
def test_the_gaussian_policys_keys_are_noted_unused_with_discrete_actions(algo, keys):
    """A Gaussian policy's keys given for an env with discrete actions changed nothing, without a word; on a continuous
    env they are read, and not noted."""
    from acer_torchrl.config import unused_settings

    assert unused_settings(load_config(algo, keys), keys) == [
        f"note: {key} has no effect with env.name=CartPole-v1 (discrete actions)" for key in keys]
    continuous = [*keys, "env.name=Pendulum-v1", *(["acer.target_update=0"] if algo == "acer" else [])]
    assert unused_settings(load_config(algo, continuous), continuous) == []


@pytest.mark.integration
def test_a_run_records_its_falling_critic_weight(tmp_path):
    """The trainer hands the loss the run's env steps before each update: metrics.csv's ``critic_weight`` falls
    from ``critic_coeff`` to ``critic_coeff_end`` over ``critic_decay`` (a row every 64-step batch after the first
    512 steps)."""
    import csv

    from acer_torchrl.cli import run

    run("acer", ["total_frames=640", "collector.workers=0", "collector.frames_per_batch=64", "replay.min_size=64",
                 "replay.batch_size=4", "replay.seq_len=8", "eval.episodes=1", "eval.max_steps=20",
                 "eval.interval=100000", "log.progress=false", "acer.critic_coeff_end=0.25",
                 "acer.critic_decay=512,640", f"run_dir={tmp_path}"])
    with open(tmp_path / "metrics.csv") as f:
        rows = {int(r["env_steps"]): float(r["critic_weight"]) for r in csv.DictReader(f)}
    # a row holds the means of the updates after its batch's collection: 1.0 to step 512, then 1 - 0.75 x 64/128
    assert rows == {512: 1.0, 576: pytest.approx(0.625), 640: 0.25}


def test_the_cartpole_presets_target_network_on_a_continuous_env_is_one_clear_error():
    from acer_torchrl.envs import env_info
    from acer_torchrl.settings import get_algorithm

    cfg = load_config("acer", ["env.name=InvertedPendulum-v5"])
    with pytest.raises(ConfigError, match=r"set acer.target_update=0 \(preset=cartpole sets it; the continuous "
                                          r"presets pendulum and mujoco do not\)$"):
        get_algorithm("acer").build(cfg, env_info(cfg.env))
    # given by the user on a continuous preset: no word of a preset (it blamed preset=pendulum and proposed it)
    cfg = load_config("acer", ["preset=pendulum", "acer.target_update=7"])
    with pytest.raises(ConfigError, match=r"^acer.target_update=7 is for discrete actions; InvertedPendulum-v5 has "
                                          r"continuous ones: set acer.target_update=0$"):
        get_algorithm("acer").build(cfg, env_info(cfg.env))


def test_off_policy_without_replay_is_refused():
    with pytest.raises(ConfigError, match="never updates"):
        load_config("acer", ["acer.on_policy=false", "acer.replay_ratio=0"])


def test_presets_load():
    for preset in ("cartpole", "atari", "mujoco", "pendulum"):
        cfg = load_config("acer", [f"preset={preset}"])
        assert cfg.preset == preset
    assert load_config("acer", []).env.name == "CartPole-v1"


def test_exported_from_objectives():
    from acer_torchrl import objectives

    assert objectives.ACERLoss is ACERLoss


@pytest.mark.parametrize("lstm,target_update", [(False, 0), (True, 0), (False, 1), (True, 1)])
def test_built_agent_trains_every_network_on_acted_sequences(lstm, target_update):
    """build() on CartPole (with and without an LSTM core, with and without a target network copied every update):
    sequences acted by the agent's own policy (behaviour statistics written at acting time), one Adam step moves
    every trained parameter, the average network and the target copy, and the acting policy shares the trained
    weights."""
    from torchrl.modules import set_recurrent_mode

    from acer_torchrl.envs import env_info
    from acer_torchrl.settings import get_algorithm

    overrides = [f"network.lstm={lstm}", "network.lstm_hidden=8", "network.hidden=[16]",
                 f"acer.target_update={target_update}"]
    cfg = load_config("acer", ["preset=cartpole", *overrides])
    agent = get_algorithm("acer").build(cfg, env_info(cfg.env))
    torch.manual_seed(0)
    obs = torch.randn(B, T, 4)
    td = TensorDict({"observation": obs, "is_init": torch.zeros(B, T, 1, dtype=torch.bool)}, [B, T])
    td["is_init"][:, 0] = True
    for key in agent.hidden_keys:
        td[key] = torch.zeros(B, T, 1, 8)
    with torch.no_grad(), set_recurrent_mode(True):
        td = agent.policy(td)
    terminated, truncated, mask = layout(B, T)
    next_obs = torch.cat([obs[:, 1:], torch.randn(B, 1, 4)], 1)
    nxt = td.get("next", TensorDict({}, [B, T]))  # the LSTM wrote its next states there
    td["next"] = nxt.update({"observation": next_obs, "reward": torch.ones(B, T, 1), "terminated": terminated,
                             "truncated": truncated, "done": terminated | truncated})
    td["mask"] = mask.squeeze(-1)
    loss = agent.loss
    params = [p for p in loss.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    averages = [getattr(loss, name) for name in ("target_actor_network_params", "target_value_network_params")
                if hasattr(loss, name)]
    assert len(averages) == 1 + target_update
    averages_before = [average.clone() for average in averages]
    optimizer = torch.optim.Adam(params, lr=1e-2)
    out = loss(td)
    assert set(loss.out_keys) == set(out.keys())
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    optimizer.step()
    for updater in agent.updaters:
        updater.step()
    assert all(not torch.equal(p, q) for p, q in zip(params, before))
    for average, before in zip(averages, averages_before):
        moved = (average.detach() - before.detach()).abs()
        assert all(float(v.sum()) > 0 for v in moved.values(True, True))
    policy_params = {id(p) for p in agent.policy.parameters()}
    assert policy_params <= {id(p) for p in params}
    assert float(out["rho"]) == pytest.approx(1.0)  # acted by this very policy: rho = 1


def test_lstm_bootstraps_from_the_unroll_state_not_the_stored_one():
    """network.lstm=true: where a row bootstraps (window end, truncation mid-window, last real step before
    padding), ``V(x_{t+1})`` starts from the state the learning network's unroll reached after row t, from
    the sequence's refreshed start state, not from the ``("next", state)`` stored at acting time (here: other
    values). Reference: Alg. 2's backward recursion over a step-by-step loop of the LSTM cell."""
    from torchrl.modules import set_recurrent_mode

    from acer_torchrl.envs import EnvInfo
    from acer_torchrl.settings import get_algorithm

    cfg = load_config("acer", ["preset=cartpole", "network.lstm=true", "network.lstm_hidden=8",
                               "network.hidden=[16]", f"gamma={GAMMA}"])
    n_act, obs_dim, hidden = 2, 4, 8
    info = EnvInfo(obs_shape=(obs_dim,), obs_dtype=torch.float32, discrete=True, num_actions=n_act)
    agent = get_algorithm("acer").build(cfg, info)
    loss = agent.loss
    g = torch.Generator().manual_seed(7)
    td = padded_window(B, T, obs_dim, g, lambda obs: {
        "action": torch.randint(n_act, (B, T), generator=g),
        "behaviour": {"logits": torch.randn(B, T, n_act, generator=g, dtype=torch.float64)},
    }).apply(lambda x: x.float() if x.is_floating_point() else x)
    td["is_init"][:, 0] = False  # replayed sequences start mid-episode, from a refreshed state
    start = {key: torch.randn(B, 1, hidden, generator=g) for key in agent.hidden_keys}
    for key in agent.hidden_keys:
        td[key] = torch.zeros(B, T, 1, hidden)
        td[key][:, 0] = start[key]
        td["next", key] = torch.randn(B, T, 1, hidden, generator=g)  # stale: the acting network's states
    with set_recurrent_mode(True):
        out = loss(td).detach()

    encoder, lstm = agent.torsos[0].module[0].module, agent.torsos[0].lstm.lstm
    policy_head, q_head = loss.actor_network[-1].module, loss.critic_network.module
    h_key, c_key = agent.hidden_keys
    mask, action = td["mask"], td["action"]

    def step(obs, state):
        y, state = lstm(encoder(obs).view(1, 1, -1), state)
        y = y.view(-1)
        return torch.softmax(policy_head(y), -1), q_head(y), state

    def reference(bootstrap_state):
        """Q^ret [B, T] and Q(x_t, a_t) [B, T]; ``bootstrap_state(b, t, unroll_state)``: where V(x_{t+1})
        of a bootstrapping row starts from."""
        q_ret, q_taken = torch.zeros(B, T), torch.zeros(B, T)
        for b in range(B):
            state = (start[h_key][b].unsqueeze(1), start[c_key][b].unsqueeze(1))  # [layers, batch 1, H]
            pi, q, after = [], [], []
            for t in range(T):
                if not mask[b, t]:
                    break
                if td["is_init"][b, t]:
                    state = tuple(torch.zeros_like(s) for s in state)
                pi_t, q_t, state = step(td["observation"][b, t], state)
                pi.append(pi_t), q.append(q_t), after.append(state)
            for t in reversed(range(len(pi))):
                r = float(td["next", "reward"][b, t])
                bootstrap, terminal = bootstrap_flags(td, b, t)
                if terminal:
                    q_ret[b, t] = r
                elif bootstrap:
                    pi_n, q_n, _ = step(td["next", "observation"][b, t], bootstrap_state(b, t, after[t]))
                    q_ret[b, t] = r + GAMMA * (pi_n * q_n).sum()
                else:  # eq. 5 with rho-bar_{t+1} = min(1, rho_{t+1}) (Alg. 2)
                    a_n = int(action[b, t + 1])
                    mu_n = torch.softmax(td["behaviour", "logits"][b, t + 1], -1)
                    c_n = min(1.0, float(pi[t + 1][a_n] / mu_n[a_n]))
                    v_n = (pi[t + 1] * q[t + 1]).sum()
                    q_ret[b, t] = r + GAMMA * c_n * (q_ret[b, t + 1] - q[t + 1][a_n]) + GAMMA * v_n
                q_taken[b, t] = q[t][int(action[b, t])]
        return q_ret, q_taken

    with torch.no_grad():
        q_ret, q_taken = reference(lambda b, t, unrolled: unrolled)
        stale, _ = reference(lambda b, t, unrolled: (td["next", h_key][b, t].unsqueeze(1),
                                                     td["next", c_key][b, t].unsqueeze(1)))
    n = mask.sum()
    torch.testing.assert_close(out["q_ret"], q_ret[mask].sum() / n, rtol=1e-5, atol=1e-6)
    expected_critic = loss.critic_weight.value * (0.5 * (q_ret - q_taken)[mask] ** 2).sum() / n  # eq. 6
    torch.testing.assert_close(out["loss_critic"], expected_critic, rtol=1e-5, atol=1e-6)
    assert (q_ret - stale)[mask].abs().max() > 1e-2, "the stored states must give other bootstraps"


@pytest.mark.slow
@pytest.mark.learning
def test_cartpole_learns(tmp_path):
    """Discrete ACER, preset=cartpole (gamma 0.999), 25.6k env steps (~100 s on 2 cores beside two benchmarks): the
    final score (mean greedy return of 10 episodes at 90, 95 and 100 % of the run) is far above random (~22). The
    preset's tuning seeds 0-9 (results/learning.md: acer-cartpole-decay-target50-tuning-seeds0-9) scored 216-500 at
    20k-25k (the 30 seeds before its target network, acer-cartpole-seq32-*: 170-497)."""
    from acer_torchrl.cli import run

    summary = run("acer", ["preset=cartpole", "total_frames=25600", "eval.interval=1000000",
                           f"run_dir={tmp_path}", "log.progress=false"])
    assert summary["env_steps"] >= 25_600 and summary["final_score_evaluations"] == 3
    assert summary["eval_return_mean"] >= 100, summary


STANDARDIZED = ["preset=pendulum", "acer.standardize=true", "collector.workers=0", "replay.min_size=200",
                "network.hidden=[16]", "acer.sdn_hidden=[8]", "eval.interval=1000000", "log.progress=false"]


def _standardize_buffers(params) -> dict:
    return {k: v.clone() for k, v in params.items(True, True) if k[-1] in ("loc", "scale") and "0" in k}


def test_standardize_fits_once_on_the_first_stored_states_and_reaches_the_average_network_and_a_resume(tmp_path):
    """acer.standardize=true: the identity until replay.min_size steps are stored; then the mean and population std
    of every stored state (V-RACER App. B, eq. 14-15), the same in the learning network, the average policy network
    (not moved by its soft update) and the acting policy; kept, not refitted, by a resumed run."""
    from acer_torchrl.estimates.standardization import FittedStandardization
    from acer_torchrl.trainer import Trainer

    trainer = Trainer(load_config("acer", [*STANDARDIZED, "total_frames=400", f"run_dir={tmp_path}"]))
    try:
        hook = trainer.agent.estimates
        assert isinstance(hook, FittedStandardization)
        norm = hook.normalizer
        trainer.fill_replay(150)
        assert not bool(hook.fitted) and torch.equal(norm.loc, torch.zeros(4)) and torch.equal(norm.scale, torch.ones(4))
        trainer.fill_replay(200)
        assert bool(hook.fitted)
        stored = trainer.replay.gather(torch.arange(len(trainer.replay)), ["observation"]).get("observation")
        torch.testing.assert_close(norm.loc, stored.mean(0), rtol=0, atol=0)
        torch.testing.assert_close(norm.scale, stored.std(0, correction=0), rtol=0, atol=0)
        fitted = norm.loc.clone(), norm.scale.clone()
        for _ in range(3):
            trainer.update(trainer.draw_batch(0.0))
        trainer.fill_replay(300)  # more steps stored: not refitted
        torch.testing.assert_close((norm.loc, norm.scale), fitted, rtol=0, atol=0)
        loss = trainer.loss
        learning = _standardize_buffers(loss.actor_network_params)
        average = _standardize_buffers(loss.target_actor_network_params)
        assert len(learning) == 2 and set(learning) == set(average)
        for key, value in learning.items():
            torch.testing.assert_close(average[key], value, rtol=0, atol=0)
        acting = [m for m in trainer.agent.policy.modules() if m.__class__.__name__ == "Standardize"]
        assert len(acting) == 1 and acting[0] is norm
        trainer.checkpoint()
    finally:
        trainer.close()
    resumed = Trainer(load_config(None, [f"resume={tmp_path}", "total_frames=600"]))
    try:
        assert bool(resumed.agent.estimates.fitted)
        torch.testing.assert_close((resumed.agent.estimates.normalizer.loc, resumed.agent.estimates.normalizer.scale),
                                   fitted, rtol=0, atol=0)
        average = _standardize_buffers(resumed.loss.target_actor_network_params)
        torch.testing.assert_close(average, learning, rtol=0, atol=0)
    finally:
        resumed.close()


@pytest.mark.parametrize("overrides, message", [
    (["preset=cartpole", "acer.standardize=true"], "an on-policy update would train the network on raw states"),
    (["preset=minatar", "acer.standardize=true", "acer.on_policy=false"], "needs vector observations"),
])
def test_standardize_where_it_cannot_be_fitted_first_is_one_clear_error(overrides, message):
    from acer_torchrl.envs import env_info
    from acer_torchrl.settings import get_algorithm

    cfg = load_config("acer", overrides)
    with pytest.raises(ConfigError, match=message):
        get_algorithm("acer").build(cfg, env_info(cfg.env))


def test_bound_mean_keeps_the_acting_mean_inside_the_action_bounds_and_refuses_discrete_actions(tmp_path):
    """acer.bound_mean=true: the policy's mean (stored as the behaviour's loc) stays in InvertedPendulum's [-3, 3] with
    the mean layer's weights blown up; a run with it updates through the tanh; with discrete actions it is one clear
    error."""
    from acer_torchrl.cli import run
    from acer_torchrl.envs import env_info
    from acer_torchrl.settings import get_algorithm

    cfg = load_config("acer", ["preset=pendulum", "acer.bound_mean=true"])
    agent = get_algorithm("acer").build(cfg, env_info(cfg.env))
    (head,) = [m for m in agent.policy.modules() if m.__class__.__name__ == "GaussianHead"]
    with torch.no_grad():
        head.loc.weight.mul_(1e4)
        head.loc.bias.fill_(50.0)
    td = agent.policy(TensorDict({"observation": 10 * torch.randn(32, 4)}, batch_size=[32]))
    loc = td["behaviour", "loc"]
    assert bool((loc.abs() <= 3.0).all()) and bool((loc.abs() > 2.9).any())
    summary = run("acer", [*STANDARDIZED, "acer.standardize=false", "acer.bound_mean=true", "total_frames=400",
                           f"run_dir={tmp_path}"])
    assert summary["updates"] > 0 and summary["health"]["status"] == "ok", summary
    cfg = load_config("acer", ["preset=cartpole", "acer.bound_mean=true"])
    with pytest.raises(ConfigError, match="bounds a Gaussian policy's mean; CartPole-v1 has discrete actions"):
        get_algorithm("acer").build(cfg, env_info(cfg.env))
