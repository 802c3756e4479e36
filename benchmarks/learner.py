"""Learner speed against its compute floor, per preset, in one run (issue 19); and where the learner's time goes.

    python benchmarks/learner.py [--only acer:cartpole vracer:mujoco ...] [--frames N] [--rounds 3] [--out FILE]
    python benchmarks/learner.py update <algo> <preset> [--updates 300] [--store] [--wrap] [--profile] [key=value ...]
    python benchmarks/learner.py devices <algo> <preset> [--devices cuda cpu] [--updates 200] [--out rows.json] ...
    python benchmarks/learner.py phase <run dir> [more run dirs] [--from 25000]
    python benchmarks/learner.py same-numbers <algo> <preset> [--updates 1500] [key=value ...]
    python benchmarks/learner.py pieces <algo> <preset> [--rounds 10] [--updates 50] [--only PIECE ...] [key=value ...]
    python benchmarks/learner.py pfrl --site <dir with pfrl 0.4.0 and gym> [--frames 10000] [--rounds 2]

``update`` (the CPU time of one update), ``devices`` (updates/s on each device), ``phase`` (env steps/s of runs
once learning), ``same-numbers`` (a speed-up changed no number), ``pieces`` (what each speed-only piece buys) and
``pfrl`` (ACER CartPole's env steps/s against pfrl's ACER) are told in their functions' docstrings
(``--help`` prints them). With no such word first, the end-to-end comparison with the floor:

For each preset, one after the other on the same cores:

(b) **end to end**: the recipe (``recipes/<algo>.py preset=<p> total_frames=<N>``) in its own process, as a
    user runs it (collector workers, learner, greedy evaluations); env steps, gradient steps and wall seconds
    of its training loop from ``summary.json`` (process start-up excluded);
(a) **the floor**, measured in this process right after: the same gradient steps and env steps done bare,
    -- the preset's encoder (and its LSTM cores) with one linear head per core, as plain torch modules, on
      batches of the preset's shape ``[replay.batch_size, seq_len]``: forward, a squared loss of the output's
      size, backward, Adam step, with the learner's thread count; timed over ``--floor-updates`` steps and
      scaled to (b)'s gradient steps;
    -- a plain gymnasium loop (random actions, one process) over the same env, timed and scaled to (b)'s
      env steps;
    floor env steps/s = env steps / (gradient steps x s per bare step + env steps x s per bare env step);
(c) (b) / (a);
(d) what stands in the way, measured in the same run: the learner process's CPU seconds per wall second of (b)
    (``summary.json``'s ``learner_cpu_per_wall_s``: ~1 when the run waits on the learner, well below when the
    learner waits for batches), and **acting alone**: the preset's collector (same workers, envs, policy and
    batch size) iterated with no learner for ``--acting-frames`` env steps, env steps/s. Acting alone below
    0.5 x the floor's env steps/s means the workers by themselves keep the preset under the target.

The floor leaves out what a loss needs beyond one forward-backward (target / average networks, bootstrap
values, the trust region), acting in the workers and evaluation: it is a lower bound on the work, so
(c) = 1 is out of reach and 0.5 is the target. Prints a markdown table for ``results/learner.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import csv
import datetime
import hashlib
import importlib.metadata
import itertools
import json
import os
import platform
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import torch
from tensordict import TensorDictBase
from tensordict.nn import ProbabilisticTensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import IndependentNormal

from acer_torchrl.config import load_config
from acer_torchrl.envs import env_info
from acer_torchrl.modules import BehaviourSampler, TruncatedGaussian, make_encoder
from acer_torchrl.objectives.functional import truncated_normal_log_prob
from acer_torchrl.objectives.names import BEHAVIOUR
from acer_torchrl.objectives.network_call import NetworkCall
from acer_torchrl.objectives.refer import gaussian_kl
from acer_torchrl.objectives.updaters import FusedHardUpdate, FusedSoftUpdate
from acer_torchrl.replay import TRAJ_KEY
from acer_torchrl.settings import get_algorithm
from acer_torchrl.trainer import Trainer, learner_threads
from throughput import plain_loop  # benchmarks/throughput.py: the plain gymnasium loop

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# (algo, preset, overrides, env steps of the end-to-end run)
PRESETS = {
    "acer:cartpole": ("acer", "cartpole", [], 50_000),  # the whole default recipe (`make train`)
    "acer:pendulum": ("acer", "pendulum", [], 20_000),
    "laser:cartpole": ("laser", "cartpole", [], 20_000),
    "reactor:cartpole": ("reactor", "cartpole", [], 20_000),
    "reactor:cartpole_pomdp": ("reactor", "cartpole_pomdp", [], 10_000),
    "vracer:mujoco": ("vracer", "mujoco", ["env.name=Hopper-v5"], 20_000),  # learns after its 10 000-step warm-up
    # the MinAtar presets too learn after replay.min_size = 10 000 steps
    "acer:minatar": ("acer", "minatar", [], 30_000),
    "laser:minatar": ("laser", "minatar", [], 30_000),
    "reactor:minatar": ("reactor", "minatar", [], 30_000),
}


class FloorNetwork(nn.Module):
    """The preset's encoder, then (with ``network.lstm``) ``cores`` LSTMs side by side, each with a linear
    head of ``out`` units; without LSTMs one head on the encoder."""

    def __init__(self, cfg, info, cores: int, out: int):
        super().__init__()
        net = cfg.network
        self.encoder = make_encoder(info, net.hidden, net.activation)
        width = self.encoder.out_dim
        self.lstms = nn.ModuleList(
            [nn.LSTM(width, net.lstm_hidden, batch_first=True) for _ in range(cores)] if net.lstm else []
        )
        widths = [net.lstm_hidden] * cores if net.lstm else [width]
        self.heads = nn.ModuleList([nn.Linear(w, out) for w in widths])

    def forward(self, obs: torch.Tensor) -> list[torch.Tensor]:
        batch, time_ = obs.shape[:2]
        embed = self.encoder(obs.flatten(0, 1)).unflatten(0, (batch, time_))
        cores = [lstm(embed)[0] for lstm in self.lstms] or [embed]
        return [head(core) for head, core in zip(self.heads, cores)]


def floor_seconds_per_update(cfg, info, cores: int, seq_len: int, updates: int) -> float:
    """Seconds of one bare gradient step (forward, squared loss, backward, Adam) on the preset's batch."""
    out = info.num_actions if info.discrete else 2 * info.action_dim
    net = FloorNetwork(cfg, info, cores, out)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    shape = (cfg.replay.batch_size, seq_len, *info.obs_shape)
    obs = torch.randint(0, 2, shape, dtype=torch.uint8) if info.obs_dtype == torch.uint8 else torch.randn(shape)

    def step() -> None:
        loss = sum(y.square().mean() for y in net(obs))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(10):  # warm-up
        step()
    start = time.perf_counter()
    for _ in range(updates):
        step()
    return (time.perf_counter() - start) / updates


