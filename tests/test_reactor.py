"""Reactor (Gruslys et al. 2018): Retrace critic with a target network, beta-LOO / TISLR actor, mu-hat,
target-update period, gradient blocking, Table 1 networks, and a short CartPole learning check."""

import copy
import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.modules import set_recurrent_mode

from acer_torchrl.config import ConfigError, load_config
from acer_torchrl.envs import EnvInfo
from acer_torchrl.algorithms.reactor import ReactorCNN, build, make_networks, target_updater
from acer_torchrl.objectives.reactor import ReactorLoss, beta_loo_surrogate, mean_action_gap, tislr_surrogate

A = 3  # actions
OBS = 4
GAMMA, LAM = 0.9, 0.8


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These tensors are tiny: a second intra-op thread only adds contention on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def info(obs_shape=(OBS,), discrete=True):
    return EnvInfo(obs_shape=obs_shape, obs_dtype=torch.float32, discrete=discrete, num_actions=A)


def make_loss(lstm_hidden=None, learned=False, **kwargs):
    torch.manual_seed(0)
    nets = make_networks(info(), [8], lstm_hidden, 6, 0.05, learned)
    hidden_keys = [k for t in nets.torsos for k in t.hidden_keys] if lstm_hidden else []
    loss = ReactorLoss(
        nets.network, nets.q_network, gamma=GAMMA, lam=LAM, learned_behaviour=learned,
        hidden_keys=hidden_keys, **kwargs,
    )
    updater = target_updater(loss, 2)
    target = copy.deepcopy(nets.network)  # Q_T = the network as it is now
    with torch.no_grad():  # move the current network away from its target copy
        for p in loss.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return loss, nets, target, updater


def make_window(hidden_keys=(), lstm_hidden=None, seed=1):
    """Replayed sequences: row 0 runs through the window, row 1 terminates at t=3, row 2 is truncated at
    t=2; padding past an episode's end repeats its last step (as EpisodeReplay does), mask False.
    Within an episode, observation[t+1] is next_observation[t]."""
    B, T = 3, 6
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(B, T + 1, OBS, generator=g)
    last = [T - 1, 3, 2]
    terminated = torch.zeros(B, T, 1, dtype=torch.bool)
    truncated = torch.zeros(B, T, 1, dtype=torch.bool)
    terminated[1, 3] = True
    truncated[2, 2] = True
    mask = torch.zeros(B, T, dtype=torch.bool)
    behaviour_logits = torch.randn(B, T, A, generator=g)
    action = torch.multinomial(torch.softmax(behaviour_logits, -1).reshape(-1, A), 1, generator=g).reshape(B, T)
    td = TensorDict(
        {
            "observation": states[:, :T].clone(),
            "action": action,
            ("next", "observation"): states[:, 1:].clone(),
            ("next", "reward"): torch.randn(B, T, 1, generator=g),
            ("next", "terminated"): terminated,
            ("next", "truncated"): truncated,
            ("next", "done"): terminated | truncated,
            ("behaviour", "logits"): behaviour_logits,
            "is_init": torch.zeros(B, T, 1, dtype=torch.bool),
        },
        [B, T],
    )
    td["behaviour", "log_prob"] = torch.log_softmax(behaviour_logits, -1).gather(-1, action.unsqueeze(-1))[..., 0]
    for key in hidden_keys:
        td[key] = torch.randn(B, T, 1, lstm_hidden, generator=g)
    for b, L in enumerate(last):
        mask[b, : L + 1] = True
        td[b, L + 1 :] = td[b, L].expand(T - L - 1).clone()  # padding repeats the last real step
    td["mask"] = mask
    return td, last


@torch.no_grad()
def unroll_steps(net, obs_seq, state):
    """Step-by-step (non-recurrent mode) unroll of ``net`` over ``obs_seq`` [B, L, D] from ``state``."""
    B, L = obs_seq.shape[:2]
    outs = []
    not_init = torch.zeros(B, 1, dtype=torch.bool)
    with set_recurrent_mode(False):
        for t in range(L):  # reference loop over time
            step = TensorDict({"observation": obs_seq[:, t], "is_init": not_init, **state}, [B])
            step = net(step)
            outs.append(step)
            state = {k: step.get(("next", k)) for k in state}
    return torch.stack(outs, 1)


