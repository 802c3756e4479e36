"""Shared experience replay across a sweep (LASER sec. 5.4-5.5): agent ids and behaviour statistics survive
the round trip, trajectories of different agents never merge, one storage served to two processes over
torch.distributed (gloo + RPC) with both agents sampling each other's data and refreshing LSTM states with
their own network, and a short sweep end to end."""

from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.modules import set_recurrent_mode

from acer_torchrl.config import ConfigError, dump_yaml
from acer_torchrl.envs import EnvInfo
from acer_torchrl.modules import make_torso
from acer_torchrl.replay import EpisodeReplay, EpisodeStore, Replay
from acer_torchrl.shared_replay import (
    AGENT_KEY,
    AgentReplay,
    RemoteReplay,
    SharedReplay,
    SweepAgentTrainer,
    SweepConfig,
    agent_configs,
    parse_sweep_args,
    run,
    serve,
)
from process_group import captured, signal_group, spawned_children, wait_for

OBS = 3
HIDDEN = 5


def agent_batch(agent: int, traj_ids: list[int], start: int, T: int, ends: bool, hidden: bool = False) -> TensorDict:
    """``[n_envs, T]`` steps of ``agent``: env row ``r`` continues trajectory ``traj_ids[r]`` from step
    ``start``. observation = (agent, trajectory, step, noise); the behaviour logits encode the same
    (agent * 1000 + trajectory * 100 + step), as an acting policy would have written them."""
    n = len(traj_ids)
    traj = torch.tensor(traj_ids).unsqueeze(-1).expand(n, T)
    step = start + torch.arange(T).expand(n, T)
    code = (agent * 1000 + traj * 100 + step).double()
    done = torch.zeros(n, T, 1, dtype=torch.bool)
    done[:, -1] = ends
    td = TensorDict(
        {
            "observation": torch.stack([torch.full_like(code, agent), traj.double(), step.double(), torch.randn(n, T).double()], -1).float(),
            "action": torch.zeros(n, T, dtype=torch.long),
            "is_init": (step == 0).unsqueeze(-1),
            ("behaviour", "logits"): torch.stack([code, -code], -1),
            ("behaviour", "log_prob"): -code / 1e4,
            ("collector", "traj_ids"): traj.clone(),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "truncated"): torch.zeros_like(done),
            ("next", "reward"): torch.ones(n, T, 1),
            ("next", "observation"): torch.randn(n, T, OBS + 1),
        },
        batch_size=[n, T],
    )
    if hidden:
        for key in ("recurrent_state_h", "recurrent_state_c"):
            td.set(key, torch.randn(n, T, 1, HIDDEN))  # stale acting-time states: refresh must replace them
    return td


def fill(handles: list[AgentReplay], hidden: bool = False) -> None:
    """Both agents collect with colliding trajectory ids (each collector counts from 0), interleaved."""
    for chunk in range(3):
        for agent, handle in enumerate(handles):
            handle.extend(agent_batch(agent, [0, 1], start=8 * chunk, T=8, ends=chunk == 2, hidden=hidden))


def check_round_trip(sample: TensorDict) -> set[int]:
    """Every real step carries its own agent's id and behaviour statistics; sequences stay in one agent's
    trajectory, in order. Returns the agent ids seen."""
    mask = sample["mask"]
    obs, ids = sample["observation"], sample[AGENT_KEY][..., 0]
    logits, log_mu = sample["behaviour", "logits"], sample["behaviour", "log_prob"]
    code = ids * 1000 + obs[..., 1].long() * 100 + obs[..., 2].long()
    assert torch.equal(ids[mask], obs[..., 0].long()[mask]), "agent id does not match the agent's data"
    assert torch.equal(logits[..., 0][mask], code.double()[mask]), "behaviour logits changed in the replay"
    assert torch.equal(log_mu[mask], (-code.double() / 1e4)[mask])
    for b in range(obs.shape[0]):  # test-side loop over the sampled sequences
        real = obs[b][mask[b]]
        assert (real[:, :2] == real[0, :2]).all(), "a sequence mixes agents or trajectories"
        assert torch.equal(real[:, 2], real[0, 2] + torch.arange(len(real)).float())
    return set(ids[mask].tolist())


