"""The sweep driver (LASER sec. 5.1, 5.4): its keys (:class:`SweepConfig`), one config per agent, the agents'
trainers stepped in one process (:func:`run_sweep`) or one process per agent around rank 0's replay server
(:func:`run_sweep_rank`, :class:`SweepTask` under SLURM), and the sweep's results table and plot.

The agents are LASER's (``loss=laser``, the default) or V-RACER's (``loss=vracer``): a V-RACER agent keeps its
own stored estimates of every shared step beside the replay
(:class:`~acer_torchrl.estimates.slots.SlotEstimates`)."""

from __future__ import annotations

import contextlib
import copy
import csv
import json
import math
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import time
import typing
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import submitit
import torch
from tensordict import TensorDictBase

from acer_torchrl.commands import shell_command
from acer_torchrl.config import (
    Config, ConfigError, _coerce, config_notes, dump_yaml, load_config, override_value, parse_overrides, without_keys,
)
from acer_torchrl.envs import stacked_frames
from acer_torchrl.metrics import finish_plot, new_plot
from acer_torchrl.processes import (HELPER_DIED_EXIT_CODE, HelperDied, Interrupted, RunGuard, StopSignals,
                                   end_unfinished_helpers)
from acer_torchrl.replay import EpisodeReplay
from acer_torchrl.rundir import SWEEP_FILE, default_run_dir, make_writable_dir
from acer_torchrl.shared_replay.server import AgentReplay, RemoteReplay, SharedReplay, serve
from acer_torchrl.trainer import Trainer, available_cores
from acer_torchrl.validation import allowed, check_allowed

PEER_WAIT_S = 600  # how long an agent waits for the others' first experience (the RPC timeout too)
# how long a stopped sweep waits for a rank to end before it kills it: a rank stops at once where its Python runs,
# but one held in a C++ rendezvous (init_process_group / init_rpc waiting for a rank that stopped during its
# start-up) runs no signal handler; it has started no helper process yet, and nothing of it is lost
RANK_STOP_WAIT_S = 10


class SweepAgentTrainer(Trainer):
    """A :class:`Trainer` whose replay is its handle on the sweep's shared replay.

    With ``wait_for_peers`` (one process per agent), the first update from replay waits until every agent
    has stored experience: processes start at different speeds, and an agent that finished a short run
    before the others wrote anything would have learned from its own data only, not from a shared replay.
    (In one process the agents collect in turn, so the second round already samples everyone's data.)
    """

    def __init__(self, cfg: Config, replay: AgentReplay, wait_for_peers: bool = False):
        self._shared_handle = replay
        self._peers_pending = wait_for_peers
        super().__init__(cfg)

    def make_replay(self) -> AgentReplay:
        return self._shared_handle

    def start(self) -> Iterator[TensorDictBase]:
        return self._naming_this_agent(super().start())

    def _naming_this_agent(self, batches: Iterator[TensorDictBase]) -> Iterator[TensorDictBase]:
        """``batches``; a collector worker's death (:class:`HelperDied`) names this agent too: a sweep has one
        collector worker 0 per agent."""
        try:
            yield from batches
        except HelperDied as death:
            raise HelperDied(f"agent {self._shared_handle.agent_id}'s {death.what}") from None

    def draw_batch(self, online_share: float) -> TensorDictBase | None:
        if self._peers_pending and online_share < 1.0:
            self._wait_for_peers()
        return super().draw_batch(online_share)

    def _wait_for_peers(self) -> None:
        deadline = time.monotonic() + PEER_WAIT_S
        while 0 in (counts := self._shared_handle.shared.agent_counts()):
            if time.monotonic() > deadline:
                idle = [i for i, n in enumerate(counts) if n == 0]
                raise RuntimeError(f"sweep agents {idle} stored no experience within {PEER_WAIT_S} s; are their processes alive?")
            time.sleep(0.05)
        self._peers_pending = False


# ---------------------------------------------------------------------------------------------- sweep config
@allowed(agents="[1, 256]", mode=("local", "processes"), lr_factors="(0, inf)", entropy_factors="[0, inf)",
         port="[1, 65534]")
