"""Reactor's distributional critic (Gruslys et al. 2018, ICLR version, sec. 3.2): the C51 projection, distributional
Retrace (the vectorised form against the definition's loop, its mean against the scalar Retrace), eq. 12's KL
gradient, the categorical dueling head, the loss behind ``reactor.distributional`` and its settings, and a short
recipe run.

Windows hold terminated steps, truncated steps and episode boundaries mid-window and at the window's end.
"""

import csv
import json
import re
import subprocess
import sys

import pytest
import torch
import yaml
from tensordict import TensorDict
# one_thread: test_reactor's autouse fixture (one intra-op thread), imported to apply here too
from test_reactor import capture_pi, make_window, one_thread  # noqa: F401
from test_user_errors import ENV, ROOT, error_line

from acer_torchrl.algorithms.reactor import CategoricalDuelingHead, make_networks
from acer_torchrl.config import ConfigError, load_config, unused_settings
from acer_torchrl.envs import EnvInfo
from acer_torchrl.objectives.functional import (
    distributional_retrace,
    distributional_retrace_reference,
    project_on_support,
    retrace,
)
from acer_torchrl.objectives.reactor import ReactorLoss

DTYPE = torch.float64


def random_window(B=5, T=9, A=3, support=None, seed=0, middle_atoms=None):
    """A window in the loss's layout: ``probs`` ``[B, T+1, A, N]`` are the target network's distributions on
    ``x_0 .. x_T`` (row ``t+1`` is ``x_{t+1}``, the next state of step ``t``), ``pi`` likewise ``[B, T+1, A]``.
    Row 0 terminates mid-window, row 1 is truncated mid-window, rows 2 and 3 end terminated and truncated at the
    window's end; the rest at random. ``middle_atoms``: only that many central atoms have mass."""
    g = torch.Generator().manual_seed(seed)
    N = support.shape[0]
    done = torch.rand(B, T, 1, generator=g) < 0.2
    terminated = done & (torch.rand(B, T, 1, generator=g) < 0.5)
    done[0, T // 3] = terminated[0, T // 3] = True
    done[1, T // 2], terminated[1, T // 2] = True, False
    done[2, -1] = terminated[2, -1] = True
    done[3, -1], terminated[3, -1] = True, False
    logits = 3 * torch.randn(B, T + 1, A, N, generator=g, dtype=DTYPE)
    if middle_atoms is not None:
        low = (N - middle_atoms) // 2
        logits[..., :low] = -torch.inf
        logits[..., low + middle_atoms :] = -torch.inf
    return dict(
        reward=torch.randn(B, T, 1, generator=g, dtype=DTYPE),
        probs=logits.softmax(-1),
        pi=torch.randn(B, T + 1, A, generator=g, dtype=DTYPE).softmax(-1),
        action=torch.randint(A, (B, T, 1), generator=g),
        trace=torch.rand(B, T, 1, generator=g, dtype=DTYPE) * 1.2,  # lambda min(1, rho) for lambda up to 1.2
        terminated=terminated,
        done=done,
    )


def vectorised(gamma, w, support):
    """:func:`distributional_retrace` on ``w`` as the loss calls it: ``q(x_t, a_t)`` and ``E_pi q(x_{t+1}, .)``."""
    T = w["reward"].shape[1]
    index = w["action"].unsqueeze(-1).expand(*w["action"].shape, support.shape[0])
    taken = w["probs"][:, :T].gather(-2, index).squeeze(-2)
    expected = (w["pi"][:, 1:].unsqueeze(-1) * w["probs"][:, 1:]).sum(-2)
    return distributional_retrace(gamma, w["reward"], taken, expected, w["trace"], w["terminated"], w["done"], support)


def reference(gamma, w, support):
    return distributional_retrace_reference(gamma, w["reward"], w["probs"][:, 1:], w["pi"][:, 1:], w["action"],
                                            w["trace"], w["terminated"], w["done"], support)


# ----------------------------------------------------------------------------- the estimator


@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
@pytest.mark.parametrize("A", [1, 2, 5])
@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0])
def test_vectorised_equals_the_definitions_loop(gamma, A, lam):
    """The vectorised target equals the loop written from sec. 3.2's equations, on a narrow support (many atoms
    clipped at its ends, the projection rarely exact), for several discounts, trace scales and action counts."""
    support = torch.linspace(-2.0, 3.0, 11, dtype=DTYPE)
    w = random_window(A=A, support=support, seed=A)
    w["trace"] = lam * w["trace"]
    expected = reference(gamma, w, support)
    torch.testing.assert_close(vectorised(gamma, w, support), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(expected.sum(-1), torch.ones_like(expected[..., 0]), rtol=0, atol=1e-12)


def test_mean_equals_the_scalar_retrace_where_the_projection_is_exact():
    """Atoms that stay inside a wide support: the mean of ``q*`` is :func:`retrace`'s ``Q^ret`` of the target
    distributions' means, terminated and truncated steps and the window's end included."""
    support = torch.linspace(-100.0, 100.0, 201, dtype=DTYPE)
    for gamma in (0.8, 1.0):
        w = random_window(T=13, support=support, middle_atoms=9, seed=3)
        q = (w["probs"] * support).sum(-1)  # [B, T+1, A]
        T = w["reward"].shape[1]
        q_ret = retrace(gamma, w["reward"], q[:, :T].gather(-1, w["action"]), (w["pi"][:, 1:] * q[:, 1:]).sum(-1, True),
                        w["trace"], w["terminated"], w["done"])
        mean = (vectorised(gamma, w, support) * support).sum(-1, keepdim=True)
        torch.testing.assert_close(mean, q_ret, rtol=0, atol=1e-10)


def test_a_window_by_hand():
    """Two steps, one action, support {0, 1, 2}, gamma 1/2: ``q*(x_0) = (1 - c_1) Proj[r_0 + z/2 at q(x_1)] +
    c_1 Proj[r_0 + r_1/2 + z/4 at q(x_2)]``; step 1 terminates: ``q*(x_1)`` is a Dirac at ``r_1``."""
    support = torch.tensor([0.0, 1.0, 2.0], dtype=DTYPE)
    probs = torch.tensor([[[[0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0]], [[0.0, 0.0, 1.0]]]], dtype=DTYPE)  # q(x_0..x_2)
    w = dict(reward=torch.tensor([[[1.0], [1.0]]], dtype=DTYPE), probs=probs, pi=torch.ones(1, 3, 1, dtype=DTYPE),
             action=torch.zeros(1, 2, 1, dtype=torch.long), trace=torch.tensor([[[0.3], [0.6]]], dtype=DTYPE),
             terminated=torch.tensor([[[False], [True]]]), done=torch.tensor([[[False], [True]]]))
    # n = 1: weight 1 - 0.6 = 0.4 at 1 + 0/2 = 1; n = 2: weight 0.6, a Dirac at 1 + 1/2 = 1.5: half on 1, half on 2
    expected = torch.tensor([[[0.0, 0.4 + 0.3, 0.3], [0.0, 1.0, 0.0]]], dtype=DTYPE)
    torch.testing.assert_close(vectorised(0.5, w, support), expected)
    torch.testing.assert_close(reference(0.5, w, support), expected)


def test_projection_keeps_mass_and_mean_inside_the_support_and_clips_outside():
    g = torch.Generator().manual_seed(0)
    support = torch.linspace(-1.0, 4.0, 21, dtype=DTYPE)
    values = torch.rand(6, 40, generator=g, dtype=DTYPE) * 5 - 1
    weights = torch.randn(6, 40, generator=g, dtype=DTYPE)  # signed, as Retrace's mixtures
    projected = project_on_support(values, weights, support)
    torch.testing.assert_close(projected.sum(-1), weights.sum(-1))
    torch.testing.assert_close((projected * support).sum(-1), (weights * values).sum(-1))
    on_grid = project_on_support(support[[3, 20, 0]], torch.tensor([0.5, 0.25, 0.25], dtype=DTYPE), support)
    assert on_grid[3] == 0.5 and on_grid[20] == 0.25 and on_grid[0] == 0.25 and on_grid.sum() == 1.0
    outside = project_on_support(torch.tensor([-7.0, 9.0], dtype=DTYPE), torch.tensor([0.3, 0.7], dtype=DTYPE), support)
    assert outside[0] == 0.3 and outside[-1] == 0.7 and outside.sum() == 1.0


def test_the_kl_gradient_with_respect_to_the_logits():
    """Eq. 12's ``-sum_i q*_i log q_i`` has the gradient ``softmax(logits) sum(q*) - q*`` w.r.t. the logits, also
    for signed targets whose mass is not 1."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 7, generator=g, dtype=DTYPE, requires_grad=True)
    target = torch.randn(4, 7, generator=g, dtype=DTYPE)
    (-(target * logits.log_softmax(-1)).sum()).backward()
    formula = logits.detach().softmax(-1) * target.sum(-1, keepdim=True) - target
    torch.testing.assert_close(logits.grad, formula)


# ----------------------------------------------------------------------------- the head and the loss

A, OBS, ATOMS = 3, 4, 11


def test_the_categorical_dueling_head_sums_value_and_centred_advantage_logits():
    head = CategoricalDuelingHead(5, 6, A, ATOMS)
    core = torch.randn(2, 8, 5)
    logits = head(core)
    assert logits.shape == (2, 8, A, ATOMS)
    value, advantage = head.value(core), head.advantage(core).reshape(2, 8, A, ATOMS)
    torch.testing.assert_close(logits, value.unsqueeze(-2) + advantage - advantage.mean(-2, keepdim=True))


def distributional_loss(lstm_hidden=None):
    """The loss and its networks (``ReactorNetworks``), the learning parameters moved away from the target ones."""
    torch.manual_seed(0)
    info = EnvInfo(obs_shape=(OBS,), obs_dtype=torch.float32, discrete=True, num_actions=A)
    nets = make_networks(info, [8], lstm_hidden, 6, 0.05, learned_behaviour=False, atoms=ATOMS)
    hidden_keys = [k for t in nets.torsos for k in t.hidden_keys]
    loss = ReactorLoss(nets.network, nets.q_network, gamma=0.9, lam=0.8, distributional=True, atoms=ATOMS,
                       v_min=-3.0, v_max=4.0, hidden_keys=hidden_keys)
    with torch.no_grad():
        for p in loss.network_params.values(True, True):
            p.add_(0.3 * torch.randn_like(p))
    return loss, nets


def window(seed: int, loss: ReactorLoss, lstm_hidden=None) -> TensorDict:
    """Replayed windows (``test_reactor.make_window``): one runs through, one terminates, one is truncated, the
    last two padded after their episode's end."""
    return make_window(loss.hidden_keys, lstm_hidden, seed=seed)[0]


@pytest.mark.filterwarnings("ignore:No target network updater")  # the loss alone: no updater steps
@pytest.mark.parametrize("lstm_hidden", [None, 5])
def test_one_update_of_the_distributional_loss(lstm_hidden):
    """One update on a window with terminated, truncated and padded rows, feed-forward and with the LSTMs: every
    output finite and named in ``out_keys``; the KL loss reaches the encoder and the Q branch, not the policy's;
    ``priority`` is each window's mean total variation, ``[B]``, in [0, 1], detached."""
    loss, nets = distributional_loss(lstm_hidden)
    td = window(1, loss, lstm_hidden)
    out = loss(td)
    assert set(out.keys()) == set(loss.out_keys) and "priority" in loss.out_keys
    assert all(torch.isfinite(v).all() for v in out.values())
    priority = out["priority"]
    assert priority.shape == (3,) and not priority.requires_grad and ((priority > 0) & (priority <= 1)).all()
    params = dict(loss.network_params.items(True, True))
    grads = dict(zip(params, torch.autograd.grad(out["loss_critic"], list(params.values()), allow_unused=True)))
    q_modules = len(nets.q_network.module)  # the network's first modules: the encoder, the Q LSTM, the head
    for name, grad in grads.items():  # the Q branch learns from the KL loss, the policy's does not
        reached = grad is not None and bool(grad.abs().sum() > 0)
        assert reached == (int(name[1]) < q_modules), name
    assert out["q_ret"].abs() <= 4.0 and out["q_taken"].abs() <= 4.0  # means on the support


@pytest.mark.filterwarnings("ignore:No target network updater")
def test_the_critics_loss_and_priority_from_the_estimator():
    """``loss_critic`` is the masked mean of ``-sum_i q*_i log q_i(x_t, a_t)`` with ``q*`` from the definition's loop
    on the target network's distributions (its parameters as built, before the learning ones moved) and the
    learning network's pi and traces; the priority is the masked mean of ``TV(q*, q)`` per window; the beta-LOO
    gradient reads the means of ``q`` and ``q*``."""
    loss, nets = distributional_loss()
    td = window(2, loss)
    B, T = td.shape
    store = capture_pi(nets)
    out = loss(td)
    ext = torch.cat([td["observation"][:, :1], td["next", "observation"]], 1)
    with torch.no_grad(), loss.network_params.to_module(loss.network):
        now = loss.network(TensorDict({"observation": ext}, [B, T + 1]))
    with torch.no_grad(), loss.target_network_params.to_module(loss.network):
        target = loss.network(TensorDict({"observation": ext}, [B, T + 1]))
    mask = td["mask"].unsqueeze(-1)
    done = td["next", "done"].clone()
    done[:, :-1] |= ~mask[:, 1:]  # the last real step before padding ends the mixture
    action = td["action"].unsqueeze(-1)
    rho = (now["logits"][:, :T].gather(-1, action) - td["behaviour", "log_prob"].unsqueeze(-1)).exp()
    support = torch.linspace(-3.0, 4.0, ATOMS)
    w = dict(reward=td["next", "reward"], probs=target["action_value_logits"].softmax(-1), pi=now["logits"].exp(),
             action=action, trace=0.8 * rho.clamp_max(1.0), terminated=td["next", "terminated"],
             done=done)
    q_star = reference(0.9, w, support)
    index = w["action"].unsqueeze(-1).expand(B, T, 1, ATOMS)
    q = now["action_value_logits"][:, :T].softmax(-1).gather(-2, index).squeeze(-2)
    kl = -(q_star * q.log()).sum(-1)
    torch.testing.assert_close(out["loss_critic"], kl[mask[..., 0]].mean().detach())
    variation = 0.5 * (q_star - q).abs().sum(-1)
    per_window = (variation * mask[..., 0]).sum(-1) / mask[..., 0].sum(-1)
    torch.testing.assert_close(out["priority"], per_window)
    # the record of how much of q* the support's ends hold (returns beyond [v_min, v_max] are projected there)
    torch.testing.assert_close(out["support_edge_mass"], (q_star[..., 0] + q_star[..., -1])[mask[..., 0]].mean())
    # the actor on the means: d(-loss_objective)/d pi(a) = beta (R(A) - Q(A)) 1[a = A] + Q(a) (beta-LOO, beta =
    # min(1, 1/mu(A))) with Q the mean of q(x_t, .) and R(A) the mean of q*
    out["loss_objective"].backward()
    pi = now["logits"][:, :T].exp()
    grad_pi = -store["log_pi"].grad[:, :T] / pi * mask.sum()
    q_mean = (now["action_value_logits"][:, :T].softmax(-1) * support).sum(-1)
    ret, q_taken = (q_star * support).sum(-1, keepdim=True), q_mean.gather(-1, action)
    beta = (-td["behaviour", "log_prob"].unsqueeze(-1)).exp().clamp_max(1.0)
    expected = q_mean.scatter_add(-1, action, beta * (ret - q_taken)) * mask
    torch.testing.assert_close(grad_pi, expected, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- settings and a run


def test_the_settings_refuse_an_empty_support_and_note_unused_keys():
    for v_min, v_max in (("5", "5"), ("0", "inf"), ("nan", "1")):
        with pytest.raises(ConfigError, match="finite reactor.v_min < reactor.v_max"):
            load_config("reactor", ["reactor.distributional=true", f"reactor.v_min={v_min}", f"reactor.v_max={v_max}"])
    with pytest.raises(ConfigError, match="reactor.atoms must be in"):
        load_config("reactor", ["reactor.atoms=1"])
    # the support is float32: a value, span or spacing it cannot hold is one line (before, torch.linspace's traceback,
    # or NaN targets)
    for v_min, v_max in (("0", "1e39"), ("-3e38", "3e38"), ("0", "1e-37")):
        with pytest.raises(ConfigError, match=re.escape(f"reactor.v_min={float(v_min):g} to reactor.v_max="
                                                        f"{float(v_max):g} over 51 atoms does not fit float32")):
            load_config("reactor", ["reactor.distributional=true", f"reactor.v_min={v_min}", f"reactor.v_max={v_max}"])
    overrides = ["reactor.distributional=false", "reactor.v_max=100", "reactor.atoms=21"]
    notes = unused_settings(load_config("reactor", overrides), overrides)
    assert notes == [f"note: {o} has no effect with reactor.distributional=false" for o in overrides[1:]]
    on = [*overrides, "reactor.distributional=true"]
    assert unused_settings(load_config("reactor", on), on) == []


@pytest.mark.integration
def test_a_short_distributional_cartpole_run(tmp_path):
    """``recipes/reactor.py preset=cartpole reactor.distributional=true`` trains, evaluates and finishes; its
    config.yaml records the critic it ran."""
    run_dir = tmp_path / "run"
    args = ["preset=cartpole", "reactor.distributional=true", "reactor.v_min=0", "reactor.v_max=100",
            "total_frames=256", "collector.workers=0", "collector.frames_per_batch=64", "replay.min_size=64",
            "replay.batch_size=4", "replay.seq_len=8", "reactor.updates_per_batch=2", "eval.episodes=1",
            "eval.max_steps=50", "log.progress=false", f"run_dir={run_dir}"]
    proc = subprocess.run([sys.executable, str(ROOT / "recipes" / "reactor.py"), *args], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] >= 256
    reactor = yaml.safe_load((run_dir / "config.yaml").read_text())["reactor"]
    assert reactor["distributional"] is True and (reactor["v_min"], reactor["v_max"]) == (0.0, 100.0)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and "priority" not in rows[0]  # per window, for the replay: not a metrics column
    # a wrong support is one line, exit code 2, before any work
    bad = subprocess.run([sys.executable, str(ROOT / "recipes" / "reactor.py"), "reactor.distributional=true",
                          "reactor.v_min=1", "reactor.v_max=0", f"run_dir={tmp_path / 'bad'}"], cwd=tmp_path, env=ENV,
                         capture_output=True, text=True, timeout=120)
    assert "reactor.v_min < reactor.v_max" in error_line(bad)
    assert not (tmp_path / "bad").exists()