@pytest.mark.parametrize("cls", [EpisodeReplay, AgentReplay])
def test_both_replays_implement_the_declared_replay_protocol(cls):
    """Every method of :class:`Replay` exists with the same parameters (the trainer calls them by keyword
    too), and ``steps_missing`` is readable: a sweep agent's view is a drop-in for the run's own replay."""
    members = [name for name, value in vars(Replay).items() if callable(value) and not name.startswith("_")]
    assert {"extend", "sample_sequences", "sample_steps", "save", "load"} <= set(members)
    for name in [*members, "__len__"]:
        declared = list(inspect.signature(getattr(Replay, name)).parameters)
        assert list(inspect.signature(getattr(cls, name)).parameters) == declared, f"{cls.__name__}.{name}"
    assert "steps_missing" in Replay.__annotations__
    assert isinstance(vars(Replay)["num_episodes"], property) and isinstance(vars(cls)["num_episodes"], property)
    # and what a loss keeping per-step estimates reads (V-RACER in a sweep)
    for name in ("episode_links", "gather"):
        declared = list(inspect.signature(getattr(EpisodeStore, name)).parameters)
        assert list(inspect.signature(getattr(cls, name)).parameters) == declared, f"{cls.__name__}.{name}"
    assert {"capacity", "steps_written"} <= set(EpisodeStore.__annotations__)
    replay = EpisodeReplay(8) if cls is EpisodeReplay else AgentReplay(SharedReplay(EpisodeReplay(8), 1), 0, 1, owner=True)
    assert replay.steps_missing == 0 and len(replay) == 0 and replay.num_episodes == 0
    assert replay.capacity == 8 and replay.steps_written == 0 and replay.episode_links()[0] == 0


def test_agent_ids_and_behaviour_stats_survive_the_shared_replay():
    shared = SharedReplay(EpisodeReplay(1000, seed=0), n_agents=2)
    handles = [AgentReplay(shared, i, 2, owner=i == 0) for i in range(2)]
    fill(handles)
    assert len(handles[1]) == 2 * 2 * 24 and shared.agent_counts() == [48, 48]
    assert shared.replay.num_episodes == 4, "colliding trajectory ids of two agents must stay 4 episodes"
    assert [h.num_episodes for h in handles] == [4, 4], "each agent's view counts the shared replay's episodes"
    sample = handles[1].sample_sequences(64, 6)
    assert check_round_trip(sample) == {0, 1}
    assert handles[1].sampled.sum() == sample["mask"].sum() and (handles[1].sampled > 0).all()
    with pytest.raises(ValueError, match="agent_id 2"):
        shared.extend(agent_batch(2, [0], 0, 4, True), 2)


def test_only_the_owner_persists_the_shared_replay_every_agent_its_sample_counts(tmp_path):
    shared = SharedReplay(EpisodeReplay(1000, seed=0), n_agents=2)
    handles = [AgentReplay(shared, i, 2, owner=i == 0) for i in range(2)]
    fill(handles)
    for handle in handles:
        handle.sample_sequences(16, 4)
    handles[0].save(tmp_path / "a0")
    handles[1].save(tmp_path / "a1")
    assert (tmp_path / "a0" / "links.pt").is_file() and not (tmp_path / "a1" / "links.pt").exists()
    restored = SharedReplay(EpisodeReplay(1000, seed=0), n_agents=2)
    again = [AgentReplay(restored, i, 2, owner=i == 0) for i in range(2)]
    for i, handle in enumerate(again):
        handle.load(tmp_path / f"a{i}")
        assert torch.equal(handle.sampled, handles[i].sampled) and handle.sampled.sum() > 0
    assert restored.agent_counts() == [48, 48]


def test_an_agent_process_waits_for_every_agents_first_experience(monkeypatch):
    """Agent processes start at different speeds: the first update from replay waits until each agent stored
    data (else a fast agent's short run learns from its own data only), and says which agent never came."""
    import acer_torchrl.shared_replay.sweep as sr

    shared = SharedReplay(EpisodeReplay(1000, seed=0), n_agents=2)
    handles = [AgentReplay(shared, i, 2, owner=i == 0) for i in range(2)]
    handles[0].extend(agent_batch(0, [0], start=0, T=8, ends=False))
    waiting = types.SimpleNamespace(_shared_handle=handles[0], _peers_pending=True)
    late = threading.Timer(0.3, lambda: handles[1].extend(agent_batch(1, [0], start=0, T=8, ends=False)))
    late.start()
    started = time.monotonic()
    SweepAgentTrainer._wait_for_peers(waiting)
    assert time.monotonic() - started >= 0.25 and shared.agent_counts() == [8, 8] and not waiting._peers_pending
    alone = SharedReplay(EpisodeReplay(1000, seed=0), n_agents=3)
    AgentReplay(alone, 1, 3, owner=False).extend(agent_batch(1, [0], start=0, T=8, ends=False))
    monkeypatch.setattr(sr, "PEER_WAIT_S", 0.2)
    with pytest.raises(RuntimeError, match=r"agents \[0, 2\] stored no experience"):
        SweepAgentTrainer._wait_for_peers(types.SimpleNamespace(_shared_handle=AgentReplay(alone, 1, 3, owner=False)))