@dataclass
class SweepConfig:
    """The sweep's own keys (``agents=``, ``mode=``, ``sweep.<field>=``); every other key configures the agents.

    Agent ``i`` trains with ``optim.lr * lr_factors[a]`` and ``laser.entropy_coeff * entropy_factors[(a + d) % E]``
    with ``a = i % L``, ``d = i // L`` (the L x E grid walked diagonal by diagonal: 9 agents cover the paper's
    3 x 3 grid of sec. 5.1, and the first few differ in both factors), and seed ``seed + i``. V-RACER has no
    entropy cost: its agents differ in ``optim.lr`` and seed only. A resumed sweep keeps the keys it started with
    (``sweep.json``); given again, the grid's keys (:data:`FIXED_ON_RESUME`) must keep their values, the others
    apply to the resumed run.
    """

    agents: int = 3
    mode: str = "local"  # local: one process | processes: one process per agent (gloo + RPC)
    lr_factors: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])
    entropy_factors: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])
    master_addr: str = "127.0.0.1"  # mode=processes
    port: int | None = None  # mode=processes: gloo on port, RPC on port + 1 (none: two free ones, found at start)

    def validate(self) -> None:
        check_allowed(self, "sweep.")
        if not self.lr_factors or not self.entropy_factors:
            raise ConfigError("sweep.lr_factors and sweep.entropy_factors need at least one value each")

    def factors(self, i: int) -> tuple[float, float]:
        """Agent ``i``'s (lr factor, entropy factor): the grid walked diagonal by diagonal."""
        n_lr, n_ent = len(self.lr_factors), len(self.entropy_factors)
        i %= n_lr * n_ent  # more agents than grid points: the grid again, with other seeds
        a, diagonal = i % n_lr, i // n_lr
        return self.lr_factors[a], self.entropy_factors[(a + diagonal) % n_ent]


SHORT_KEYS = ("agents", "mode")  # sweep keys given without the ``sweep.`` prefix
FIXED_ON_RESUME = ("agents", "lr_factors", "entropy_factors")  # the agents and what each trains with


def sweep_key(name: str) -> str:
    """The command-line key of the :class:`SweepConfig` field ``name``."""
    return name if name in SHORT_KEYS else f"sweep.{name}"


def parse_sweep_args(argv: list[str]) -> tuple[SweepConfig, list[str]]:
    """Split ``key=value`` arguments into the sweep's own keys and the agents' config overrides. With
    ``resume=<sweep_dir>``, the sweep's keys are those it started with, changed by the ones given
    (:func:`resumed_sweep`)."""
    given, rest = _split_sweep_args(argv)
    sweep = SweepConfig(**given)
    sweep.validate()
    resume = override_value(rest, "resume")
    return (resumed_sweep(Path(resume), given) if resume else sweep), rest


def _split_sweep_args(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The sweep keys given in ``argv`` (by field name, coerced) and the other arguments."""
    hints = typing.get_type_hints(SweepConfig)
    given, rest = {}, []
    for item in argv:
        key, sep, value = item.partition("=")
        name = key.strip().removeprefix("sweep.")
        if sep and (key.strip().startswith("sweep.") or name in SHORT_KEYS):
            if name not in hints:
                valid = ", ".join(sweep_key(f.name) for f in fields(SweepConfig))
                raise ConfigError(f"unknown sweep key '{key.strip()}'; valid: {valid}")
            given[name] = _coerce(value.strip(), hints[name], key.strip())
        else:
            rest.append(item)
    return given, rest


def resumed_sweep(sweep_dir: Path, given: dict[str, Any]) -> SweepConfig:
    """The sweep saved in ``sweep_dir`` with the keys ``given`` again: the agents and their grid
    (:data:`FIXED_ON_RESUME`, what each agent's saved config was made from) must keep their values (a one-line
    :class:`ConfigError` otherwise); how the agents run (``mode``, address, port) takes the value given."""
    try:
        saved = SweepConfig(**json.loads((sweep_dir / SWEEP_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        raise ConfigError(f"resume={sweep_dir}: no readable {SWEEP_FILE} there (not a sweep directory?)") from None
    for name in FIXED_ON_RESUME:
        if name in given and given[name] != getattr(saved, name):
            key = sweep_key(name)
            raise ConfigError(
                f"resume={sweep_dir}: {key}={_show_value(given[name])}, but the sweep started with "
                f"{key}={_show_value(getattr(saved, name))}; its agents and their grid are fixed when it starts "
                f"(leave {key} out, or start a new sweep)"
            )
    return replace(saved, **{name: value for name, value in given.items() if name not in FIXED_ON_RESUME})


def _show_value(value: Any) -> str:
    """``value`` as it is typed on the command line (a list as ``a,b,c``)."""
    return ",".join(f"{v:g}" for v in value) if isinstance(value, list) else str(value)


def record_sweep_start(sweep: SweepConfig, sweep_dir: Path, overrides: list[str]) -> None:
    """``sweep_dir/sweep.json``: the sweep's keys, written when it starts, once its agents have claimed their run
    directories. A resumed sweep keeps the file (:func:`resumed_sweep` reads it) and appends the keys it runs with
    otherwise (``mode``, the port) to ``sweep_dir/resumes.jsonl``, with each agent's env steps then: the sweep's
    ``summary.json`` gives the last segment's alone."""
    if override_value(overrides, "resume") is None:
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(asdict(sweep), indent=2))
        return
    saved = json.loads((sweep_dir / SWEEP_FILE).read_text())
    changed = {key: {"from": saved.get(key), "to": value} for key, value in asdict(sweep).items()
               if saved.get(key) != value}
    if changed:
        with open(sweep_dir / "resumes.jsonl", "a") as f:
            steps = agent_checkpoint_steps(sweep, sweep_dir) or []
            f.write(json.dumps({"env_steps_by_agent": steps, "changed": changed}) + "\n")