def end_to_end(algo: str, preset: str, overrides: list[str], frames: int) -> dict:
    """The recipe as a user runs it, in its own process; its summary.json."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, str(ROOT / "recipes" / f"{algo}.py"), f"preset={preset}", *overrides,
               f"total_frames={frames}", f"run_dir={run_dir}", "log.progress=false"]
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        return json.loads((run_dir / "summary.json").read_text())


def acting_alone(algo: str, preset: str, overrides: list[str], frames: int) -> float:
    """Env steps/s of the preset's collector with no learner: what acting alone allows end to end."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(algo, [f"preset={preset}", *overrides, f"run_dir={tmp}/run", "log.progress=false"])
        trainer = Trainer(cfg)
        collector = trainer.make_collector(10**12)
        batches = iter(collector)
        steps = next(batches).numel()  # the workers are up
        start = time.perf_counter()
        while steps < frames:
            steps += next(batches).numel()
        rate = steps / (time.perf_counter() - start)
        collector.shutdown()
        return rate


def measure(name: str, frames: int | None, floor_updates: int, env_seconds: float, acting_frames: int) -> dict:
    algo, preset, overrides, default_frames = PRESETS[name]
    frames = frames or default_frames
    e2e = end_to_end(algo, preset, overrides, frames)
    cfg = load_config(algo, [f"preset={preset}", *overrides])
    info = env_info(cfg.env)
    agent = get_algorithm(algo).build(cfg, info)
    torch.set_num_threads(learner_threads(cfg))
    s_update = floor_seconds_per_update(cfg, info, max(len(agent.torsos), 1), cfg.replay.seq_len, floor_updates)
    env_rate, _ = plain_loop(cfg.env.name, env_seconds)
    acting = acting_alone(algo, preset, overrides, acting_frames)
    steps, updates, wall = e2e["env_steps"], e2e["updates"], e2e["wall_time_s"]
    floor_s = updates * s_update + steps / env_rate
    row = {
        "preset": name,
        "env": cfg.env.name,
        "env_steps": steps,
        "updates": updates,
        "batch": [cfg.replay.batch_size, cfg.replay.seq_len],
        "wall_s": wall,
        "env_steps_per_s": steps / wall,
        "updates_per_s": updates / wall,
        "floor_ms_per_update": 1e3 * s_update,
        "floor_env_steps_per_s_plain_env": env_rate,
        "floor_s": floor_s,
        "floor_env_steps_per_s": steps / floor_s,
        "ratio": floor_s / wall,
        "learner_cpu_per_wall_s": e2e["learner_cpu_per_wall_s"],
        "acting_alone_env_steps_per_s": acting,
        "final_score": e2e["eval_return_mean"],
    }
    print(json.dumps(row), flush=True)
    return row