def test_sweep_arguments():
    sweep, rest = parse_sweep_args(["agents=4", "sweep.lr_factors=1,2", "preset=cartpole", "optim.lr=0.01"])
    assert sweep.agents == 4 and sweep.lr_factors == [1.0, 2.0] and rest == ["preset=cartpole", "optim.lr=0.01"]
    assert [sweep.factors(i) for i in range(4)] == [(1.0, 0.5), (2.0, 1.0), (1.0, 1.0), (2.0, 2.0)]
    assert len({sweep.factors(i) for i in range(6)}) == 6, "2 x 3 grid: 6 distinct agents"
    nine = parse_sweep_args(["agents=9"])[0]
    assert len({nine.factors(i) for i in range(9)}) == 9, "9 agents cover the 3 x 3 grid"
    with pytest.raises(ConfigError, match="sweep.bogus"):
        parse_sweep_args(["sweep.bogus=1"])
    with pytest.raises(ConfigError, match="mode"):
        parse_sweep_args(["mode=cloud"])


def test_resumed_sweep_keeps_every_agents_own_settings(tmp_path):
    """A requeued job passes its first arguments again: their base lr, entropy cost and seed do not replace
    (nor, for the entropy cost of the loss, stop) the values each agent trains with."""
    argv = ["agents=2", "preset=cartpole", "optim.lr=0.01", "laser.entropy_coeff=0.02", "seed=3", f"run_dir={tmp_path}"]
    sweep, overrides = parse_sweep_args(argv)
    _, started = agent_configs(sweep, overrides)
    for cfg in started:
        (tmp_path / Path(cfg.run_dir).name).mkdir()
        dump_yaml(cfg, Path(cfg.run_dir) / "config.yaml")
    _, resumed = agent_configs(sweep, [o.replace("run_dir=", "resume=") for o in overrides])
    own = [(c.optim.lr, c.algo.entropy_coeff, c.seed) for c in started]
    assert [(c.optim.lr, c.algo.entropy_coeff, c.seed) for c in resumed] == own and own[0] != own[1]


def started_sweep(sweep_dir: Path, argv: list[str]) -> list:
    """A sweep of ``argv`` as it starts in ``sweep_dir`` (each agent's config.yaml and the sweep's sweep.json, no
    training): its agents' configs."""
    from acer_torchrl.shared_replay.sweep import record_sweep_start

    sweep, overrides = parse_sweep_args([*argv, f"run_dir={sweep_dir}"])
    _, cfgs = agent_configs(sweep, overrides)
    for cfg in cfgs:
        Path(cfg.run_dir).mkdir(parents=True)
        dump_yaml(cfg, Path(cfg.run_dir) / "config.yaml")
    record_sweep_start(sweep, sweep_dir, overrides)
    return cfgs


def test_a_mode_changed_on_resume_is_recorded_beside_the_sweeps_keys(tmp_path):
    """``mode`` (or the port) may change on resume; ``sweep.json`` keeps the keys the sweep started with and
    ``resumes.jsonl`` gets what changed, with each agent's env steps then (none without checkpoints). The same keys
    again record nothing."""
    from acer_torchrl.shared_replay.sweep import record_sweep_start, resumed_sweep

    started_sweep(tmp_path, ["agents=2", "preset=cartpole"])
    keys = (tmp_path / "sweep.json").read_text()
    for mode in ("local", "processes"):
        sweep, overrides = parse_sweep_args([f"resume={tmp_path}", f"mode={mode}"])
        record_sweep_start(resumed_sweep(tmp_path, {"mode": sweep.mode}), tmp_path, overrides)
    assert (tmp_path / "sweep.json").read_text() == keys
    (record,) = [json.loads(line) for line in (tmp_path / "resumes.jsonl").read_text().splitlines()]
    assert record == {"env_steps_by_agent": [], "changed": {"mode": {"from": "local", "to": "processes"}}}