PER_AGENT_KEYS = ("optim.lr", "laser.entropy_coeff", "seed")  # agent i's: base x its grid factors, base seed + i
SWEEP_LOSSES = {"laser": "LASER", "vracer": "V-RACER"}  # the losses whose agents can share one replay


def refuse_changed_base_values(given: dict[str, str], agent0: Config, sweep: SweepConfig, sweep_dir: Path) -> None:
    """A one-line :class:`ConfigError` when a resume gives a per-agent key (:data:`PER_AGENT_KEYS`) a base value other
    than the one the sweep started with (agent 0's value over its grid factor): the agents keep their saved values, so
    the new one would be recorded nowhere and applied nowhere. The same value (a requeued job passes its overrides
    again) is accepted."""
    lr_factor, ent_factor = sweep.factors(0)
    started = {"optim.lr": agent0.optim.lr / lr_factor, "seed": agent0.seed}
    if hasattr(agent0.algo, "entropy_coeff"):
        started["laser.entropy_coeff"] = agent0.algo.entropy_coeff / ent_factor
    for key, before in started.items():
        if key not in given:
            continue
        try:
            now = type(before)(given[key])
        except ValueError:
            now = given[key]
        if now != before and not (isinstance(now, float) and math.isclose(now, before, rel_tol=1e-9)):
            raise ConfigError(f"resume={sweep_dir}: {key}={given[key]}, but the sweep started with {key}={before:g}; "
                              "a sweep's base values are fixed when it starts (start a new sweep to change it)")


def agent_configs(sweep: SweepConfig, overrides: list[str]) -> tuple[Path, list[Config]]:
    """The sweep directory and one config per agent (its own run dir ``<sweep_dir>/agent<i>``).

    With ``resume=<sweep_dir>`` each agent's saved config is the base (other overrides, e.g. a larger
    ``total_frames``, apply on top) and each agent resumes from its own checkpoint; agent 0's holds the
    shared replay.
    """
    given = dict(parse_overrides(overrides))
    if given.get("resume"):
        sweep_dir = Path(given["resume"])
        # the keys the grid sets per agent (from the base values a requeued job passes again) stay as saved
        kept = ("resume", "run_dir", "preset", "loss", *PER_AGENT_KEYS)
        rest = without_keys(overrides, *kept)
        cfgs = []
        for i in range(sweep.agents):
            if not (sweep_dir / f"agent{i}" / "config.yaml").is_file():
                raise ConfigError(f"resume={sweep_dir}: no agent{i}/config.yaml there (the sweep has {sweep.agents} agents)")
            cfgs.append(load_config(None, [f"resume={sweep_dir / f'agent{i}'}", *rest]))  # the loss it was saved with
        refuse_changed_base_values(given, cfgs[0], sweep, sweep_dir)
        return sweep_dir, cfgs
    loss = given.get("loss", "laser")
    if loss not in SWEEP_LOSSES:
        raise ConfigError(f"loss={loss}: a shared-replay sweep trains {' or '.join(SWEEP_LOSSES.values())} agents "
                          f"(loss={'|'.join(SWEEP_LOSSES)})")
    if loss != "laser" and sweep.entropy_factors != SweepConfig().entropy_factors:
        raise ConfigError(f"sweep.entropy_factors scales LASER's entropy cost; loss={loss} has none (drop it)")
    base = load_config(loss, overrides)
    if base.replay.prioritized:
        raise ConfigError("replay.prioritized=true: a shared-replay sweep's replay draws uniformly; drop it")
    if base.replay.prefetch:
        raise ConfigError("replay.prefetch=true: a shared-replay sweep's agents draw through the shared replay, one "
                          "draw at a time; drop it")
    sweep_dir = Path(base.run_dir) if base.run_dir else default_run_dir(base, sweep=True)
    cfgs = []
    for i in range(sweep.agents):
        cfg = copy.deepcopy(base)
        lr_factor, ent_factor = sweep.factors(i)
        cfg.optim.lr = base.optim.lr * lr_factor
        if loss == "laser":
            cfg.algo.entropy_coeff = base.algo.entropy_coeff * ent_factor
        cfg.seed = base.seed + i
        cfg.run_dir = str(sweep_dir / f"agent{i}")
        cfg.log.progress = base.log.progress and i == 0  # lock-step agents: agent 0's bar is the sweep's
        cfg.validate()
        cfgs.append(cfg)
    return sweep_dir, cfgs