def reference(td, last, network, target, hidden_keys, learned):
    """Straight from the paper, one (b, t) at a time: network outputs on x_0..x_{L+1} (x_{L+1} = the last
    real step's next observation), Q^ret from eq. 7 with c_s = lambda min(1, pi/mu) (eq. 2)."""
    B, T = td.shape
    obs_seq = torch.cat([td["observation"][:, :1], td["next", "observation"]], 1)
    state = {k: td[k][:, 0] for k in hidden_keys}
    cur, tgt = unroll_steps(network, obs_seq, state), unroll_steps(target, obs_seq, state)
    q, log_pi, q_t = cur["action_value"], cur["logits"], tgt["action_value"]
    log_mu_all = cur["mu_logits"] if learned else torch.log_softmax(td["behaviour", "logits"], -1)
    a = td["action"]
    r, term = td["next", "reward"][..., 0], td["next", "terminated"][..., 0]
    ret = torch.zeros(B, T)
    mu = torch.zeros(B, T)
    for b in range(B):
        L = last[b]

        def c(s):
            ratio = math.exp(log_pi[b, s, a[b, s]] - log_mu_all[b, s, a[b, s]])
            return LAM * min(1.0, ratio)

        def v_next(s):  # (1 - terminated_s) E_pi Q_T(x_{s+1}, .)
            return 0.0 if term[b, s] else float((log_pi[b, s + 1].exp() * q_t[b, s + 1]).sum())

        def delta(s):
            return r[b, s] + GAMMA * v_next(s) - q_t[b, s, a[b, s]]

        for t in range(L + 1):
            total, trace = float(r[b, t] + GAMMA * v_next(t)), 1.0
            for s in range(t + 1, L + 1):
                trace *= c(s)
                total += GAMMA ** (s - t) * trace * float(delta(s))
            ret[b, t] = total
            mu[b, t] = log_mu_all[b, t, a[b, t]].exp()
    return q[:, :T], log_pi[:, :T].exp(), ret, mu, log_mu_all[:, :T].exp()


def capture_pi(nets):
    """Hook keeping the learning network's log pi output (with its gradient)."""
    store = {}

    def hook(module, inputs, output):
        if output.requires_grad:  # the loss's forward, not the reference's no-grad unroll
            output.retain_grad()
            store["log_pi"] = output

    nets.policy_head.register_forward_hook(hook)
    return store


@pytest.mark.parametrize("lstm_hidden", [None, 5])
@pytest.mark.parametrize("learned", [False, True])
@pytest.mark.parametrize("beta_c", [1.0, math.inf, 2.0])
def test_critic_and_beta_loo_gradient_match_the_paper(lstm_hidden, learned, beta_c):
    loss, nets, target, _ = make_loss(lstm_hidden, learned, beta_c=beta_c)
    td, last = make_window(loss.hidden_keys, lstm_hidden)
    store = capture_pi(nets)
    out = loss(td)
    q, pi, ret, mu, _ = reference(td, last, nets.network, target, loss.hidden_keys, learned)
    mask = td["mask"]
    n = mask.sum()
    a = td["action"]
    q_a = q.gather(-1, a.unsqueeze(-1))[..., 0]
    # critic: L2 regression of Q(x_t, a_t) on Q^ret (eq. 7)
    torch.testing.assert_close(out["loss_critic"], 0.5 * ((ret - q_a) ** 2)[mask].sum() / n)
    # actor: d(-loss_objective)/d pi(a) per step = beta (R(A) - Q(A)) 1[a = A] + Q(a)  (eq. 5), beta = min(c, 1/mu(A))
    out["loss_objective"].backward()
    log_pi = store["log_pi"]
    grad_pi = -log_pi.grad[:, : td.shape[1]] / log_pi.detach().exp()[:, : td.shape[1]] * n
    beta = (1.0 / mu).clamp_max(beta_c)
    expected = q.clone()
    expected.scatter_add_(-1, a.unsqueeze(-1), (beta * (ret - q_a)).unsqueeze(-1))
    expected[~mask] = 0.0
    torch.testing.assert_close(grad_pi, expected, rtol=1e-4, atol=1e-5)
    assert log_pi.grad[:, -1].abs().max() == 0  # pi(x_T) only enters the (detached) targets
    torch.testing.assert_close(pi, log_pi.detach().exp()[:, :-1])