def test_every_sweep_key_on_resume_is_refused_or_reaches_the_live_agents(tmp_path, monkeypatch):
    """Each sweep key given again on resume: the agents and their grid (what each agent's saved config was made from)
    are refused in one line when changed; the others reach the sweep that runs (the drivers, stubbed here, get them,
    and the agents they would train keep their own settings). Nothing given: the saved keys, agents=2 included."""
    import acer_torchrl.shared_replay.sweep as sr
    from acer_torchrl.shared_replay.sweep import FIXED_ON_RESUME, sweep_key

    started = started_sweep(tmp_path, ["agents=2", "sweep.lr_factors=1,2", "preset=cartpole"])
    own = [(c.optim.lr, c.algo.entropy_coeff, c.seed) for c in started]
    driven = []
    drive = lambda sweep, overrides, *_: driven.append((sweep, agent_configs(sweep, overrides)[1]))  # noqa: E731
    monkeypatch.setattr(sr, "run_sweep", drive)
    monkeypatch.setattr(sr, "run_sweep_processes", drive)
    changed = {"agents": "1", "lr_factors": "4,8", "entropy_factors": "1", "mode": "processes",
               "master_addr": "localhost", "port": "40123"}
    assert set(changed) == {f.name for f in fields(SweepConfig)}, "a new sweep key needs its resume rule here"
    for name, value in changed.items():
        given = [f"resume={tmp_path}", f"{sweep_key(name)}={value}"]
        if name in FIXED_ON_RESUME:
            with pytest.raises(ConfigError, match=rf"{sweep_key(name)}={value}, but the sweep started with "):
                run(given)
            continue
        run(given)
        sweep, cfgs = driven.pop()
        assert str(getattr(sweep, name)) == value and sweep.agents == 2, name
        assert [(c.optim.lr, c.algo.entropy_coeff, c.seed) for c in cfgs] == own, name
    run([f"resume={tmp_path}", "agents=2", "sweep.lr_factors=1,2"])  # the values it started with: accepted
    run([f"resume={tmp_path}"])
    assert [(s.agents, s.lr_factors, s.mode) for s, _ in driven] == [(2, [1.0, 2.0], "local")] * 2
    # the base values the grid scales per agent: the same again (a requeued job passes its overrides again) is
    # accepted, another is refused (the agents keep their saved values: it would be applied nowhere)
    lr_factor, ent_factor = SweepConfig(agents=2, lr_factors=[1.0, 2.0]).factors(0)
    base = {"optim.lr": started[0].optim.lr / lr_factor, "laser.entropy_coeff": started[0].algo.entropy_coeff / ent_factor,
            "seed": started[0].seed}
    run([f"resume={tmp_path}", *(f"{key}={value}" for key, value in base.items())])
    assert [(c.optim.lr, c.algo.entropy_coeff, c.seed) for c in driven.pop()[1]] == own
    for key, value in base.items():
        other = value + 1 if key == "seed" else value * 2
        with pytest.raises(ConfigError, match=rf"{key}={other}, but the sweep started with {key}="):
            run([f"resume={tmp_path}", f"{key}={other}"])
    with pytest.raises(ConfigError, match="no readable sweep.json there"):
        run([f"resume={tmp_path / 'agent0'}"])


def test_a_sweep_agent_resumed_alone_is_sent_to_its_sweep(tmp_path, capsys):
    """``recipes/laser.py resume=<sweep>/agent1`` (or ``resume=<sweep>``): one line saying it belongs to a sweep and
    the command that resumes it, exit code 2 (not a 'corrupt checkpoint': its replay is the sweep's)."""
    from acer_torchrl.cli import main
    from acer_torchrl.commands import shell_command

    started_sweep(tmp_path, ["agents=2", "preset=cartpole"])
    for given, what in ((tmp_path / "agent1", f"an agent of the shared-replay sweep {tmp_path}"),
                        (tmp_path, "a shared-replay sweep")):
        assert main("laser", [f"resume={given}"]) == 2
        command = shell_command("recipes/laser_sweep.py", f"resume={tmp_path}")
        assert capsys.readouterr().err == (f"error: resume={given} is {what}, not a run of its own; resume the sweep "
                                           f"with: {command}\n")


def test_a_held_port_is_named_in_one_line_and_a_free_pair_is_found_otherwise(tmp_path):
    """Two ``mode=processes`` sweeps on one machine: a port given (and held by the other) is refused before any rank
    starts, naming the key; none given, each sweep finds two free consecutive ports of its own."""
    from acer_torchrl.shared_replay.sweep import rendezvous_port

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for given in (port, port - 1):  # gloo's port or RPC's (the next one) held
            with pytest.raises(ConfigError, match=rf"sweep.port={given}: 127.0.0.1:{port} cannot be listened on "
                                                  r"\(Address already in use\).* give another sweep.port"):
                run(["agents=2", "mode=processes", f"sweep.port={given}", f"run_dir={tmp_path}", *SMOKE])
        free = rendezvous_port(SweepConfig(mode="processes"))
        assert port not in (free, free + 1)
    assert not list(tmp_path.iterdir()), "refused before anything was written"