def _shared_storage(cfg: Config, sweep_dir: Path, n_agents: int) -> SharedReplay:
    scratch = sweep_dir / "replay_storage" if cfg.replay.memmap else None
    replay = EpisodeReplay(cfg.replay.capacity, scratch_dir=scratch, seed=cfg.seed, frame_stack=stacked_frames(cfg.env))
    return SharedReplay(replay, n_agents)


# ---------------------------------------------------------------------------------------------- one process
def run_sweep(sweep: SweepConfig, overrides: list[str], stop_signals: StopSignals | None = None) -> dict:
    """All agents in this process with one shared replay; one collected batch per agent per round. With
    ``stop_signals`` (installed), SIGINT / SIGTERM end the sweep after the batch in hand, every agent saved, and
    raise :class:`~acer_torchrl.processes.Interrupted` saying how to resume the sweep; so does an agent's collector
    worker that dies, with :class:`~acer_torchrl.processes.HelperDied`."""
    sweep_dir, cfgs = agent_configs(sweep, overrides)
    make_writable_dir(sweep_dir, "run_dir")
    shared = _shared_storage(cfgs[0], sweep_dir, len(cfgs))
    trainers = [
        SweepAgentTrainer(cfg, AgentReplay(shared, i, len(cfgs), owner=i == 0)) for i, cfg in enumerate(cfgs)
    ]
    record_sweep_start(sweep, sweep_dir, overrides)
    summaries = [trainer.finished_summary() for trainer in trainers]
    if None in summaries:
        summaries = train_agents(sweep, sweep_dir, trainers, stop_signals)
    else:  # a finished sweep resumed: its agents stay as they are (as a rank's own run does, RunGuard.train)
        for trainer in trainers:
            trainer.close()
    return write_sweep_results(
        sweep, sweep_dir, cfgs, summaries, [t.log.rows for t in trainers],
        [t.replay.sampled.tolist() for t in trainers], shared.agent_counts(),
    )


def train_agents(sweep: SweepConfig, sweep_dir: Path, trainers: list, stop_signals: StopSignals | None) -> list[dict]:
    """The agents trained in turn to their end (:meth:`RunGuard.train_in_turn`); a stop or a helper's death raised
    again with the sweep's own line (:func:`stop_line`)."""
    try:
        return RunGuard(stop_signals).train_in_turn(trainers)
    except Interrupted as stop:
        line = stop_line(sweep, sweep_dir)
        if agent_checkpoints(sweep, sweep_dir) is None:  # nothing to resume: no helper is waited for
            end_unfinished_helpers()
        raise Interrupted(stop.signum, line) from None
    except HelperDied as death:
        raise HelperDied(death.what, stop_line(sweep, sweep_dir, stopped="")) from None


def stop_line(sweep: SweepConfig, sweep_dir: Path, stopped: str = "interrupted ") -> str:
    """What a stopped sweep says (after ``stopped``): the env steps of each agent's latest checkpoint and the resume
    command, or that an agent has none, so the sweep cannot resume (:func:`sweep_resume_argv`)."""
    steps = agent_checkpoint_steps(sweep, sweep_dir)
    if steps is None:
        return f"{stopped}before every agent had a checkpoint: nothing to resume"
    return (f"{stopped}at {', '.join(map(str, steps))} env steps (agent by agent); continue with: "
            f"{shell_command('recipes/laser_sweep.py', f'resume={sweep_dir}')}")