@pytest.mark.parametrize("learned", [False, True])
def test_tislr_gradient_matches_the_paper(learned):
    c = 1.2
    loss, nets, target, _ = make_loss(None, learned, pg="tislr", tislr_c=c)
    td, last = make_window()
    store = capture_pi(nets)
    out = loss(td)
    q, pi, ret, _, mu_all = reference(td, last, nets.network, target, [], learned)
    out["loss_objective"].backward()
    mask, a = td["mask"], td["action"]
    n = mask.sum()
    grad_log_pi = -store["log_pi"].grad[:, : td.shape[1]] * n
    expected = torch.zeros_like(q)
    for b in range(q.shape[0]):  # reference loop: sec. 2.2's TISLR with V = sum_a pi(a) Q(a)
        for t in range(last[b] + 1):
            v = float((pi[b, t] * q[b, t]).sum())
            for x in range(A):
                rho = float(pi[b, t, x] / mu_all[b, t, x])
                expected[b, t, x] = max(rho - c, 0.0) * float(mu_all[b, t, x]) * (float(q[b, t, x]) - v)
                if x == a[b, t]:
                    expected[b, t, x] += min(c, rho) * (float(ret[b, t]) - v)
    torch.testing.assert_close(grad_log_pi, expected, rtol=1e-4, atol=1e-5)


def test_entropy_bonus_is_scaled_by_the_mean_action_gap():
    loss, nets, target, _ = make_loss(None, learned=True, entropy_coeff=0.1)
    td, last = make_window()
    out = loss(td)
    q, pi, _, _, _ = reference(td, last, nets.network, target, [], True)
    gaps, entropies = [], []
    for b in range(q.shape[0]):
        for t in range(last[b] + 1):
            best = int(q[b, t].argmax())
            others = [float(q[b, t, best] - q[b, t, x]) for x in range(A) if x != best]
            gaps.append(sum(others) / len(others))  # expectation over a uniformly chosen other action
            entropies.append(-float((pi[b, t] * pi[b, t].log()).sum()))
    gap = float(np.mean(gaps))
    torch.testing.assert_close(out["action_gap"], torch.tensor(gap), rtol=1e-5, atol=1e-6)
    expected = torch.tensor(-0.1 * gap * float(np.mean(entropies)))
    torch.testing.assert_close(out["loss_entropy"], expected, rtol=1e-5, atol=1e-6)
    # the behaviour loss is the cross-entropy of mu-hat on the replayed actions
    mu_hat = reference(td, last, nets.network, target, [], True)[3]
    torch.testing.assert_close(out["loss_behaviour"], -mu_hat[td["mask"]].log().mean(), rtol=1e-5, atol=1e-6)


def test_acting_policy_samples_from_and_stores_the_uniform_mixture():
    """Table 1: pi = (1 - eps) softmax + eps / #actions, and that mixture is what the actor samples and stores."""
    eps = 0.2
    cfg = load_config("reactor", [f"reactor.epsilon={eps}", "network.lstm=false"])
    agent = build(cfg, info())
    head = agent.loss.network[3].module  # the pi head
    core = torch.randn(5, head.net[0].in_features)
    softmax = torch.softmax(head.net(core), -1)
    torch.testing.assert_close(head(core).exp(), (1 - eps) * softmax + eps / A)
    with torch.no_grad():
        acted = agent.policy(TensorDict({"observation": torch.randn(5, OBS)}, [5]))
    features = agent.loss.q_network[0](TensorDict({"observation": acted["observation"]}, [5]))["q_core"]
    stored = torch.log_softmax(acted["behaviour", "logits"], -1)
    torch.testing.assert_close(stored, head(features).detach())
    assert (stored.exp() >= eps / A - 1e-6).all()
    torch.testing.assert_close(acted["behaviour", "log_prob"], stored.gather(-1, acted["action"].unsqueeze(-1))[:, 0])


def test_mean_action_gap_two_actions():
    q = torch.tensor([[[1.0, 3.0]], [[2.0, -1.0]]])
    assert float(mean_action_gap(q, torch.ones(2, 1, 1, dtype=torch.bool))) == pytest.approx(2.5)


def test_policy_gradients_do_not_reach_the_shared_encoder():
    loss, nets, _, _ = make_loss(5, learned=True)
    td, _ = make_window(loss.hidden_keys, 5)
    out = loss(td)
    encoder = nets.q_network[0].module  # the shared encoder (first module of the Q torso)
    q_lstm = nets.torsos[0].lstm
    for name in ("loss_objective", "loss_entropy", "loss_behaviour"):
        loss.zero_grad(set_to_none=True)
        out[name].backward(retain_graph=True)
        touched = [
            p for m in (encoder, q_lstm) for p in m.parameters() if p.grad is not None and p.grad.abs().sum() > 0
        ]
        assert not touched, f"{name} reached the encoder / Q LSTM"
        head = nets.policy_head if name != "loss_behaviour" else nets.network[-1].module
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())
    loss.zero_grad(set_to_none=True)
    out["loss_critic"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters())
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in nets.policy_head.parameters())