# ---------------------------------------------------------------------------------------------- 2 processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torso():
    torch.manual_seed(0)  # the same network in both processes
    info = EnvInfo(obs_shape=(OBS + 1,), obs_dtype=torch.float32, discrete=True, num_actions=2)
    return make_torso(info, [8], "tanh", lstm_hidden=HIDDEN)


def _rank(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed import rpc

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    shared = SharedReplay(EpisodeReplay(1000, seed=rank), n_agents=2) if rank == 0 else None
    serve(shared)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port + 1}", rpc_timeout=60)
    rpc.init_rpc(f"agent{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    handle = AgentReplay(shared if rank == 0 else RemoteReplay("agent0"), rank, 2, owner=rank == 0)
    for chunk in range(3):  # each process writes only its own agent's experience
        handle.extend(agent_batch(rank, [0, 1], start=8 * chunk, T=8, ends=chunk == 2, hidden=True))
    dist.barrier()
    sample = handle.sample_sequences(48, 6)
    seen = check_round_trip(sample)
    torso = _torso()
    with torch.no_grad(), set_recurrent_mode(True):
        handle.refresh_recurrent_state(sample, torso.module, torso.hidden_keys)  # prefixes over RPC
    gathered = [None, None]
    dist.all_gather_object(gathered, (sorted(seen), handle.sampled.tolist(), sample))
    if rank == 0:  # the owner recomputes the refreshed states of rank 1's sample from its local storage
        remote = gathered[1][2]
        local = remote.clone()
        with torch.no_grad(), set_recurrent_mode(True):
            shared.replay.refresh_recurrent_state(local, torso.module, torso.hidden_keys)
        same = all(torch.allclose(local[k][:, 0], remote[k][:, 0]) for k in torso.hidden_keys)
        moved = any(remote[k][:, 0].abs().sum() > 0 for k in torso.hidden_keys)
        report = {"seen": [g[0] for g in gathered], "sampled": [g[1] for g in gathered], "refresh_same": same,
                  "refresh_nonzero": bool(moved), "stored": shared.agent_counts()}
        with open(f"{out_dir}/report.json", "w") as f:
            json.dump(report, f)
    rpc.shutdown()
    serve(None)
    dist.destroy_process_group()


@pytest.mark.integration
def test_two_processes_share_one_replay_over_gloo_and_rpc(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["stored"] == [48, 48], "one storage (rank 0's) holds both agents' experience"
    assert report["seen"] == [[0, 1], [0, 1]], "each agent samples the other's data"
    assert all(min(counts) > 0 for counts in report["sampled"])
    assert report["refresh_same"] and report["refresh_nonzero"]


# ---------------------------------------------------------------------------------------------- end to end
SMOKE = [
    "preset=cartpole", "total_frames=256", "collector.workers=0", "collector.frames_per_batch=64",
    "replay.min_size=64", "eval.interval=128", "eval.episodes=1", "eval.max_steps=50", "log.checkpoint_interval=100000",
]


VRACER_SMOKE = [
    "loss=vracer", "preset=pendulum", "total_frames=256", "collector.workers=0", "collector.frames_per_batch=64",
    "replay.min_size=64", "eval.interval=128", "eval.episodes=1", "eval.max_steps=50", "log.checkpoint_interval=100000",
]


@pytest.mark.integration
def test_local_sweep_end_to_end(tmp_path):
    result = run(["agents=2", f"run_dir={tmp_path}", *SMOKE])
    assert [a["env_steps"] for a in result["agents"]] == [256, 256]
    assert result["shared_replay"]["stored_steps_by_agent"] == [256, 256]
    assert [(a["lr"], a["entropy_coeff"]) for a in result["agents"]] == [(0.5e-3, 0.005), (1e-3, 0.01)]
    for agent in result["agents"]:
        assert min(agent["replayed_share_by_agent"]) > 0, "every agent learns from both agents' data"
    for name in ("metrics.csv", "learning_curves.png", "summary.json"):
        assert (tmp_path / name).is_file()
    assert (tmp_path / "agent0" / "checkpoint" / "replay" / "links.pt").is_file()
    assert not (tmp_path / "agent1" / "checkpoint" / "replay" / "links.pt").exists()
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0]
    assert "agent1_eval_return_mean" in header and "best_eval_return_mean" in header
    for agent in result["agents"]:  # each agent's score is its final score, as its own summary gives it
        own = json.loads((Path(agent["run_dir"]) / "summary.json").read_text())
        assert [agent[k] for k in ("eval_return_mean", "final_score_evaluations", "final_score_from_step")] == [
            own[k] for k in ("eval_return_mean", "final_score_evaluations", "final_score_from_step")]
    # resumed once finished, it trains nothing and leaves its agents' files as they are (as a rank of mode=processes)
    agent_files = {p: p.read_bytes() for p in tmp_path.glob("agent*/**/*") if p.is_file() and p.name != "run.lock"}
    again = run([f"resume={tmp_path}"])
    assert {p: p.read_bytes() for p in agent_files} == agent_files
    assert [a["eval_return_mean"] for a in again["agents"]] == [a["eval_return_mean"] for a in result["agents"]]


@pytest.mark.integration
def test_a_local_sweeps_periodic_checkpoints_hold_every_agents_steps_in_the_shared_replay(tmp_path, monkeypatch):
    """Agent 0's checkpoint holds the shared replay: its periodic checkpoint is taken with every agent's, after a round,
    so that the replay it saves holds each agent's steps up to that agent's own checkpoint. (Taken inside agent 0's
    step, it lacked the round's batch of agent 1, which agent 1's checkpoint counted: a sweep killed with SIGKILL
    resumed with agent 1's last batch missing from the replay.)"""
    seen, taken = [], SweepAgentTrainer.periodic_checkpoint

    def periodic_checkpoint(self):
        taken(self)
        seen.append((self._shared_handle.agent_id, self.counters.env_steps, self._shared_handle.shared.agent_counts()))

    monkeypatch.setattr(SweepAgentTrainer, "periodic_checkpoint", periodic_checkpoint)
    run(["agents=2", f"run_dir={tmp_path}", *SMOKE[:-1], "total_frames=384", "log.checkpoint_interval=128"])
    assert [agent for agent, _, _ in seen] == [0, 1] * (len(seen) // 2) and len(seen) >= 4, seen
    assert all(counts == [steps, steps] for _, steps, counts in seen), seen


@pytest.mark.integration
def test_local_vracer_sweep_end_to_end(tmp_path):
    """V-RACER agents in a shared-replay sweep: each keeps its own estimates of everyone's steps (test_vracer.py
    checks them); here the pipeline: both collect, both learn from both agents' data, lr differs, no entropy."""
    result = run(["agents=2", f"run_dir={tmp_path}", *VRACER_SMOKE])
    assert [a["env_steps"] for a in result["agents"]] == [256, 256]
    assert result["shared_replay"]["stored_steps_by_agent"] == [256, 256]
    assert [(a["lr"], a["entropy_coeff"]) for a in result["agents"]] == [(0.5e-4, None), (1e-4, None)]
    for agent in result["agents"]:
        assert agent["updates"] > 0 and min(agent["replayed_share_by_agent"]) > 0, "learns from both agents' data"
    with pytest.raises(ConfigError, match="sweep.entropy_factors scales LASER's entropy cost; loss=vracer has none"):
        run(["agents=2", "loss=vracer", "sweep.entropy_factors=1", f"run_dir={tmp_path / 'x'}"])
    with pytest.raises(ConfigError, match="loss=acer: a shared-replay sweep trains LASER or V-RACER agents"):
        run(["agents=2", "loss=acer", f"run_dir={tmp_path / 'y'}"])


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("smoke", [SMOKE, VRACER_SMOKE], ids=["laser", "vracer"])
def test_process_sweep_end_to_end(tmp_path, smoke):
    """One process per agent: V-RACER's agents read the episode links and steps of rank 0's replay over RPC. A rank
    that fails (agent 1's checkpoint damaged, on resume) ends the sweep with one line naming it and its error."""
    from acer_torchrl.trainer import TrainingError

    result = run(["agents=2", "mode=processes", f"run_dir={tmp_path}", *smoke])  # on two free ports it finds
    assert [a["env_steps"] for a in result["agents"]] == [256, 256]
    assert 0 < result["sweep"]["port"] < 65535, "summary.json: the port the ranks met on"
    assert json.loads((tmp_path / "sweep.json").read_text())["port"] is None, "a resume finds free ports again"
    assert result["shared_replay"]["stored_steps_by_agent"] == [256, 256]
    for agent in result["agents"]:
        assert min(agent["replayed_share_by_agent"]) > 0
    (tmp_path / "agent1" / "checkpoint" / "state.pt").unlink()
    with pytest.raises(TrainingError, match=r"^sweep agent 1 failed: CheckpointError: checkpoint .* state.pt is missing"):
        run([f"resume={tmp_path}", "total_frames=320"])


@pytest.mark.integration
@pytest.mark.slow
def test_local_sweep_resumes_with_its_shared_replay(tmp_path):
    run(["agents=2", f"run_dir={tmp_path}", *SMOKE])
    result = run(["agents=2", f"resume={tmp_path}", "total_frames=384"])
    assert [a["env_steps"] for a in result["agents"]] == [384, 384]
    assert result["shared_replay"]["stored_steps_by_agent"] == [384, 384], "the replay came back from agent 0's checkpoint"
    assert [(a["lr"], a["entropy_coeff"]) for a in result["agents"]] == [(0.5e-3, 0.005), (1e-3, 0.01)]
    with pytest.raises(ConfigError, match="agents=3, but the sweep started with agents=2"):
        run(["agents=3", f"resume={tmp_path}"])


ROOT = Path(__file__).resolve().parents[1]
STOPPED_WITHIN_S = 20  # every process of a stopped sweep ends within this (a rank once lived to a 60 s kill timeout)


def start_sweep(sweep_dir: Path, mode: str, agents: int) -> subprocess.Popen:
    """``recipes/laser_sweep.py`` in a session of its own (as a terminal runs it), long enough to be stopped, with a
    periodic checkpoint every batch; its output (stdout and stderr, as a terminal shows them) piped."""
    smoke = [a for a in SMOKE if not a.startswith(("total_frames=", "log.checkpoint_interval="))]  # no key twice
    args = [sys.executable, str(ROOT / "recipes" / "laser_sweep.py"), f"agents={agents}", f"mode={mode}",
            f"run_dir={sweep_dir}", *smoke, "total_frames=100000", "log.checkpoint_interval=64"]
    return subprocess.Popen(args, cwd=sweep_dir.parent, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=os.environ)


def stopped(proc: subprocess.Popen, sig: int) -> tuple[int, str]:
    """Send ``sig`` to the sweep's process group; its exit code and last line once it and every process of its
    group (ranks, workers) ended, within :data:`STOPPED_WITHIN_S`, with nothing but a progress bar (in a log: its evaluation lines) and that line."""
    returncode, output, seconds = signal_group(proc, sig)
    deadline = time.monotonic() + 2
    while group_alive(proc.pid):
        assert time.monotonic() < deadline, "a process of the stopped sweep lives on"
        time.sleep(0.1)
    assert seconds < STOPPED_WITHIN_S, f"stopped after {seconds:.0f} s"
    progress = re.compile(r"step/s|^agent\d+: \d+/\d+ env steps, greedy return ")  # a bar, or a log's evaluation line
    noise = [line for line in output.replace("\r", "\n").splitlines()[:-1] if line.strip() and not progress.search(line)]
    assert not noise, output  # no traceback, no TorchRL INFO line, no gloo warning
    return returncode, output.strip().splitlines()[-1]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(("mode", "agents"), [("local", 1), ("processes", 2)])
def test_ctrl_c_on_a_sweep_says_what_each_agent_saved_and_how_to_resume(tmp_path, mode, agents):
    """Ctrl-C (SIGINT to the terminal's process group) on ``recipes/laser_sweep.py``: one line naming each agent's
    saved env steps and the sweep's resume command, which continues from them as printed (with any number of agents).
    ``local`` saves every agent after the batch in hand; ``processes`` keeps each rank's latest periodic checkpoint
    (its ranks end at the signal)."""
    from acer_torchrl.checkpoint import latest_checkpoint

    sweep_dir = tmp_path / "sweep"
    proc = start_sweep(sweep_dir, mode, agents)
    counters = [sweep_dir / f"agent{i}" / "checkpoint" / "counters.json" for i in range(agents)]
    wait_for(lambda: all(c.exists() for c in counters), proc, 120)
    returncode, line = stopped(proc, signal.SIGINT)
    steps = [json.loads((latest_checkpoint(sweep_dir / f"agent{i}") / "counters.json").read_text())["env_steps"]
             for i in range(agents)]
    command = shlex.join([sys.executable, str(ROOT / "recipes" / "laser_sweep.py"), f"resume={sweep_dir}"])
    assert (returncode, line) == (130, f"interrupted at {', '.join(map(str, steps))} env steps (agent by agent); "
                                       f"continue with: {command}")
    more = f"total_frames={max(steps) + 64}"
    resumed = subprocess.run(f"{command} {more}", shell=True, cwd=tmp_path, capture_output=True, text=True)  # as printed
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert [a["env_steps"] for a in summary["agents"]] == [max(steps) + 64] * agents
    assert summary["sweep"]["mode"] == mode, "the resumed sweep runs as it started"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "processes"])