# ---------------------------------------------------------------------------------------------- one rank per agent
def run_sweep_rank(
    sweep: SweepConfig, overrides: list[str], rank: int, world_size: int, master_addr: str, port: int,
    deaths: multiprocessing.connection.Connection | None = None,
) -> dict | None:
    """Agent ``rank`` of a sweep with one process per agent. Rank 0 holds and serves the replay; all ranks
    return after every agent finished; rank 0 returns the sweep summary, the others None. A helper of this rank
    that dies (:class:`HelperDied`, the agent saved) is sent to ``deaths`` (the parent's end, :func:`_rank_main`)
    before this rank leaves the RPC group, whose other ranks then fail as a consequence."""
    import torch.distributed as dist
    from torch.distributed import rpc

    if world_size != sweep.agents:
        raise ConfigError(f"agents={sweep.agents} but the job has {world_size} tasks: one task per agent")
    if override_value(overrides, "run_dir") is None and override_value(overrides, "resume") is None:
        raise ConfigError("a sweep with one process per agent needs run_dir=<sweep dir> fixed for all of them")
    sweep_dir, cfgs = agent_configs(sweep, overrides)
    cfg = cfgs[rank]
    # torch's own use of an API it deprecated (in init_rpc and all_gather_object), once per rank: not the user's
    warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
    # both rendezvous first, back to back, before anything that can fail or take long: a rank held in one waits in
    # C++, where it runs no signal handler, for a peer that may never come
    dist.init_process_group("gloo", init_method=f"tcp://{master_addr}:{port}", rank=rank, world_size=world_size)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{master_addr}:{port + 1}", rpc_timeout=PEER_WAIT_S)
    rpc.init_rpc(f"agent{rank}", rank=rank, world_size=world_size, rpc_backend_options=options)
    finished = False
    try:
        shared = None
        if rank == 0:
            make_writable_dir(sweep_dir, "run_dir")
            shared = _shared_storage(cfg, sweep_dir, world_size)
        handle = AgentReplay(shared if rank == 0 else RemoteReplay("agent0"), rank, world_size, owner=rank == 0)
        trainer = SweepAgentTrainer(cfg, handle, wait_for_peers=True)  # rank 0 restores the replay (resuming) ...
        if rank == 0:
            record_sweep_start(sweep, sweep_dir, overrides)
        serve(shared)  # ... before serving it: the others' calls wait until here
        # a SLURM task has its own share of cores (a rank on each of several nodes too); without SLURM
        # (mode=processes) every rank and its collector workers share this machine's
        share = available_cores() if "SLURM_CPUS_PER_TASK" in os.environ else available_cores() // world_size
        torch.set_num_threads(max(1, share - cfg.collector.workers))
        try:
            summary = trainer.train()
        except HelperDied as death:
            if deaths is not None:
                deaths.send(death.what)
            raise
        results = [None] * world_size
        dist.all_gather_object(results, (summary, trainer.log.rows, handle.sampled.tolist()))
        counts = shared.agent_counts() if rank == 0 else None
        finished = True
    finally:
        serve(None)  # (a call still waiting for a replay that will not come fails)
        # finished: wait until every rank is done with rank 0's replay; stopped or failed: wait for no one (the
        # others may be gone, and a graceful shutdown would wait for them up to the RPC timeout)
        rpc.shutdown(graceful=finished)
        dist.destroy_process_group()
    if rank != 0:
        return None
    summaries, rows, sampled = (list(x) for x in zip(*results))
    ran = replace(sweep, port=port)  # what ran: the port picked when none was given (sweep.json keeps none: pick again)
    return write_sweep_results(ran, sweep_dir, cfgs, summaries, rows, sampled, counts)