def test_beta_loo_surrogate_gradient_by_hand():
    torch.manual_seed(0)
    pi = torch.softmax(torch.randn(5, A), -1).requires_grad_()
    q, ret, mu = torch.randn(5, A), torch.randn(5, 1), torch.softmax(torch.randn(5, A), -1)
    action = torch.randint(A, (5, 1))
    for c in (1.0, math.inf, 3.0):
        beta = (1 / mu.gather(-1, action)).clamp_max(c)
        (grad,) = torch.autograd.grad(beta_loo_surrogate(pi, q, ret, action, beta).sum(), pi)
        for i in range(5):  # eq. 5 written out per sample
            A_i = int(action[i])
            by_hand = q[i].clone()
            by_hand[A_i] += float(beta[i]) * float(ret[i] - q[i, A_i])
            torch.testing.assert_close(grad[i], by_hand)


def test_proposition_1_unbiased_with_one_over_mu_and_bias_formula():
    """Monte-Carlo check of Proposition 1 on one state: A ~ mu, E[R(A)] = Q^pi(A)."""
    torch.manual_seed(0)
    theta = torch.tensor([0.3, -0.5, 1.0, 0.1], requires_grad=True)
    n_act = theta.numel()
    mu = torch.tensor([0.4, 0.3, 0.2, 0.1])
    q_pi = torch.tensor([1.0, -2.0, 0.5, 3.0])
    q_wrong = q_pi + torch.tensor([2.0, -1.0, 1.5, -3.0])
    pi = torch.softmax(theta, -1)
    jac = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), theta)  # d pi(a) / d theta
    true_g = jac.T @ q_pi  # G = sum_a Q^pi(a) grad pi(a)  (eq. 3)
    N = 400_000
    action = torch.multinomial(mu, N, replacement=True).unsqueeze(-1)
    ret = q_pi[action] + 0.5 * torch.randn(N, 1)

    def estimate(q, beta_of_mu):
        beta = beta_of_mu(mu[action])
        surrogate = beta_loo_surrogate(pi.expand(N, n_act), q.expand(N, n_act), ret, action, beta).mean()
        (g,) = torch.autograd.grad(surrogate, theta, retain_graph=True)
        return g

    tol = 0.03
    # beta = 1/mu: unbiased whatever Q (eq. 6)
    assert torch.allclose(estimate(q_wrong, lambda m: 1 / m), true_g, atol=tol)
    # beta = 1 with exact Q: unbiased as well
    assert torch.allclose(estimate(q_pi, torch.ones_like), true_g, atol=tol)
    # beta = 1 (LOO) with a wrong Q: biased by sum_a (1 - mu(a) beta(a)) grad pi(a) (Q(a) - Q^pi(a))
    bias = jac.T @ ((1 - mu) * (q_wrong - q_pi))
    assert bias.abs().max() > 10 * tol
    assert torch.allclose(estimate(q_wrong, torch.ones_like), true_g + bias, atol=tol)
    # beta = min(c, 1/mu) with c = 5: the bias formula holds with beta(a) = min(5, 1/mu(a))
    beta5 = (1 / mu).clamp_max(5.0)
    bias5 = jac.T @ ((1 - mu * beta5) * (q_wrong - q_pi))
    assert torch.allclose(estimate(q_wrong, lambda m: (1 / m).clamp_max(5.0)), true_g + bias5, atol=tol)


def test_tislr_surrogate_is_unbiased_with_exact_q():
    """TISLR (ACER's truncation with bias correction) is unbiased when Q = Q^pi."""
    torch.manual_seed(1)
    theta = torch.tensor([0.3, -0.5, 1.0, 0.1], requires_grad=True)
    mu = torch.tensor([0.1, 0.5, 0.1, 0.3])
    q_pi = torch.tensor([1.0, -2.0, 0.5, 3.0])
    log_pi = torch.log_softmax(theta, -1)
    true_g = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), theta).T @ q_pi
    N = 400_000
    action = torch.multinomial(mu, N, replacement=True).unsqueeze(-1)
    ret = q_pi[action] + 0.5 * torch.randn(N, 1)
    surrogate = tislr_surrogate(log_pi.expand(N, 4), q_pi.expand(N, 4), ret, action, mu.log().expand(N, 4), 1.5)
    (g,) = torch.autograd.grad(surrogate.mean(), theta)
    assert torch.allclose(g, true_g, atol=0.03)