def test_ctrl_c_in_a_sweeps_start_up_ends_it_at_once_in_one_line(tmp_path, mode):
    """Ctrl-C while the sweep starts (``local``: its agents being built; ``processes``: its ranks importing torch):
    every process ends within seconds, with one line and no traceback (a rank cut in its imports printed one)."""
    proc = start_sweep(tmp_path / "sweep", mode, 2)
    if mode == "local":
        wait_for((tmp_path / "sweep" / "agent0").exists, proc, 120)
    else:
        wait_for(lambda: len(spawned_children(proc.pid)) == 2, proc, 120)
        time.sleep(1)  # their interpreters up, their imports under way (seconds long)
    returncode, line = stopped(proc, signal.SIGINT)
    assert returncode == 130
    assert line in ("interrupted during start-up: nothing to save yet",
                    "interrupted before every agent had a checkpoint: nothing to resume")


class _ExitingRank:
    """A rank for :func:`first_failed_rank`: its sentinel ready at once, its exit code ``None`` for the first
    ``late`` readings and ``code`` after them (a process that closed its files before it could be waited for);
    with ``code=None`` a rank that runs on (a sentinel never ready)."""

    def __init__(self, code: int | None, late: int = 0):
        self._read, self._write = os.pipe()
        if code is not None:
            os.close(self._write)  # EOF: the sentinel is ready
        self.sentinel, self._code, self._late = self._read, code, late

    @property
    def exitcode(self) -> int | None:
        self._late -= 1
        return None if self._late >= 0 else self._code


