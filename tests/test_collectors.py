"""Collectors: batch layout, trajectory ids, recurrent state, weight pushes, clean exit."""

import copy
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import LSTMModule, ProbabilisticActor

from acer_torchrl.collectors import (
    REMOTE_TRAJ_STRIDE,
    InProcessCollector,
    MultiProcessCollector,
    RemoteCollection,
    RemoteCollector,
    copy_weights_,
    dead_workers,
    make_collector,
    make_remote_collector,
)
from acer_torchrl.envs import EnvConfig, make_env_fn

NUM_ENVS, T = 2, 25


def recurrent_policy():
    """LSTM policy over CartPole; ``head.bias`` steers its actions."""
    lstm = LSTMModule(input_size=4, hidden_size=8, in_key="observation", out_key="core")
    head = nn.Linear(8, 2)
    policy = ProbabilisticActor(
        TensorDictSequential(lstm, TensorDictModule(head, ["core"], ["logits"])),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    return policy, lstm, head


def free_port_triple() -> int:
    """A port p with p, p + 1 and p + 2 free here (a remote collection listens on the three)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("localhost", 0))
            port = probe.getsockname()[1]
        if port + 2 < 65536:
            try:
                for offset in (1, 2):
                    with socket.socket() as s:
                        s.bind(("localhost", port + offset))
                return port
            except OSError:
                continue
    raise RuntimeError("no three consecutive free ports")


@pytest.fixture(scope="module", params=["workers", "remote"])
def recurrent_run(request):
    """Two collector processes with two CartPoles each, an LSTM policy; yields (collector, head, batches,
    the batch iterator).
    ``workers``: :func:`make_collector`'s worker processes; ``remote``: :func:`make_remote_collector`'s
    ranks of a ``torch.distributed`` group, started here as local processes (a multi-node job's other tasks
    run the same code under SLURM: tests/test_slurm.py)."""
    policy, lstm, head = recurrent_policy()
    env_fn = make_env_fn(EnvConfig(num_envs=NUM_ENVS, max_episode_steps=30), extra_transforms=[lstm.make_tensordict_primer()])
    if request.param == "workers":
        collector = make_collector(env_fn, policy, num_workers=2, frames_per_batch=NUM_ENVS * T, seed=0)
        assert isinstance(collector, MultiProcessCollector)
    else:
        remote = RemoteCollection("localhost", free_port_triple(), ranks=2)
        rendezvous = {key: os.environ.get(key) for key in RemoteCollector.RENDEZVOUS}
        handler, rng = signal.getsignal(signal.SIGINT), torch.get_rng_state()
        collector = make_remote_collector([env_fn, env_fn], policy, remote, frames_per_batch=NUM_ENVS * T, launcher="mp")
        assert isinstance(collector, RemoteCollector)
        # TorchRL built rank 1's env here too: the learner keeps its Ctrl-C / preemption handlers and its RNG
        assert signal.getsignal(signal.SIGINT) is handler and torch.equal(torch.get_rng_state(), rng)
    with collector:
        stream = iter(collector)  # one iteration for the whole run, as the trainer does
        batches = [next(stream) for _ in range(8)]
        yield collector, head, batches, stream
    if request.param == "remote":  # TorchRL's rendezvous variables gone with it (a SLURM job submitted later inherits them)
        assert {key: os.environ.get(key) for key in RemoteCollector.RENDEZVOUS} == rendezvous


@pytest.mark.integration
def test_batches_are_env_major_with_unique_trajectory_ids(recurrent_run):
    collector, _, batches, _ = recurrent_run
    steps_of = {}  # traj id -> step counts seen under it
    for batch in batches:
        assert batch.shape == (NUM_ENVS, T)
        ids = batch["collector", "traj_ids"]
        is_init = batch["is_init"].squeeze(-1)
        assert torch.equal(ids[:, 1:] != ids[:, :-1], is_init[:, 1:])  # a new id exactly when an episode starts
        for row_ids, row_steps in zip(ids, batch["step_count"].squeeze(-1)):
            for i, s in zip(row_ids.tolist(), row_steps.tolist()):
                steps_of.setdefault(i, []).append(s)
    assert len(steps_of) > 2 * NUM_ENVS
    if isinstance(collector, RemoteCollector):  # rank r's ids from r * stride: both ranks delivered
        assert {i // REMOTE_TRAJ_STRIDE for i in steps_of} == {1, 2}
    for i, steps in steps_of.items():
        # one stream per id: its steps are one run of consecutive counts (two workers or envs sharing an id
        # would repeat counts)
        steps.sort()
        assert steps == list(range(steps[0], steps[0] + len(steps))), f"trajectory id {i} is shared"


@pytest.mark.integration
def test_recurrent_state_is_in_every_step(recurrent_run):
    _, _, batches, _ = recurrent_run
    for batch in batches:
        h, next_h = batch["recurrent_state_h"], batch["next", "recurrent_state_h"]
        assert h.shape == (NUM_ENVS, T, 1, 8) and batch["recurrent_state_c"].shape == h.shape
        is_init = batch["is_init"].squeeze(-1)
        assert (h[is_init] == 0).all()  # episodes start from a zero state
        carried = ~is_init[:, 1:]
        assert torch.equal(h[:, 1:][carried], next_h[:, :-1][carried])  # the state flows step to step
        assert next_h.abs().sum() > 0


@pytest.mark.integration
def test_weight_push_changes_the_workers_policy(recurrent_run):
    collector, head, batches, stream = recurrent_run
    assert 0.2 < torch.cat([b["action"].float().flatten() for b in batches]).mean() < 0.8
    with torch.no_grad():
        head.bias.copy_(torch.tensor([50.0, -50.0]))  # action 0 always
    collector.update_policy_weights_()
    stale_most = 2 * 2 if isinstance(collector, MultiProcessCollector) else 2
    after = draws_after_push(stream, stale_most, fresh=lambda batch: bool((batch["action"] == 0).all()))
    assert sum(fresh for _, fresh in after) >= 4


def draws_after_push(stream, stale_most: int, fresh) -> list[tuple[dict, bool]]:
    """The next ``stale_most + 4`` batches after a weight push, each with ``fresh(batch)``; checks that at most
    ``stale_most`` were (partly) collected before the push. A worker holds up to two (one waiting in the output
    queue, MultiProcessCollector's slot per worker, and the one it was collecting), a remote rank one; a worker
    that a loaded machine slows delivers its stale ones after another's fresh ones, so only their count is fixed."""
    after = [next(stream) for _ in range(stale_most + 4)]
    after = [(batch, fresh(batch)) for batch in after]
    stale = [i for i, (_, is_fresh) in enumerate(after) if not is_fresh]
    assert len(stale) <= stale_most, f"batches {stale} of {len(after)} after the push acted with older weights"
    return after


class ActedWeights(nn.Module):
    """CartPole logits from a linear map, and next to them, at every step, the weights that computed them."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, observation):
        weights = torch.cat([self.linear.weight.flatten(), self.linear.bias])
        return self.linear(observation), weights.expand(*observation.shape[:-1], -1)


def flat_weights(policy) -> torch.Tensor:
    """The policy's parameters in one vector, in ``ActedWeights``' order."""
    return torch.cat([p.detach().flatten() for p in policy.parameters()])


@pytest.mark.integration
@pytest.mark.parametrize("acting", ["learner", "copy"])
def test_workers_act_with_the_pushed_weights_bit_for_bit(acting):
    """After an optimiser step and a push, the workers act with exactly the learner's weights: ``learner``, the
    collector was given the learner's policy (a CPU learner); ``copy``, an acting copy of it, copied into in place
    before the push (a GPU learner's path, ``Trainer.sync_acting_policy``)."""
    net = TensorDictModule(ActedWeights(), ["observation"], ["logits", "acted_weights"])
    learner = ProbabilisticActor(net, in_keys=["logits"], distribution_class=torch.distributions.Categorical,
                                 return_log_prob=True)
    policy = learner if acting == "learner" else copy.deepcopy(learner)
    optimizer = torch.optim.Adam(learner.parameters(), lr=0.1)
    env_fn = make_env_fn(EnvConfig(max_episode_steps=30))
    with make_collector(env_fn, policy, num_workers=2, frames_per_batch=T, seed=0) as collector:
        stream = iter(collector)
        before = flat_weights(learner)
        assert all(torch.equal(next(stream)["acted_weights"], before.expand(T, -1)) for _ in range(2))
        for _ in range(2):
            loss = sum((p * torch.randn_like(p)).sum() for p in learner.parameters())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if acting == "copy":
                copy_weights_(TensorDict.from_module(policy), TensorDict.from_module(learner))
            collector.update_policy_weights_()
            pushed = flat_weights(learner)
            assert not torch.equal(pushed, before)
            # a stale batch may even hold a step that acted during the optimiser step, with some tensors updated
            # (``learner``: the workers read the learner's own tensors, SharedWeightsScheme)
            after = draws_after_push(stream, 2 * 2, fresh=lambda b: torch.equal(b["acted_weights"], pushed.expand(T, -1)))
            assert sum(fresh for _, fresh in after) >= 4
            before = pushed


def test_in_process_collector_is_seeded_and_flat():
    def run():
        policy, lstm, _ = recurrent_policy()
        torch.manual_seed(0)
        for p in policy.parameters():
            nn.init.normal_(p)
        env_fn = make_env_fn(EnvConfig(max_episode_steps=30), extra_transforms=[lstm.make_tensordict_primer()])
        with make_collector(env_fn, policy, num_workers=0, frames_per_batch=T, total_frames=3 * T, seed=4) as c:
            assert isinstance(c, InProcessCollector)
            return [b for b in c]

    first, second = run(), run()
    assert len(first) == 3 and all(b.shape == (T,) for b in first)
    for a, b in zip(first, second):
        assert torch.equal(a["observation"], b["observation"]) and torch.equal(a["action"], b["action"])


def test_collector_argument_errors():
    policy, _, _ = recurrent_policy()
    env_fn = make_env_fn(EnvConfig())
    with pytest.raises(ValueError, match="got 3 env factories for 2 workers"):
        make_collector([env_fn] * 3, policy, num_workers=2, frames_per_batch=10)
    with pytest.raises(ValueError, match="collector.workers must be >= 0"):
        make_collector(env_fn, policy, num_workers=-1, frames_per_batch=10)
    meta_policy = TensorDictModule(nn.Linear(4, 2, device="meta"), ["observation"], ["logits"])
    with pytest.raises(ValueError, match="the acting policy must be on CPU"):
        make_collector(env_fn, meta_policy, num_workers=1, frames_per_batch=10)


EXIT_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.modules import MLP, ProbabilisticActor
    from acer_torchrl.collectors import make_collector
    from acer_torchrl.envs import EnvConfig, make_env_fn

    if __name__ == "__main__":
        net = MLP(in_features=4, out_features=2, num_cells=[64, 64])
        policy = ProbabilisticActor(TensorDictModule(net, ["observation"], ["logits"]), in_keys=["logits"],
                                    distribution_class=torch.distributions.Categorical, return_log_prob=True)
        collector = make_collector(make_env_fn(EnvConfig()), policy, num_workers=2, frames_per_batch=50)
        for i, batch in enumerate(collector):
            collector.update_policy_weights_()
            if i == 3:
                break
        print("collected", i + 1, flush=True)
        if sys.argv[1] == "close":
            collector.close()
    """
)


@pytest.mark.integration
@pytest.mark.parametrize("ending", ["close", "leave-open"])
def test_process_exits_without_hanging(tmp_path, ending):
    """torchrl 0.14 hangs at exit when a multi-process collector is left open; ours exits either way.

    The script takes ~15 s on an idle 2-core machine and up to ~45 s when other jobs load it (spawned
    workers import torch again); a hang never ends, so 90 s separates the two.
    """
    script = tmp_path / "collect_and_exit.py"
    script.write_text(EXIT_SCRIPT)
    done = subprocess.run([sys.executable, str(script), ending], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "collected 4" in done.stdout


def collect_with_a_slow_learner(replay):
    """Two workers, 8 steps per batch; the learner sleeps 1.5 s after every other batch, longer than the
    1 s a TorchRL 0.14 worker waits to ``put`` its batch into a full output queue before dropping it."""
    import time

    policy = ProbabilisticActor(
        TensorDictModule(nn.Linear(4, 2), ["observation"], ["logits"]),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
    )
    env_fn = make_env_fn(EnvConfig(max_episode_steps=200))
    with make_collector(env_fn, policy, num_workers=2, frames_per_batch=8, seed=0) as collector:
        for i, batch in enumerate(collector):
            replay.extend(batch)
            if i % 2 == 0:
                time.sleep(1.5)
            if i == 9:
                break


@pytest.mark.integration
def test_the_learner_keeps_its_threads_while_the_workers_run():
    """The learner's torch threads are what the trainer set (``learner_threads``: the cores the workers leave free)
    while the workers run and after they stop. TorchRL subtracted its workers from them again at their start (16
    cores, 8 workers: a learner of 1 thread) and added them back at shutdown (found by a resume audit)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        policy, lstm, _ = recurrent_policy()
        env_fn = make_env_fn(EnvConfig(num_envs=NUM_ENVS, max_episode_steps=30),
                             extra_transforms=[lstm.make_tensordict_primer()])
        with make_collector(env_fn, policy, num_workers=2, frames_per_batch=NUM_ENVS * T, seed=0) as collector:
            next(iter(collector))
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.integration
def test_collector_never_drops_a_batch_while_the_learner_is_busy():
    """Every env step a worker runs reaches the learner: no ``step_count`` gap in any trajectory."""
    from acer_torchrl.replay import EpisodeReplay

    replay = EpisodeReplay(1000)
    collect_with_a_slow_learner(replay)
    assert len(replay) == 80
    assert replay.steps_missing == 0


@pytest.mark.integration
def test_replay_never_bridges_the_batches_the_async_collector_drops(monkeypatch):
    """With TorchRL 0.14's own one-slot output queue the slow learner makes workers drop batches. Those
    steps never arrive: the replay sees the ``step_count`` gap, counts the steps and cuts the trajectory
    instead of linking across it."""
    from acer_torchrl.replay import EpisodeReplay

    monkeypatch.setattr(MultiProcessCollector, "_queue_len", property(lambda self: 1))
    replay = EpisodeReplay(1000)
    collect_with_a_slow_learner(replay)
    assert replay.steps_missing > 0, "no batch was dropped: the premise of this test no longer holds"
    stored = replay.gather(torch.arange(len(replay)))
    linked = (replay.next[: len(replay)] >= 0).nonzero().squeeze(-1)
    after = stored[replay.next[linked]]
    assert torch.equal(after["collector", "traj_ids"], stored[linked]["collector", "traj_ids"])
    assert torch.equal(after["step_count"], stored[linked]["step_count"] + 1)
    torch.testing.assert_close(after["observation"], stored[linked]["next", "observation"])


class _ExitingProcess:
    """A worker killed a moment ago: its pipes are closed, and the kernel reports its exit code after ``polls``
    more looks."""

    pid = 4242

    def __init__(self, polls: int):
        self.polls = polls

    @property
    def exitcode(self) -> int | None:
        self.polls -= 1
        return -signal.SIGKILL if self.polls < 0 else None


class _LiveProcess:
    pid = 4343
    exitcode = None


def test_a_worker_whose_exit_code_comes_after_its_pipe_closed_is_named_dead():
    """The learner's message to a worker killed a moment ago fails (BrokenPipeError) before the worker's exit code
    is there: its death is still found (the run once ended with exit code 141 and nothing said, in CI)."""
    assert dead_workers([_LiveProcess(), _ExitingProcess(polls=5)]) == ["collector worker 1 (pid 4242) died (killed by SIGKILL)"]
    assert dead_workers([_LiveProcess()], wait_s=0.1) == []
