"""Learner speed against its compute floor, per preset, in one run (issue 19).

    python benchmarks/learner.py [--only acer:cartpole vracer:mujoco ...] [--frames N] [--out results/learner.json]

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
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from acer_torchrl.algorithms import get_algorithm
from acer_torchrl.config import load_config
from acer_torchrl.envs import env_info
from acer_torchrl.modules import make_encoder
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
    s_update = floor_seconds_per_update(cfg, info, max(len(agent.torsos), 1), agent.loss.seq_len, floor_updates)
    env_rate, _ = plain_loop(cfg.env.name, env_seconds)
    acting = acting_alone(algo, preset, overrides, acting_frames)
    steps, updates, wall = e2e["env_steps"], e2e["updates"], e2e["wall_time_s"]
    floor_s = updates * s_update + steps / env_rate
    row = {
        "preset": name,
        "env": cfg.env.name,
        "env_steps": steps,
        "updates": updates,
        "batch": [cfg.replay.batch_size, agent.loss.seq_len],
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(PRESETS), default=list(PRESETS), metavar="ALGO:PRESET")
    parser.add_argument("--frames", type=int, default=None, help="env steps of every end-to-end run")
    parser.add_argument("--floor-updates", type=int, default=200, help="bare gradient steps timed per preset")
    parser.add_argument("--env-seconds", type=float, default=5.0, help="seconds of the plain gymnasium loop")
    parser.add_argument("--acting-frames", type=int, default=10_000, help="env steps of the acting-alone run")
    parser.add_argument("--out", type=Path, default=RESULTS / "learner.json")
    args = parser.parse_args()
    rows = [measure(name, args.frames, args.floor_updates, args.env_seconds, args.acting_frames) for name in args.only]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    record = {"date": datetime.date.today().isoformat(), "machine": machine, "command": " ".join(sys.argv), "rows": rows}
    args.out.write_text(json.dumps(record, indent=2))
    print(f"\n{machine}, {record['date']}: `python {' '.join(sys.argv)}`\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