def test_a_rank_whose_exit_code_comes_after_its_sentinel_still_ends_the_wait():
    """A sweep waited for ever, now and then, after a rank failed (the killed-worker test below): that rank's
    sentinel was ready, its exit code not yet, and by the next round the code was there but the rank was no longer
    waited on. The rank that failed is found, however late its exit code comes."""
    from acer_torchrl.shared_replay.sweep import first_failed_rank

    found = []
    ranks = [_ExitingRank(None), _ExitingRank(3, late=2)]
    waiting = threading.Thread(target=lambda: found.append(first_failed_rank(ranks)), daemon=True)
    waiting.start()
    waiting.join(timeout=10)
    assert found == [1]
    assert first_failed_rank([_ExitingRank(0, late=2), _ExitingRank(0)]) is None


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "processes"])
def test_a_killed_collector_worker_stops_a_sweep_with_the_sweeps_resume_command(tmp_path, mode):
    """SIGKILL to agent 1's collector worker, in one process or in agent 1's own (``mode=processes``): the sweep
    ends, every agent keeps a checkpoint, one line naming the worker and its agent and the sweep's resume command
    (not an agent's), exit code 3."""
    from acer_torchrl.checkpoint import latest_checkpoint

    root = Path(__file__).resolve().parents[1]
    args = [sys.executable, str(root / "recipes" / "laser_sweep.py"), "agents=2", f"mode={mode}", f"run_dir={tmp_path}",
            *SMOKE, "total_frames=100000", "collector.workers=1", "eval.background=false", "log.checkpoint_interval=64"]
    proc = subprocess.Popen(args, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=os.environ)
    counters = [tmp_path / f"agent{i}" / "checkpoint" / "counters.json" for i in (0, 1)]
    wait_for(lambda: all(c.exists() for c in counters), proc, 120)
    # the agents' workers, the last agent 1's (no evaluation process: eval.background=false); with processes, agent
    # 1's rank's
    agent1 = proc.pid if mode == "local" else sorted(spawned_children(proc.pid))[1]
    worker = spawned_children(agent1)[-1]
    os.kill(worker, signal.SIGKILL)
    stderr = captured(proc, timeout=60)
    steps = [json.loads((latest_checkpoint(tmp_path / f"agent{i}") / "counters.json").read_text())["env_steps"]
             for i in (0, 1)]
    assert proc.returncode == 3 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"agent 1's collector worker 0 (pid {worker}) died (killed by SIGKILL); stopped at {steps[0]}, {steps[1]} env "
        f"steps (agent by agent); continue with: "
        f"{shlex.join([sys.executable, str(root / 'recipes' / 'laser_sweep.py'), f'resume={tmp_path}'])}"
    )


def test_the_sweeps_resource_tracker_keeps_its_leaked_semaphore_warning_to_itself(tmp_path):
    """A process that starts the tracker as a processes-mode sweep does, then leaves semaphores behind (as a stopped
    rank's collectors do): the tracker unlinks them without the warning that followed the stop's one line."""
    script = tmp_path / "leak.py"
    script.write_text(
        "import os, multiprocessing as mp\n"
        "from acer_torchrl.shared_replay.sweep import quiet_resource_tracker\n"
        "quiet_resource_tracker()\n"
        "locks = [mp.get_context('spawn').Lock() for _ in range(3)]\n"
        "os._exit(0)\n"
    )
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "leaked semaphore" not in done.stderr, done.stderr
    plain = script.read_text().replace("quiet_resource_tracker()\n", "")
    script.write_text(plain)
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "leaked semaphore" in done.stderr  # what it keeps quiet