def test_learned_mu_hat_converges_to_empirical_action_frequencies():
    """mu-hat trained by cross-entropy on a fixed replay predicts the replayed actions' frequencies; its
    gradients never move the shared encoder (sec. 3.3)."""
    loss, nets, _, _ = make_loss(None, learned=True)
    g = torch.Generator().manual_seed(3)
    freqs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.25, 0.65]])
    B, T = 32, 8
    states = torch.randint(2, (B, T + 1), generator=g)
    obs = torch.nn.functional.one_hot(states, OBS).float()
    state = states[:, :T]
    action = torch.multinomial(freqs[state].reshape(-1, A), 1, generator=g).reshape(B, T)
    td = TensorDict(
        {
            "observation": obs[:, :T], "action": action, ("next", "observation"): obs[:, 1:],
            ("next", "reward"): torch.zeros(B, T, 1), ("next", "terminated"): torch.zeros(B, T, 1, dtype=torch.bool),
            ("next", "done"): torch.zeros(B, T, 1, dtype=torch.bool),
            ("behaviour", "log_prob"): torch.full((B, T), math.log(1 / A)),
        },
        [B, T],
    )
    empirical = torch.stack([torch.bincount(action[state == s], minlength=A) / (state == s).sum() for s in (0, 1)])
    encoder = nets.q_network[0].module
    before = [p.detach().clone() for p in encoder.parameters()]
    opt = torch.optim.Adam([p for p in loss.parameters() if p.requires_grad], lr=0.05)
    for _ in range(150):
        opt.zero_grad(set_to_none=True)
        loss(td)["loss_behaviour"].backward()
        opt.step()
    with torch.no_grad(), set_recurrent_mode(False):
        probe = TensorDict({"observation": torch.eye(OBS)[:2]}, [2])
        mu_hat = nets.network(probe)["mu_logits"].exp()
    torch.testing.assert_close(mu_hat, empirical, atol=0.02, rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(before, encoder.parameters()))


def test_target_network_is_copied_exactly_every_t_update_steps():
    cfg = load_config("reactor", ["reactor.target_update=3", "network.lstm=false"])
    agent = build(cfg, info())
    loss = agent.loss
    opt = torch.optim.Adam([p for p in loss.parameters() if p.requires_grad], lr=0.01)
    td, _ = make_window()
    copies, snapshot = [], loss.target_network_params.flatten_keys().clone()
    for step in range(1, 10):
        opt.zero_grad()
        sum(v for k, v in loss(td).items() if k.startswith("loss_")).backward()
        opt.step()
        for updater in agent.updaters:
            updater.step()
        online = loss.network_params.flatten_keys()
        target = loss.target_network_params.flatten_keys()
        same = all(torch.equal(online[k], target[k]) for k in online.keys())
        copies.append(same)
        if not same:  # between copies the target keeps the last copied parameters
            assert all(torch.equal(target[k], snapshot[k]) for k in target.keys())
        else:
            snapshot = target.clone()
    assert copies == [s % 3 == 0 for s in range(1, 10)]


def test_update_plan_is_replay_only():
    loss, *_ = make_loss(updates_per_batch=1.5)
    rng = np.random.default_rng(0)
    plans = [loss.update_plan(rng) for _ in range(2000)]
    assert all(set(p) <= {0.0} for p in plans)
    assert np.mean([len(p) for p in plans]) == pytest.approx(1.5, abs=0.05)


def test_sequences_crossing_an_episode_are_rejected():
    loss, *_ = make_loss()
    td, _ = make_window()
    td["mask"] = torch.ones_like(td["mask"])  # a done step followed by real steps
    with pytest.raises(ValueError, match="episode boundary"):
        loss(td)