@contextlib.contextmanager
def ranks_start_ignoring_sigint():
    """SIGINT ignored while ranks are started: they inherit that through their ``exec`` and keep it until their
    own handlers are in place (:func:`_rank_main`), so that a Ctrl-C on the terminal does not cut a rank's
    start-up (its imports) into a KeyboardInterrupt traceback; the parent relays a stop to them with SIGTERM
    (:func:`stop_ranks`). A Ctrl-C within the milliseconds these starts take is not seen."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _rank_main(rank: int, sweep: SweepConfig, overrides: list[str], port: int,
               deaths: multiprocessing.connection.Connection) -> None:
    """One rank of :func:`run_sweep_processes`; a stop signal ends it where it is, quietly (its latest periodic
    checkpoint stays, and the parent says what was saved), as a helper's death does with exit code
    :data:`~acer_torchrl.processes.HELPER_DIED_EXIT_CODE` (sent to the parent on ``deaths``, which says it)."""
    from acer_torchrl.cli import quiet_libraries

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    quiet_libraries()
    stops = StopSignals().install()  # SIGINT was ignored until here (ranks_start_ignoring_sigint)
    try:
        run_sweep_rank(sweep, overrides, rank, sweep.agents, sweep.master_addr, port, deaths)
    except Interrupted:
        pass
    except HelperDied:
        sys.exit(HELPER_DIED_EXIT_CODE)  # (a SystemExit: torch's spawn wrapper passes it on, with no traceback)
    finally:
        stops.restore()


def run_sweep_processes(sweep: SweepConfig, overrides: list[str]) -> dict:
    """One process per agent on this machine (the layout of a SLURM job with one task per agent); a rank that
    fails ends the sweep with one line naming it (:class:`~acer_torchrl.trainer.TrainingError`), one whose helper
    died with one line naming the helper and the agent and the sweep's resume command
    (:class:`~acer_torchrl.processes.HelperDied`)."""
    import torch.multiprocessing as mp

    from acer_torchrl.trainer import TrainingError

    sweep_dir, _ = agent_configs(sweep, overrides)  # configuration errors surface here, before any process starts
    if not override_value(overrides, "resume"):
        overrides = [*without_keys(overrides, "run_dir"), f"run_dir={sweep_dir}"]  # one sweep directory for every rank
    port = rendezvous_port(sweep)
    # the ranks' C++ warnings (TensorPipe's, of the connections a stopping rank closes) off unless asked for
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    ranks = None
    deaths, ranks_deaths = mp.get_context("spawn").Pipe(duplex=False)
    quiet_resource_tracker()
    try:
        with ranks_start_ignoring_sigint():
            ranks = mp.start_processes(_rank_main, args=(sweep, overrides, port, ranks_deaths), nprocs=sweep.agents,
                                       join=False, start_method="spawn")
        failed = first_failed_rank(ranks.processes)
    except Interrupted as stop:  # (installed stop signals) the ranks end at once, keeping their periodic checkpoints
        stop_ranks(ranks.processes if ranks else [])
        raise Interrupted(stop.signum, stop_line(sweep, sweep_dir)) from None
    if failed is not None:
        stop_ranks(ranks.processes)
        if deaths.poll():  # a helper's death, which the other ranks' failures follow (whichever ended first)
            raise HelperDied(deaths.recv(), stop_line(sweep, sweep_dir, stopped=""))
        failed = failed_of_itself(ranks, failed)
        raise TrainingError(f"sweep agent {failed} failed: {rank_error(ranks, failed)}")
    return json.loads((sweep_dir / "summary.json").read_text())  # rank 0 wrote it


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (the ranks it spawns share it) with its "leaked semaphore" warning
    off. A stopped rank leaves its collectors' queue semaphores to the tracker, which unlinks them as it should, but
    its warning came after the stop's one line (seen under Ctrl-C). A tracker already running keeps its settings."""
    from multiprocessing import resource_tracker

    option = "ignore:resource_tracker:UserWarning"  # passed to the tracker's interpreter as -W
    if option not in sys.warnoptions:
        sys.warnoptions.append(option)
    resource_tracker.ensure_running()


PEER_GONE = "Connection closed by peer"  # gloo's error in a rank whose peer ended first


def failed_of_itself(ranks, first: int) -> int:
    """The rank to name for a failed sweep, once every rank ended: one whose error is its own, not the lost connection
    to a peer that failed first (a rank that ends closes its sockets during its teardown, so the peer's consequent
    error can end that peer sooner); ``first`` (the first rank seen failed) when none is."""
    own = [i for i, rank in enumerate(ranks.processes) if rank.exitcode not in (0, None)
           and has_error(ranks, i) and PEER_GONE not in rank_error(ranks, i)]
    return own[0] if own else first


def first_failed_rank(ranks: list) -> int | None:
    """Wait until every rank ended (None) or one failed (its index: the others still run).

    A rank's sentinel is ready as its process closes its files, which can come well before its exit code (a rank
    tearing down its RPC threads): the exit codes are read once a round, so a rank that failed between two readings
    is not left out of both (a sweep then waited for ever on the ranks still training)."""
    while True:
        codes = [rank.exitcode for rank in ranks]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            return failed[0]
        alive = {rank.sentinel: rank for rank, code in zip(ranks, codes) if code is None}
        if not alive:
            return None
        if all(alive[sentinel].exitcode is None for sentinel in multiprocessing.connection.wait(list(alive))):
            time.sleep(0.05)  # closing, no exit code yet


def rank_error(ranks, i: int) -> str:
    """Rank ``i``'s error, ``<exception class>: <message>`` (the last line of the traceback that torch's spawn
    wrapper pickles into the rank's error file), or how the rank ended."""
    if not has_error(ranks, i):
        return f"exit code {ranks.processes[i].exitcode}"
    kind, _, message = pickle.loads(Path(ranks.error_files[i]).read_bytes()).strip().splitlines()[-1].partition(": ")
    return f"{kind.rpartition('.')[2]}: {message}"


def has_error(ranks, i: int) -> bool:
    """Whether rank ``i`` ended on an exception (torch's spawn wrapper wrote it to the rank's error file)."""
    path = Path(ranks.error_files[i])
    return path.is_file() and path.stat().st_size > 0


