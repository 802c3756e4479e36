"""The four losses on their own (issue 47): each built from its networks outside the trainer and the replay, on a
hand-made TensorDict of steps that end terminated, truncated or not at all, gives the numbers the pipeline's update
(``Trainer.update``: the agent's hooks, the replay, ``forward_backward``) gives on the same steps. V-RACER's
``V^tbc`` and ``Q^ret`` come from :func:`episode_targets` on one side and from the agent's stored estimates
(:class:`VRACEREstimates`, over the replay) on the other."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from tensordict import TensorDict

from acer_torchrl.algorithms import loss_options
from acer_torchrl.config import load_config
from acer_torchrl.estimates.vracer import episode_targets
from acer_torchrl.objectives import ACERLoss, LASERLoss, ReactorLoss, VRACERLoss
from acer_torchrl.objectives.common import ReplayLoss, objective
from acer_torchrl.objectives.names import OUTPUTS, PRIORITY_KEY
from acer_torchrl.settings import get_algorithm
from acer_torchrl.trainer import Trainer

T = 8
# envs of T steps; each row a list of (traj_id, n_steps, end): the first row's episode terminates and the next
# goes on, the second row's is truncated and the next goes on
ROWS = [[(1, 5, "terminated"), (2, 3, None)], [(3, 4, "truncated"), (4, 4, None)]]
# Reactor's replayed sequences never cross an episode's end (EpisodeReplay.sample_sequences): one episode a row
WHOLE_ROWS = [[(1, T, "terminated")], [(2, T, "truncated")], [(3, T, None)]]


def pipeline(algo: str, preset: str, tmp_path, *overrides: str) -> Trainer:
    cfg = load_config(algo, [f"preset={preset}", "gamma=0.9", f"replay.seq_len={T}", "replay.min_size=16",
                             "collector.workers=0", "log.progress=false", f"run_dir={tmp_path / 'run'}", *overrides])
    return Trainer(cfg)


def hand_made(trainer: Trainer, rows: list = ROWS, seed: int = 0) -> TensorDict:
    """A collected ``[len(rows), T]`` batch of ``rows``, acted by the agent's policy (its behaviour statistics)."""
    g = torch.Generator().manual_seed(seed)
    traj, init, terminated, truncated = [], [], [], []
    for row in rows:
        traj.append([tid for tid, n, _ in row for _ in range(n)])
        init.append([t == 0 for _, n, _ in row for t in range(n)])
        terminated.append([t == n - 1 and end == "terminated" for _, n, end in row for t in range(n)])
        truncated.append([t == n - 1 and end == "truncated" for _, n, end in row for t in range(n)])
    terminated, truncated = torch.tensor(terminated).unsqueeze(-1), torch.tensor(truncated).unsqueeze(-1)
    obs_shape = trainer.info.obs_shape
    shape = (len(rows), T)
    td = TensorDict({
        "observation": torch.randn(*shape, *obs_shape, generator=g),
        "is_init": torch.tensor(init).unsqueeze(-1),
        ("collector", "traj_ids"): torch.tensor(traj),
        ("next", "observation"): torch.randn(*shape, *obs_shape, generator=g),
        ("next", "reward"): torch.randn(*shape, 1, generator=g),
        ("next", "terminated"): terminated,
        ("next", "truncated"): truncated,
        ("next", "done"): terminated | truncated,
    }, batch_size=shape)
    with torch.no_grad():
        trainer.agent.policy(td)
    return td.exclude(*trainer.agent.activation_keys)


def standalone_loss(trainer: Trainer, networks: tuple, **given) -> torch.nn.Module:
    """The pipeline's loss class built anew from (copies of) its networks, with the options of its config, then given
    the pipeline loss's state (average / target networks, ReF-ER's step count)."""
    loss_cls = type(trainer.loss)
    algorithm = get_algorithm(trainer.cfg.loss)
    options = loss_options(trainer.cfg.algo, loss_cls, algorithm.build_reads, **given)
    loss = loss_cls(*copy.deepcopy(networks), **options)
    loss.load_state_dict(trainer.loss.state_dict())
    return loss