def test_atari_network_table_1_shapes_and_loss():
    cnn = ReactorCNN(1)
    frames = torch.randint(0, 255, (2, 1, 84, 84), dtype=torch.uint8)
    assert cnn(frames).shape == (2, 256)
    nets = make_networks(info((1, 84, 84)), [], 128, 32, 0.01, True)
    assert [t.lstm.lstm.hidden_size for t in nets.torsos] == [128, 128, 128]
    hidden = [k for t in nets.torsos for k in t.hidden_keys]
    loss = ReactorLoss(nets.network, nets.q_network, hidden_keys=hidden, learned_behaviour=True)
    target_updater(loss, 10)
    B, T = 1, 3
    td = TensorDict(
        {
            "observation": torch.randint(0, 255, (B, T, 1, 84, 84), dtype=torch.uint8),
            ("next", "observation"): torch.randint(0, 255, (B, T, 1, 84, 84), dtype=torch.uint8),
            "action": torch.randint(A, (B, T)), ("next", "reward"): torch.ones(B, T, 1),
            ("next", "terminated"): torch.zeros(B, T, 1, dtype=torch.bool),
            ("next", "done"): torch.zeros(B, T, 1, dtype=torch.bool),
            ("behaviour", "log_prob"): torch.full((B, T), math.log(1 / A)),
            "is_init": torch.zeros(B, T, 1, dtype=torch.bool),
            **{k: torch.zeros(B, T, 1, 128) for k in hidden},
        },
        [B, T],
    )
    out = loss(td)
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    assert all(torch.isfinite(v) for v in out.values())


def test_config_errors_and_presets():
    cfg = load_config("reactor", [])
    assert cfg.preset == "cartpole" and cfg.replay.seq_len == 33
    assert load_config("reactor", ["preset=cartpole_pomdp"]).network.lstm
    with pytest.raises(ConfigError, match="reactor.pg"):
        load_config("reactor", ["reactor.pg=islr"])
    with pytest.raises(ConfigError, match="beta_c"):
        load_config("reactor", ["reactor.beta_c=0.5"])
    assert load_config("reactor", ["reactor.beta_c=inf"]).algo.beta_c == math.inf
    with pytest.raises(ConfigError, match="discrete"):
        build(cfg, info(discrete=False))


@pytest.mark.integration
@pytest.mark.parametrize("recurrent_state", ["refresh", "zero"])
def test_pomdp_preset_runs_with_three_lstms(tmp_path, recurrent_state):
    """The recurrent path end to end: Q, pi and mu-hat LSTMs, their states refreshed (or reset) by the replay."""
    from acer_torchrl.cli import run

    summary = run(
        "reactor",
        ["preset=cartpole_pomdp", "total_frames=512", "collector.workers=0", "replay.min_size=192",
         "replay.batch_size=4", "replay.seq_len=8", "network.lstm_hidden=8", "eval.episodes=1",
         "eval.interval=448", "log.progress=false", "reactor.behaviour=learned",
         f"replay.recurrent_state={recurrent_state}", f"run_dir={tmp_path / 'run'}"],
    )
    assert summary["updates"] > 0
    header, *rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    logged = dict(zip(header.split(","), rows[0].split(",")))
    assert math.isfinite(float(logged["loss_behaviour"])) and math.isfinite(float(logged["loss_critic"]))


@pytest.mark.slow
@pytest.mark.learning
def test_reactor_learns_cartpole(tmp_path):
    """preset=cartpole (replay-only beta-LOO, learned mu-hat): a random policy scores ~20; the final score
    (mean greedy return of 10 episodes at 90, 95 and 100 % of the run) at 25.6k is far above it (seed 0 of the
    preset scored 416 at 20k and 428 at 25k, results/cartpole-stability.md)."""
    from acer_torchrl.cli import run

    summary = run(
        "reactor",
        ["preset=cartpole", "total_frames=25600", "log.progress=false", "eval.interval=1000000",
         f"run_dir={tmp_path / 'run'}", "seed=0"],
    )
    assert summary["final_score_evaluations"] == 3
    assert summary["eval_return_mean"] >= 150, summary


@pytest.mark.integration
def test_resumed_run_keeps_the_target_copy_schedule(tmp_path):
    """The HardUpdate step counter is checkpointed: after resume= the next target copy comes on time."""
    from acer_torchrl.cli import run
    from acer_torchrl.trainer import Trainer

    tiny = ["collector.workers=0", "collector.frames_per_batch=32", "replay.min_size=64", "replay.batch_size=4",
            "eval.episodes=1", "eval.max_steps=20", "eval.interval=100000", "log.progress=false", "network.lstm=false",
            "reactor.target_update=7", "reactor.updates_per_batch=1"]
    summary = run("reactor", [*tiny, "total_frames=160", f"run_dir={tmp_path}"])
    assert summary["updates"] % 7 != 0, "pick sizes whose update count is not a multiple of the period"
    resumed = Trainer(load_config("reactor", [f"resume={tmp_path}", "total_frames=192"]))
    [updater] = resumed.agent.updaters
    assert updater.counter == summary["updates"] % 7