def markdown(rows: list[dict]) -> str:
    head = ("| preset | env steps | gradient steps (batch) | end to end: env steps/s, updates/s | floor: ms/update, "
            "plain env steps/s | floor env steps/s | ratio | learner CPU-s per s | acting alone: env steps/s "
            "(x floor) |\n|---|---|---|---|---|---|---|---|---|")
    lines = [
        f"| {r['preset']} ({r['env']}) | {r['env_steps']} | {r['updates']} ({r['batch'][0]} x {r['batch'][1]}) | "
        f"{r['env_steps_per_s']:.0f}, {r['updates_per_s']:.1f} | {r['floor_ms_per_update']:.2f}, "
        f"{r['floor_env_steps_per_s_plain_env']:.0f} | {r['floor_env_steps_per_s']:.0f} | {r['ratio']:.2f} | "
        f"{r['learner_cpu_per_wall_s']:.2f} | {r['acting_alone_env_steps_per_s']:.0f} "
        f"({r['acting_alone_env_steps_per_s'] / r['floor_env_steps_per_s']:.2f}) |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def floor_comparison(argv: list[str]) -> None:
    """The end-to-end comparison of the presets with their floor (the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(PRESETS), default=list(PRESETS), metavar="ALGO:PRESET")
    parser.add_argument("--frames", type=int, default=None, help="env steps of every end-to-end run")
    parser.add_argument("--floor-updates", type=int, default=1000, help="bare gradient steps timed per preset (a few "
                        "seconds: a fraction of a second is at the mercy of a shared machine's moment)")
    parser.add_argument("--env-seconds", type=float, default=5.0, help="seconds of the plain gymnasium loop")
    parser.add_argument("--acting-frames", type=int, default=10_000, help="env steps of the acting-alone run")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every preset this many times over (each round its run, then its floor): on a "
                             "machine whose speed drifts, the median of the rounds' ratios is the figure")
    parser.add_argument("--out", type=Path, default=RESULTS / "learner.json")
    args = parser.parse_args(argv)
    rows = [measure(name, args.frames, args.floor_updates, args.env_seconds, args.acting_frames)
            for _ in range(args.rounds) for name in args.only]
    medians = {name: statistics.median(r["ratio"] for r in rows if r["preset"] == name) for name in args.only}
    machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    record = {"date": datetime.date.today().isoformat(), "machine": machine, "command": " ".join(sys.argv),
              "rows": rows, "median_ratio": medians}
    args.out.write_text(json.dumps(record, indent=2))
    print(f"\n{machine}, {record['date']}: `python {' '.join(sys.argv)}`\n")
    print(markdown(rows))
    print("\nmedian ratio over the rounds: " + ", ".join(f"{name} {ratio:.2f}" for name, ratio in medians.items()))


def restored(recorded: list[TensorDictBase]) -> Iterator[TensorDictBase]:
    """``recorded`` batches over and over, each pass under trajectory ids no earlier pass used (new episodes)."""
    shift = 1 + max(int(b.get(TRAJ_KEY).max()) for b in recorded)
    for n in itertools.count(1):
        for batch in recorded:
            batch = batch.clone()
            batch.set(TRAJ_KEY, batch.get(TRAJ_KEY) + n * shift)
            yield batch


def update_cost(argv: list[str]) -> None:
    """CPU time of one learner update (drawing the batch, then the loss, backward, optimiser and the loss's
    write-backs) on a filled replay, with no collector running: where the end-to-end figure's learner time goes.

        python benchmarks/learner.py update vracer mujoco --updates 300 env.name=HalfCheetah-v5 replay.min_size=150000

    Fills the replay to ``replay.min_size`` (+500) steps with the preset's acting policy in-process, then times
    ``--updates`` updates of the trainer (one thread, ``time.process_time``). With ``--store`` newly collected
    batches are stored between them as in a run (``Trainer.store``, then the loss's ``update_plan``): what a
    loss rebuilds after the replay grows (V-RACER's eq. 8 tree) is counted, acting is not. ``--wrap`` fills the
    replay past its capacity instead, a long run's steady state in which every stored batch evicts episodes: 2^15
    collected steps are stored again and again under new trajectory ids (acting 2^18 steps in one thread would take
    ~25 min), and so are the batches stored between timed updates (with ``--store``).
    ``--profile`` prints cProfile's top entries instead of timing plainly (cProfile inflates Python-heavy parts
    several-fold).

        python benchmarks/learner.py update vracer mujoco --wrap --store --updates 2000 env.name=Hopper-v5
    """
    parser = argparse.ArgumentParser(prog="learner.py update", description=update_cost.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("preset")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--store", action="store_true", help="store collected batches between updates, as in a run")
    parser.add_argument("--wrap", action="store_true", help="fill the replay past its capacity (see above)")
    args, overrides = parser.parse_known_args(argv)
    run_dir = tempfile.mkdtemp()
    cfg = load_config(args.algo, [f"preset={args.preset}", "collector.workers=0", f"run_dir={run_dir}/run",
                                  "log.progress=false", *overrides])
    trainer = Trainer(cfg)
    torch.set_num_threads(1)  # acting at batch 1 with two threads is ~5x slower on a loaded 2-core machine
    collector = trainer.make_collector(10**12)
    batches = iter(collector)
    if args.wrap:
        recorded = []
        while sum(b.numel() for b in recorded) < min(2**15, cfg.replay.capacity):
            recorded.append(next(batches))
        batches = restored(recorded)
        while trainer.replay.steps_written <= cfg.replay.capacity:
            trainer.store(next(batches))
        trainer.loss.update_plan(trainer.rng)  # the fill's updates are not taken: timed ones come from --store
    else:
        trainer.fill_replay(max(2_000, cfg.replay.min_size + 500), batches)

    def plan() -> list[float]:
        """The updates the next stored batch pays for (without --store: the plan of the batches stored so far,
        or one replay-only update once that is spent)."""
        if args.store:
            trainer.store(next(batches))  # timed by the caller
            return trainer.loss.update_plan(trainer.rng)
        return trainer.loss.update_plan(trainer.rng) or [0.0]

    for _ in range(10):  # warm-up
        trainer.update(trainer.draw_batch(0.0))

    def timed() -> tuple[float, float, float]:
        draw = update = store = 0.0
        done = 0
        while done < args.updates:
            t0 = time.process_time()
            shares = plan()
            t1 = time.process_time()
            store += t1 - t0
            for share in shares[: args.updates - done]:
                t0 = time.process_time()
                sample = trainer.draw_batch(share)
                t1 = time.process_time()
                trainer.update(sample)
                draw, update = draw + t1 - t0, update + time.process_time() - t1
                done += 1
        return draw, update, store

    if args.profile:
        profile = cProfile.Profile()
        draw, update, store = profile.runcall(timed)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
    else:
        draw, update, store = timed()
    collector.shutdown()
    n = args.updates
    stored = f", storing batches {1e3 * store / n:.2f} ms" if args.store else ""
    print(f"{args.algo}:{args.preset} ({len(trainer.replay)} stored steps): draw {1e3 * draw / n:.2f} ms, "
          f"update {1e3 * update / n:.2f} ms{stored} per update (1 thread)")


def timed_updates(trainer: Trainer, updates: int) -> float:
    """Wall seconds of ``updates`` full updates (draw and update) of ``trainer`` after 10 warm-up ones, drawn as its
    loop draws them (``Trainer.planned_batches``: with ``replay.prefetch=true``, during the update before)."""
    shares = [s for _ in range(updates) for s in trainer.loss.update_plan(trainer.rng)][:updates]
    shares += [0.0] * (updates - len(shares))

    def take(plan: list[float]) -> None:
        with contextlib.closing(trainer.planned_batches(plan)) as samples:
            for sample in samples:
                trainer.update(sample)

    take(shares[:10])
    start = time.perf_counter()
    take(shares)
    return time.perf_counter() - start


def device_updates(argv: list[str]) -> None:
    """Learner updates per second of a preset on each device (``device=cuda`` against ``device=cpu``), on one
    replay filled once in-process, with no collector running: the learner's own ceiling on that machine.

        python benchmarks/learner.py devices acer atari --devices cuda cpu --updates 200 --out results.json

    Every device gets a trainer of its own (same seed, so the same initial weights) over the same stored steps;
    each times ``--updates`` full updates (batch draw, loss, backward, clipping, Adam, target / average networks,
    the loss's write-backs) by wall clock after 10 warm-up updates. The statistics of every update are read back
    to the host (``Trainer.update`` does), so every timed update ends synchronised with the GPU.
    """
    parser = argparse.ArgumentParser(prog="learner.py devices", description=device_updates.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("preset")
    parser.add_argument("--devices", nargs="+", default=["cuda", "cpu"])
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--stored", type=int, default=5_000, help="env steps in the replay before timing")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", action="store_true", help="cProfile's top entries of each device's updates")
    args, overrides = parser.parse_known_args(argv)
    tmp = tempfile.mkdtemp()
    base = [f"preset={args.preset}", "collector.workers=0", "log.progress=false", "replay.memmap=false",
            f"replay.min_size={args.stored // 2}", *overrides]
    filled = None
    rows = []
    for device in args.devices:
        trainer = Trainer(load_config(args.algo, [*base, f"device={device}", f"run_dir={tmp}/{device}"]))
        if filled is None:
            trainer.fill_replay(args.stored)
            filled = trainer.replay, trainer.online
        trainer.replay, trainer.online = filled  # the same stored steps and the same online windows
        if args.profile:
            profile = cProfile.Profile()
            seconds = profile.runcall(timed_updates, trainer, args.updates)
            pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
        else:
            seconds = timed_updates(trainer, args.updates)
        cfg = trainer.cfg
        rows.append({"device": device, "updates": args.updates, "seconds": round(seconds, 3),
                     "updates_per_s": round(args.updates / seconds, 1), "threads": torch.get_num_threads(),
                     "batch": [cfg.replay.batch_size, cfg.replay.seq_len]})
        print(f"{args.algo}:{args.preset} on {device}: {rows[-1]['updates_per_s']} updates/s "
              f"(batch {cfg.replay.batch_size} x {cfg.replay.seq_len}, {torch.get_num_threads()} threads)", flush=True)
    result = {"preset": f"{args.algo}:{args.preset}", "overrides": overrides, "stored_steps": len(filled[0]),
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "cpus": os.cpu_count(), "machine": platform.machine(), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


def learning_phase(run_dir: Path, start: int) -> dict:
    """The learning-phase figures of one run directory (``metrics.csv`` and ``summary.json``)."""
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    first = next((r for r in rows if int(r["env_steps"]) >= start), None)
    last = rows[-1]
    if first is None or first is last:
        raise SystemExit(f"{run_dir}: no two logged rows from {start} env steps on (its last: {last['env_steps']})")
    steps = int(last["env_steps"]) - int(first["env_steps"])
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "run": str(run_dir),
        "from": int(first["env_steps"]),
        "to": int(last["env_steps"]),
        "env_steps_per_s": round(steps / (float(last["wall_time_s"]) - float(first["wall_time_s"])), 1),
        "whole_run_env_steps_per_s": summary["env_steps_per_s"],
        "learner_cpu_per_wall_s": summary["learner_cpu_per_wall_s"],
        "final_score": round(summary["eval_return_mean"], 1),
    }


def learning_phases(argv: list[str]) -> None:
    """Env steps per second of runs once their updates have started (the learning phase), from their run directories.

        python recipes/vracer.py preset=mujoco env.name=Hopper-v5 total_frames=100000 seed=1 run_dir=runs/hopper-s1
        python benchmarks/learner.py phase runs/hopper-s1 [more run dirs] --from 25000

    A run's whole-run figure (``summary.json``'s ``env_steps_per_s``) includes the warm-up, where the collectors fill
    the replay at their own speed with no update (V-RACER's mujoco preset: 10 000 steps). This one is the env steps
    between the first logged row at or after ``--from`` steps and the last row, over the wall time between them (each
    row's ``wall_time_s`` is taken when its evaluation is asked for, so evaluations still being played do not count).
    """
    parser = argparse.ArgumentParser(prog="learner.py phase", description=learning_phases.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--from", dest="start", type=int, default=25000, help="env steps where the phase starts")
    args = parser.parse_args(argv)
    for run_dir in args.run_dirs:
        print(json.dumps(learning_phase(run_dir, args.start)))


def in_process(algo: str, preset: str, overrides: list[str]):
    """A trainer of the preset on one thread, and its collector acting in this process (``collector.workers=0``: no
    scheduling between processes, so a run is deterministic)."""
    cfg = load_config(algo, [f"preset={preset}", "collector.workers=0", f"run_dir={tempfile.mkdtemp()}/run",
                             "log.progress=false", *overrides])
    trainer = Trainer(cfg)
    torch.set_num_threads(1)
    return trainer, trainer.make_collector(10**12)


def same_numbers(argv: list[str]) -> None:
    """A fingerprint of a fixed-seed training run in one process, to show that a speed-up changed no number.

        python benchmarks/learner.py same-numbers vracer mujoco --updates 1500 env.name=Hopper-v5 replay.min_size=3000
        PYTHONPATH=<the code before> python benchmarks/learner.py same-numbers ...   # the same line, old code

    Collects in the learner's process (``collector.workers=0``: no scheduling between processes, so the run is
    deterministic), stores each batch and takes the loss's planned updates as ``Trainer.step`` does (its
    ``planned_batches``: with ``replay.prefetch=true``, each next batch drawn during the update before), until
    ``--updates`` updates; prints their CPU time and the SHA-256 of every update's statistics, the loss's final
    state (parameters and buffers) and, for an agent that keeps per-step estimates (V-RACER's ``VRACEREstimates``),
    their statistics and stored columns.
    Equal hashes: the same parameters, the same stored estimates and the same statistics at every update.
    """
    parser = argparse.ArgumentParser(prog="learner.py same-numbers", description=same_numbers.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("preset")
    parser.add_argument("--updates", type=int, default=1500)
    args, overrides = parser.parse_known_args(argv)
    trainer, collector = in_process(args.algo, args.preset, overrides)
    cfg, batches = trainer.cfg, iter(collector)
    trainer.fill_replay(cfg.replay.min_size + 100, batches)
    digest, done, cpu = hashlib.sha256(), 0, 0.0
    while done < args.updates:
        trainer.store(next(batches))
        with contextlib.closing(trainer.planned_batches(trainer.loss.update_plan(trainer.rng))) as samples:
            for sample in samples:
                start = time.thread_time()  # this thread's: not a draw-ahead thread's (replay.prefetch)
                stats = trainer.update(sample)
                cpu += time.thread_time() - start
                digest.update(repr(sorted(stats.items())).encode())
                done += 1
    collector.shutdown()
    estimates = trainer.agent.estimates
    state = {**trainer.loss.state_dict(), **(estimates.state_dict() if estimates is not None else {})}
    for name, value in sorted(state.items()):
        if isinstance(value, torch.Tensor):
            digest.update(name.encode())
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    for name, column in sorted(getattr(getattr(estimates, "stored", None), "columns", {}).items()):
        digest.update(name.encode())
        digest.update(column.numpy().tobytes())
    print(f"{args.algo}:{args.preset}: {done} updates, {1e3 * cpu / done:.2f} ms CPU each (update only, 1 thread); "
          f"sha256 {digest.hexdigest()}")


def plain_refer_terms(value, loc, scale, log_rho, action, mu_loc, mu_scale, v_tbc, q_ret, refer, mask, log_z) -> tuple:
    """V-RACER's three loss terms as autograd takes them (the plain form of ``refer_terms`` and its written-out
    partials): the same values and gradients, ``log rho`` differentiated through the policy's log-density."""
    log_pi = truncated_normal_log_prob(action, loc, scale, log_z).unsqueeze(-1)
    near = refer.near_policy(log_rho)
    rho, slope = refer.weight(log_rho, near)
    rho = rho + slope * (log_pi - log_pi.detach())  # the value of rho, the derivative slope * d log pi
    kl = gaussian_kl(mu_loc, mu_scale, loc, scale)
    objective = refer.gate(-rho * (q_ret - value.detach()), near, mask)
    return objective, refer.gate(0.5 * (value - v_tbc).pow(2), near, mask), refer.penalty(kl, mask), kl, near


def plain_written_out_backward(trainer: Trainer) -> Callable[[], None] | None:
    """V-RACER's update through autograd: the network's modules and :func:`plain_refer_terms`."""
    loss = trainer.loss
    if getattr(loss, "network_call", None) is None:
        return None
    network_call, loss.network_call = loss.network_call, None
    terms = partial(plain_refer_terms, log_z=loss._log_z)
    loss.forward = lambda td: loss._terms(td, *loss._outputs(td), terms=terms)[0]

    def undo() -> None:
        loss.network_call = network_call
        del loss.forward
    return undo


def plain_written_out_network(trainer: Trainer) -> Callable[[], None] | None:
    """V-RACER's network under autograd (its modules), ReF-ER's terms still one node with written-out partials."""
    loss = trainer.loss
    if getattr(loss, "network_call", None) is None:
        return None
    network_call, loss.network_call = loss.network_call, None
    return lambda: setattr(loss, "network_call", network_call)


class WalkedUpdate:
    """A fused target / average updater's step as TorchRL's ``SoftUpdate`` / ``HardUpdate`` take it: the loss's
    ``<name>_params`` and ``target_<name>_params`` walked key by key, one ``lerp_`` / ``copy_`` a tensor (the plain
    form of ``objectives/updaters.py``; TorchRL's own classes refuse ACER's average network, whose target
    parameters require a gradient)."""

    def __init__(self, fused: FusedSoftUpdate | FusedHardUpdate):
        self.fused = fused

    def step(self) -> None:
        fused, soft = self.fused, isinstance(self.fused, FusedSoftUpdate)
        if not soft and fused.counter != fused.value_network_update_interval:
            fused.counter += 1
            return
        fused.counter = 0
        loss = fused.loss_module
        for name, targets in loss.named_children():
            network = name[len("target_"):-len("_params")]
            if name.startswith("target_") and name.endswith("_params") and network in (fused.networks or (network,)):
                for key, source in getattr(loss, name[len("target_"):]).items(True, True):
                    if source.requires_grad:
                        target = targets.get(key).data
                        target.lerp_(source.data, 1.0 - fused.eps) if soft else target.copy_(source.data)


def plain_updaters(trainer: Trainer) -> Callable[[], None] | None:
    """:class:`WalkedUpdate` in place of each fused updater."""
    agent = trainer.agent
    fused = agent.updaters
    if not fused:
        return None
    agent.updaters = [WalkedUpdate(u) for u in fused]
    return lambda: setattr(agent, "updaters", fused)


def probabilistic_sampler(sampler: BehaviourSampler, stat_keys: list) -> ProbabilisticTensorDictModule:
    """TorchRL's way of drawing ``sampler``'s actions: a distribution object built from the statistics at every call
    (``Categorical``; ``TruncatedGaussian``; an independent ``Normal``), its draw and log-probability."""
    names = [key[-1] for key in stat_keys]
    if sampler.discrete:
        family, options = torch.distributions.Categorical, {}
    elif sampler.truncation is not None:
        family, options = TruncatedGaussian, {"width": sampler.truncation}
    else:
        family, options = IndependentNormal, {}
    return ProbabilisticTensorDictModule(
        in_keys=dict(zip(names, stat_keys)), out_keys=["action"], distribution_class=family,
        distribution_kwargs=options, return_log_prob=True, log_prob_key=(BEHAVIOUR, "log_prob"))


def plain_sampling(policy: TensorDictSequential) -> Callable[[], None] | None:
    """The acting policy ending in :func:`probabilistic_sampler` (TorchRL's way) instead of ``BehaviourSampler``."""
    last = policy.module[-1]
    if not isinstance(last.module, BehaviourSampler):
        return None
    policy.module[-1] = probabilistic_sampler(last.module, list(last.in_keys))
    return lambda: policy.module.__setitem__(-1, last)


def plain_tensor_call(trainer: Trainer) -> Callable[[], None] | None:
    """The losses' networks called on TensorDicts (``NetworkCall`` without its ``TensorCall``)."""
    calls = [c for c in vars(trainer.loss).values() if isinstance(c, NetworkCall) and c.tensors is not None]
    if not calls:
        return None
    saved = [c.tensors for c in calls]
    for call in calls:
        call.tensors = None
    return lambda: [setattr(c, "tensors", t) for c, t in zip(calls, saved)]


def plain_direct_step(trainer: Trainer) -> Callable[[], None] | None:
    """``clip_grad_norm_`` and ``optimizer.step()`` in place of ``DirectStep``'s kernel calls."""
    step = trainer.direct_step
    if not step.direct:
        return None
    step.direct = False
    return lambda: setattr(step, "direct", True)


def plain_update_path(trainer: Trainer) -> Callable[[], None] | None:
    """The update path's pieces all in their plain form: :func:`plain_tensor_call` and :func:`plain_direct_step`."""
    undos = [undo for undo in (plain_tensor_call(trainer), plain_direct_step(trainer)) if undo is not None]
    return (lambda: [undo() for undo in undos]) if undos else None


# each speed-only piece: the switch to its plain form (None: the preset does not use it; else the undo)
PIECES = {
    "update-path": plain_update_path,
    "tensor-call": plain_tensor_call,
    "direct-step": plain_direct_step,
    "written-out-backward": plain_written_out_backward,
    "written-out-network": plain_written_out_network,
    "fused-updaters": plain_updaters,
}


def alternated(run: Callable[[], float], switch: Callable[[], Callable[[], None] | None], rounds: int) -> list[float]:
    """Per round, ``run()``'s seconds with the plain form over those with the piece (the order swapped every other
    round), after one untimed run of each: the piece's speed-up, one figure a round. Empty when ``switch`` finds
    nothing to switch."""
    undo = switch()
    if undo is None:
        return []
    run()  # warm-up of both forms
    undo()
    run()
    ratios = []
    for n in range(rounds):
        times = {}
        for plain in (n % 2 == 1, n % 2 == 0):
            undo = switch() if plain else None
            times[plain] = run()
            if undo is not None:
                undo()
        ratios.append(times[True] / times[False])
    return ratios


def pieces(argv: list[str]) -> None:
    """What each speed-only piece of the learner and the acting path buys on a preset: its plain form and the piece
    itself alternated in one process (``--rounds`` rounds, the order swapped every other round), the median of the
    per-round ratios plain / piece of CPU time.

        python benchmarks/learner.py pieces vracer mujoco env.name=Hopper-v5 --rounds 10 --updates 100

    Learner pieces: ``--updates`` updates (draw and update, one thread) a round on a replay filled in-process, as
    ``update`` times them; the pieces are :data:`PIECES`. Acting pieces (:data:`ACTING`): the acting policy's call on
    one collected step of a worker's envs (``--calls`` a round); ``sampling``: ``BehaviourSampler`` against TorchRL's
    probabilistic module.
    A ratio of 1.10 means the plain form takes 10 % more time. Each piece's plain form is a switch on the built
    objects here (this script's ``plain_*`` functions), never a setting of the library.
    """
    parser = argparse.ArgumentParser(prog="learner.py pieces", description=pieces.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("preset")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--updates", type=int, default=50, help="updates a round")
    parser.add_argument("--calls", type=int, default=2000, help="acting policy calls a round")
    parser.add_argument("--only", nargs="+", choices=[*PIECES, *ACTING], default=[*PIECES, *ACTING])
    parser.add_argument("--end-to-end", type=int, default=0, metavar="FRAMES",
                        help="instead: env steps/s of FRAMES-step training runs (the preset's workers) a round")
    args, overrides = parser.parse_known_args(argv)
    if args.end_to_end:
        for name in args.only:
            report_piece(args.algo, args.preset, overrides, name,
                         end_to_end_ratios(args.algo, [f"preset={args.preset}", *overrides], args.end_to_end, name,
                                           args.rounds))
        return
    trainer, collector = in_process(args.algo, args.preset, overrides)
    cfg, batches = trainer.cfg, iter(collector)
    trainer.fill_replay(max(2_000, cfg.replay.min_size + 500), batches)
    step = next(batches)[..., 0].select(*trainer.acting.in_keys, strict=False)  # one step of each env
    collector.shutdown()
    for _ in range(10):  # warm-up
        trainer.update(trainer.draw_batch(0.0))

    def updates() -> float:
        start = time.process_time()
        for _ in range(args.updates):
            trainer.update(trainer.draw_batch(0.0))
        return time.process_time() - start

    def acting() -> float:
        start = time.process_time()
        with torch.no_grad():
            for _ in range(args.calls):
                trainer.acting(step.clone(False))
        return time.process_time() - start

    for name in args.only:
        ratios = alternated(acting if name in ACTING else updates, lambda: switch_piece(trainer, name), args.rounds)
        report_piece(args.algo, args.preset, overrides, name, ratios)


ACTING = {"sampling": plain_sampling}  # acting pieces: switches of the acting policy


def switch_piece(trainer: Trainer, name: str) -> Callable[[], None] | None:
    """The plain form of piece ``name`` (:data:`PIECES` or :data:`ACTING`) in ``trainer``; its undo, or None."""
    return ACTING[name](trainer.acting) if name in ACTING else PIECES[name](trainer)


def end_to_end_ratios(algo: str, settings: list[str], frames: int, name: str, rounds: int) -> list[float]:
    """Per round, the env steps/s of a ``frames``-step training run (the recipe's, in this process) with piece
    ``name`` over one with its plain form, the order swapped every other round; empty when the preset lacks it."""
    ratios = []
    for n in range(rounds):
        rates = {}
        for plain in (n % 2 == 1, n % 2 == 0):
            with tempfile.TemporaryDirectory() as tmp:
                trainer = Trainer(load_config(algo, [*settings, f"total_frames={frames}", f"run_dir={tmp}/run",
                                                     "log.progress=false"]))
                if plain and switch_piece(trainer, name) is None:
                    trainer.close()
                    return []
                rates[plain] = trainer.train()["env_steps_per_s"]
        ratios.append(rates[False] / rates[True])
    return ratios


def report_piece(algo: str, preset: str, overrides: list[str], name: str, ratios: list[float]) -> None:
    """One JSON line: piece ``name``'s per-round ratios on the preset, their median and the load average."""
    row = {"preset": f"{algo}:{preset}", "piece": name, "overrides": overrides, "load": round(os.getloadavg()[0], 1),
           "median": round(statistics.median(ratios), 3) if ratios else None, "ratios": [round(r, 3) for r in ratios]}
    print(json.dumps(row), flush=True)



def pfrl_agent(cfg):
    """pfrl's ACER with the ``acer cartpole`` preset's settings where pfrl has them (``results/learner.md`` lists
    those it has not): the preset's torso (``network.hidden``, ReLU) under a policy and a Q head, Adam with the
    preset's step size, its own ``EpisodicReplayBuffer``."""
    from pfrl.agents.acer import ACER, ACERDiscreteActionHead
    from pfrl.policies import SoftmaxCategoricalHead
    from pfrl.q_functions import DiscreteActionValueHead
    from pfrl.replay_buffers import EpisodicReplayBuffer

    info = env_info(cfg.env)
    encoder = make_encoder(info, cfg.network.hidden, cfg.network.activation)
    policy_head = nn.Linear(encoder.out_dim, info.num_actions)
    nn.init.orthogonal_(policy_head.weight, gain=0.01)  # as ours: near the uniform policy
    nn.init.zeros_(policy_head.bias)
    model = nn.Sequential(encoder, ACERDiscreteActionHead(
        pi=nn.Sequential(policy_head, SoftmaxCategoricalHead()),
        q=nn.Sequential(nn.Linear(encoder.out_dim, info.num_actions), DiscreteActionValueHead())))
    model.share_memory()  # pfrl's ACER asserts its shared model and optimiser state are in shared memory
    a = cfg.algo
    agent = ACER(model, shared_adam(model, cfg.optim), t_max=cfg.replay.seq_len, gamma=cfg.gamma,
                 replay_buffer=EpisodicReplayBuffer(cfg.replay.capacity), beta=a.entropy_coeff,
                 Q_loss_coef=a.critic_coeff, trust_region_alpha=a.alpha, trust_region_delta=a.delta,
                 truncation_threshold=a.c, n_times_replay=round(a.replay_ratio), replay_start_size=cfg.replay.min_size,
                 max_grad_norm=cfg.optim.max_grad_norm)
    agent.process_idx = 0  # as pfrl's train_agent_async names its first (here only) process
    return agent


def shared_adam(model: nn.Module, optim) -> torch.optim.Adam:
    """``torch.optim.Adam`` with ``optim``'s settings and its state made up front in shared memory (pfrl ships only
    a shared RMSprop; Adam makes its state at the first step, outside shared memory)."""
    adam = torch.optim.Adam(model.parameters(), lr=optim.lr, eps=optim.eps)
    for param in model.parameters():
        adam.state[param] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(param),
                             "exp_avg_sq": torch.zeros_like(param)}
        for value in adam.state[param].values():
            value.share_memory_()
    return adam


def pfrl_env_steps_per_s(cfg, frames: int) -> tuple[float, float]:
    """Env steps per wall second and per CPU second of pfrl's ACER trained for ``frames`` steps of one gymnasium
    env through a plain act/observe loop (pfrl's ``train_agent`` needs the old gym API), its replay's warm-up
    included as ours is. Per CPU second: what its one process runs at on a core of its own (a loaded machine
    slows the wall figure)."""
    import gymnasium

    torch.manual_seed(cfg.seed)
    agent = pfrl_agent(cfg)
    env = gymnasium.make(cfg.env.name)
    obs, _ = env.reset(seed=cfg.seed)
    start, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # pfrl's own float(tensor) and broadcast warnings
        for _ in range(frames):
            obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
            agent.observe(obs, reward, terminated, truncated)
            if terminated or truncated:
                obs, _ = env.reset()
    return frames / (time.perf_counter() - start), frames / (time.process_time() - cpu)


def import_pfrl(site: Path | None) -> str:
    """Imports pfrl's ACER from ``site`` (a folder it was installed into for this benchmark only) or the path; its
    version. Exits with one line when it is not importable."""
    if site is not None:
        sys.path.insert(0, str(site))  # this process only: the recipe's subprocess must not see the old gym
    try:
        import pfrl.agents.acer  # noqa: F401  (imports gym)
    except ImportError as error:
        sys.exit(f"error: learner.py pfrl needs pfrl, not importable here ({error}); install it for this benchmark "
                 "only: pip install --no-deps --target DIR pfrl==0.4.0 gym==0.26.2, then pass --site DIR")
    return importlib.metadata.version("pfrl")


def pfrl_comparison(argv: list[str]) -> None:
    """ACER CartPole's env steps/s against pfrl's ACER (issue 58: >= 10x), pfrl's run and ours alternated
    (ABAB, ``--rounds`` pairs): the median of the per-round ratios ours / pfrl (env steps per wall second; pfrl's
    per CPU second beside them).

        python benchmarks/learner.py pfrl --site /work/pfrl-site --frames 10000 --rounds 2

    Ours: the ``acer cartpole`` recipe as a user runs it (its workers and evaluations, its 50 000 steps; the
    end-to-end run of the floor comparison). pfrl: :func:`pfrl_env_steps_per_s` in this process, one thread (the
    learner's on this 2-core machine), the preset's settings where pfrl has them (:func:`pfrl_agent`).
    """
    parser = argparse.ArgumentParser(prog="learner.py pfrl", description=pfrl_comparison.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", type=Path, default=None, help="folder pfrl 0.4.0 and gym were installed into")
    parser.add_argument("--frames", type=int, default=10_000, help="env steps of each pfrl run")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    version = import_pfrl(args.site)
    algo, preset, overrides, frames = PRESETS["acer:cartpole"]
    cfg = load_config(algo, [f"preset={preset}", *overrides])
    torch.set_num_threads(1)
    rows = []
    for n in range(args.rounds):
        rates = {}
        for who in ("pfrl", "ours") if n % 2 == 0 else ("ours", "pfrl"):
            load = os.getloadavg()[0]
            if who == "pfrl":
                rates[who], rates["pfrl_per_cpu_s"] = pfrl_env_steps_per_s(cfg, args.frames)
            else:
                e2e = end_to_end(algo, preset, overrides, frames)
                rates[who] = e2e["env_steps"] / e2e["wall_time_s"]
            rates[f"{who}_load"] = round(load, 1)
        rows.append({**{k: round(v, 1) for k, v in rates.items()}, "ratio": round(rates["ours"] / rates["pfrl"], 2)})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"pfrl": version, "torch": torch.__version__,
                      "median_ratio": round(statistics.median(r["ratio"] for r in rows), 2)}))


COMMANDS = {"update": update_cost, "devices": device_updates, "phase": learning_phases,
            "same-numbers": same_numbers, "pieces": pieces, "pfrl": pfrl_comparison}


def stop(signum: int, _frame) -> None:
    """SIGTERM (``kill``, a job's time limit) ends this benchmark as Ctrl-C does: by an exception, on which
    ``subprocess.run`` kills the recipe it waits on and the in-process collectors shut down (Python's default
    SIGTERM would leave them running)."""
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, stop)
    command = COMMANDS.get(sys.argv[1] if len(sys.argv) > 1 else "", floor_comparison)
    command(sys.argv[2:] if command is not floor_comparison else sys.argv[1:])


if __name__ == "__main__":
    main()