def stop_ranks(ranks: list) -> None:
    """SIGTERM to every rank still running (a signal to this process alone reaches them here), and their end; a
    rank alive :data:`RANK_STOP_WAIT_S` later is killed (a checkpoint it was writing is not swapped in: the
    previous one stays)."""
    for rank in ranks:
        if rank.is_alive():
            os.kill(rank.pid, signal.SIGTERM)
    deadline = time.monotonic() + RANK_STOP_WAIT_S
    for rank in ranks:
        rank.join(timeout=max(0.0, deadline - time.monotonic()))
        if rank.is_alive():
            rank.kill()


def rendezvous_port(sweep: SweepConfig) -> int:
    """The port the ranks meet on (gloo; RPC on the next one): ``sweep.port`` when both are free on
    ``sweep.master_addr`` (a one-line :class:`ConfigError` naming the key otherwise), else two free ones."""
    if sweep.port is not None:
        busy = _busy(sweep.master_addr, sweep.port) or _busy(sweep.master_addr, sweep.port + 1)
        if busy:
            raise ConfigError(f"sweep.port={sweep.port}: {sweep.master_addr}:{busy} (another sweep on this machine?); "
                              "give another sweep.port, or leave it out to use two free ports")
        return sweep.port
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind((sweep.master_addr, 0))
            port = probe.getsockname()[1]
        if port < 65535 and not _busy(sweep.master_addr, port) and not _busy(sweep.master_addr, port + 1):
            return port
    raise ConfigError(f"no two free consecutive ports on {sweep.master_addr}; give them with sweep.port=")


def _busy(addr: str, port: int) -> str | None:
    """Why ``addr:port`` cannot be listened on (``"<port> cannot be listened on (<reason>)"``), or None."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the ranks' stores listen: TIME_WAIT is no bar
        try:
            probe.bind((addr, port))
        except OSError as err:
            return f"{port} cannot be listened on ({err.strerror})"
    return None


def agent_checkpoints(sweep: SweepConfig, sweep_dir: Path) -> list[Path] | None:
    """Each agent's latest checkpoint in ``sweep_dir``; None unless every agent has one."""
    from acer_torchrl.checkpoint import CheckpointError, latest_checkpoint

    try:
        return [latest_checkpoint(sweep_dir / f"agent{i}") for i in range(sweep.agents)]
    except CheckpointError:
        return None


def agent_checkpoint_steps(sweep: SweepConfig, sweep_dir: Path) -> list[int] | None:
    """The env steps of each agent's latest checkpoint (:func:`agent_checkpoints`); None unless every agent has one."""
    saved = agent_checkpoints(sweep, sweep_dir)
    return None if saved is None else [json.loads((c / "counters.json").read_text())["env_steps"] for c in saved]


class SweepTask(submitit.helpers.Checkpointable):
    """What each task of a SLURM job runs (submit with ``tasks_per_node * nodes == agents``): the sweep's
    agent of this task's rank, rendezvous from :func:`acer_torchrl.cluster.job_rank_info`.

    Like :class:`acer_torchrl.cluster.RecipeJob`, it survives preemption: submitit's signal (handled by
    rank 0) requeues the job through :meth:`checkpoint` after every agent checkpointed the batch in hand, and an
    external requeue restarts it with ``SLURM_RESTART_COUNT > 0``; either way every agent resumes from its latest
    checkpoint in the sweep directory (agent 0's holds the shared replay), once all agents have one.
    """

    def __call__(self, argv: list[str]) -> dict | None:
        from acer_torchrl.cluster import job_rank_info, requeued

        if requeued():
            argv = sweep_resume_argv(argv)
        sweep, overrides = parse_sweep_args(argv)
        rank, world_size, master_addr, port = job_rank_info()
        return run_sweep_rank(sweep, overrides, rank, world_size, master_addr, port)

    def checkpoint(self, argv: list[str]) -> submitit.helpers.DelayedSubmission:
        return submitit.helpers.DelayedSubmission(self, sweep_resume_argv(argv))


def sweep_resume_argv(argv: list[str]) -> list[str]:
    """``argv`` resuming its sweep directory (``resume=<sweep_dir>``) when every agent there has a
    checkpoint; unchanged otherwise (a requeue before the first checkpoints starts afresh)."""
    from acer_torchrl.cluster import required_run_dir

    sweep, _ = parse_sweep_args(argv)
    sweep_dir = Path(override_value(argv, "resume") or required_run_dir(argv))
    if agent_checkpoints(sweep, sweep_dir) is None:
        return list(argv)
    return without_keys(argv, "resume", "run_dir") + [f"resume={sweep_dir}"]