def assert_same_numbers(loss: torch.nn.Module, td: TensorDict, stats: dict[str, float]) -> None:
    """``loss`` on ``td`` (autograd) against the pipeline update's statistics: every output entry's mean and the
    gradient's norm."""
    out = loss(td)
    objective(out).backward()
    grads = [p.grad for p in loss.parameters() if p.grad is not None]
    assert grads
    mine = {k: float(v.detach().float().mean()) for k, v in out.items() if k != PRIORITY_KEY}  # per window
    mine["grad_norm"] = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    assert set(mine) <= set(stats)
    for name, value in mine.items():
        assert stats[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def sequence_case(algo: str, tmp_path) -> tuple[Trainer, torch.nn.Module, TensorDict]:
    """The pipeline of a sequence loss (``algo``'s cartpole preset), the same loss built on its own and a hand-made
    batch of steps."""
    trainer = pipeline(algo, "cartpole", tmp_path)
    loss = trainer.loss
    common = dict(gamma=0.9, hidden_keys=[])
    if isinstance(loss, ACERLoss):
        standalone = standalone_loss(trainer, (loss.actor_network, loss.critic_network, None), discrete=True,
                                     on_policy=True, **common)
    elif isinstance(loss, LASERLoss):
        standalone = standalone_loss(trainer, (loss.network,), discrete=True, **common)
    else:
        assert isinstance(loss, ReactorLoss)
        # Q: a branch of the network (copied together, it stays one); the preset learns mu-hat (sec. 3.2)
        standalone = standalone_loss(trainer, (loss.network, loss.q_network), learned_behaviour=True, **common)
    return trainer, standalone, hand_made(trainer, WHOLE_ROWS if algo == "reactor" else ROWS)


@pytest.mark.filterwarnings("ignore:No target network updater")  # the loss alone: its test steps no updater
@pytest.mark.parametrize("algo", ["acer", "laser", "reactor"])
def test_a_sequence_loss_on_a_hand_made_batch_gives_the_pipelines_numbers(tmp_path, algo):
    trainer, standalone, td = sequence_case(algo, tmp_path)
    stats = trainer.update(td.clone())
    assert_same_numbers(standalone, td, stats)


@pytest.mark.parametrize("loss_cls", [ACERLoss, LASERLoss, ReactorLoss, VRACERLoss])
def test_the_sequence_length_is_the_replays_not_the_losss(loss_cls):
    """A loss takes batches of whatever sequence length the replay draws (``replay.seq_len``, which the trainer
    reads): none takes ``seq_len`` or keeps one."""
    assert "seq_len" not in inspect.signature(loss_cls).parameters
    assert not hasattr(ReplayLoss, "seq_len")


def vracer_case(tmp_path) -> tuple[Trainer, torch.nn.Module, TensorDict, torch.Tensor]:
    """V-RACER's pipeline with the hand-made steps stored in its replay (their slots), and V-RACER built from its
    network alone with those steps and their ``V^tbc`` and ``Q^ret`` of :func:`episode_targets` (eq. 8 over each
    episode's ``V`` and ``rho``; bootstrap 0 after the terminated step, ``V(s_T)`` after the truncated and the open
    ones)."""
    trainer = pipeline("vracer", "pendulum", tmp_path, "replay.seq_len=1")
    batch = trainer.loss.preprocess(hand_made(trainer))
    slots = trainer.replay.extend(batch)  # what Trainer.store does, with the slots
    trainer.agent.after_extend(trainer.replay)  # 16 steps stored: the state and reward statistics are fitted
    estimates = trainer.agent.estimates
    assert bool(estimates.fitted)
    standalone = standalone_loss(trainer, (trainer.loss.network,), lr=trainer.cfg.optim.lr)
    steps = batch.reshape(-1)
    value, rho, next_value = standalone.fresh_estimates(steps)
    reward = steps["next", "reward"].reshape(-1) / (float(estimates.reward_scale) + estimates.epsilon)
    v_tbc, q_ret, start = [], [], 0
    for _, n, end in [episode for row in ROWS for episode in row]:
        last = start + n - 1
        bootstrap = 0.0 if end == "terminated" else float(next_value[last])
        for out, x in zip((v_tbc, q_ret), episode_targets(value[start:last + 1], rho[start:last + 1],
                                                          reward[start:last + 1], bootstrap, trainer.cfg.gamma)):
            out.append(x)
        start = last + 1
    td = steps.select(*standalone.in_keys)
    td[standalone.tensor_keys.value_target] = torch.cat(v_tbc).unsqueeze(-1)
    td[standalone.tensor_keys.q_ret] = torch.cat(q_ret).unsqueeze(-1)
    return trainer, standalone, td, slots


def test_vracer_loss_on_targets_from_episode_targets_gives_the_pipelines_numbers(tmp_path):
    """V-RACER on its own, on targets of :func:`episode_targets`, against the pipeline's update on the same steps
    stored in its replay, where the agent's stored estimates give the targets."""
    trainer, standalone, td, slots = vracer_case(tmp_path)
    pipeline_batch = trainer.agent.before_update(trainer.replay.gather(slots, trainer.loss.in_keys), trainer.replay)
    for key in (standalone.tensor_keys.value_target, standalone.tensor_keys.q_ret):
        torch.testing.assert_close(pipeline_batch[key], td[key], rtol=1e-5, atol=1e-6)
    stats = trainer.update(trainer.replay.gather(slots, trainer.loss.in_keys))
    assert_same_numbers(standalone, td, stats)


@pytest.mark.filterwarnings("ignore:No target network updater")  # the loss alone: its test steps no updater
@pytest.mark.parametrize("algo", ["acer", "laser", "reactor", "vracer"])
def test_every_output_entry_is_in_out_keys_and_in_the_one_vocabulary(tmp_path, algo):
    """A loss's forward returns exactly its ``out_keys``, and an update reports those, the stored estimates'
    ``out_keys`` and the gradient norm: every name one of :data:`OUTPUTS` (issue 47)."""
    if algo == "vracer":
        trainer, standalone, td, slots = vracer_case(tmp_path)
        batch = trainer.replay.gather(slots, trainer.loss.in_keys)
    else:
        trainer, standalone, td = sequence_case(algo, tmp_path)
        batch = td.clone()
    assert set(standalone(td).keys()) == set(standalone.out_keys)
    added = getattr(trainer.agent.estimates, "out_keys", ())
    # each window's priority is for the replay, not a statistic of the update
    assert set(trainer.update(batch)) == {*trainer.loss.out_keys, *added, "grad_norm"} - {PRIORITY_KEY}
    assert set(standalone.out_keys) | set(added) <= set(OUTPUTS)