def run(argv: list[str], stop_signals: StopSignals | None = None) -> dict:
    """The sweep of ``argv``. With stop signals installed (the command line), SIGINT / SIGTERM stop it with one line:
    a ``mode=local`` sweep (given ``stop_signals``) saves every agent first, ``mode=processes`` keeps the agents'
    periodic checkpoints."""
    sweep, overrides = parse_sweep_args(argv)
    for note in config_notes(agent_configs(sweep, overrides)[1][0], overrides):  # the same for every agent
        print(note, file=sys.stderr)
    if sweep.mode == "local":
        return run_sweep(sweep, overrides, stop_signals)
    return run_sweep_processes(sweep, overrides)


# ---------------------------------------------------------------------------------------------- results
def write_sweep_results(
    sweep: SweepConfig,
    sweep_dir: Path,
    cfgs: list[Config],
    summaries: list[dict],
    rows: list[list[dict]],
    sampled: list[list[int]],
    stored: list[int] | None,
) -> dict:
    """``<sweep_dir>/metrics.csv`` (each agent's greedy return and the pointwise best, as the paper reports
    sweeps: sec. A.3), ``learning_curves.png``, ``summary.json`` and the sweep's config."""
    curves = []
    for agent_rows in rows:
        pts = {int(r["env_steps"]): r["eval_return_mean"] for r in agent_rows if "eval_return_mean" in r}
        curves.append(pts)
    steps = sorted(set().union(*curves))
    table = []
    for s in steps:
        row: dict[str, Any] = {"env_steps": s}
        values = {i: c[s] for i, c in enumerate(curves) if s in c}
        for i in range(len(cfgs)):
            row[f"agent{i}_eval_return_mean"] = values.get(i, "")
        best = max(values, key=values.get)
        row["best_eval_return_mean"], row["best_agent"] = values[best], best
        table.append(row)
    with (sweep_dir / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]) if table else ["env_steps"])
        writer.writeheader()
        writer.writerows(table)
    agents = []
    for i, (cfg, summary) in enumerate(zip(cfgs, summaries)):
        total = max(sum(sampled[i]), 1)
        agents.append(
            {
                "agent": i,
                "lr": cfg.optim.lr,
                "entropy_coeff": getattr(cfg.algo, "entropy_coeff", None),  # LASER's
                "seed": cfg.seed,
                "eval_return_mean": summary["eval_return_mean"],  # its final score (metrics.final_score)
                "final_score_evaluations": summary["final_score_evaluations"],
                "final_score_from_step": summary["final_score_from_step"],
                "env_steps": summary["env_steps"],
                "updates": summary["updates"],
                "replayed_share_by_agent": [round(n / total, 4) for n in sampled[i]],
                "run_dir": summary["run_dir"],
            }
        )
    best = max(agents, key=lambda a: a["eval_return_mean"])
    result = {
        "sweep_dir": str(sweep_dir),
        "agents": agents,
        "best_agent": best["agent"],
        "best_eval_return_mean": best["eval_return_mean"],
        "env_steps_total": sum(a["env_steps"] for a in agents),
        "wall_time_s": max(s["wall_time_s"] for s in summaries),
        "shared_replay": {"capacity": cfgs[0].replay.capacity, "stored_steps_by_agent": stored},
        "sweep": asdict(sweep),
    }
    (sweep_dir / "summary.json").write_text(json.dumps(result, indent=2))
    dump_yaml(cfgs[0], sweep_dir / "agent0_config.yaml")
    _plot(curves, table, sweep_dir / "learning_curves.png", cfgs)
    return result


def _plot(curves: list[dict], table: list[dict], path: Path, cfgs: list[Config]) -> None:
    fig, ax = new_plot((7, 4.5))
    for i, (curve, cfg) in enumerate(zip(curves, cfgs)):
        xs = sorted(curve)
        label = f"agent {i}: lr {cfg.optim.lr:.2g}" + (f", entropy {cfg.algo.entropy_coeff:.2g}" if cfg.loss == "laser" else "")
        ax.plot(xs, [curve[x] for x in xs], alpha=0.6, label=label)
    if table:
        ax.plot([r["env_steps"] for r in table], [r["best_eval_return_mean"] for r in table], "k--", lw=2,
                label="best agent (pointwise)")
    finish_plot(fig, ax, path, f"{SWEEP_LOSSES[cfgs[0].loss]} shared-replay sweep on {cfgs[0].env.name}", "env steps (per agent)",
                "greedy return", legend_size=7)
