"""Env-step throughput, side by side in one run:

(a) a plain gymnasium loop with random actions in one process (for Atari: the same ale-py preprocessing
    the project uses, one game);
(b) the project's collector (``make_collector`` over ``make_env_fn``) with ``--workers`` worker processes
    and a real acting policy (2x64 MLP; Nature CNN for Atari), for each ``--num-envs`` value (games per
    worker; default: per env, ``NUM_ENVS``); the learner side only receives the batches;
(c) with ``--recipes RUN_DIR ...``: end-to-end training throughput read from those runs' ``summary.json``.

    .venv/bin/python benchmarks/throughput.py [--seconds 10] [--envs CartPole-v1 Hopper-v5 ...]
        [--num-envs 1 8] [--workers 2] [--recipes runs/acer-CartPole-v1-...]

Prints markdown tables (ratio = (b) / (a)) for ``benchmarks/results/throughput.md``, with each rate both per
wall-clock second and per CPU-second: on a shared machine the first depends on the other load, the second
(far less) does.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.modules import MLP, IndependentNormal, ProbabilisticActor

from acer_torchrl.collectors import make_collector
from acer_torchrl.envs import EnvConfig, EnvInfo, atari_vector_env, env_family, env_info, make_env_fn

# games per worker: enough to amortise TorchRL's per-step cost (see results/throughput.md)
NUM_ENVS = {"CartPole-v1": 64, "Hopper-v5": 16, "HalfCheetah-v5": 16, "ALE/Pong-v5": 8}
TARGETS = {"CartPole-v1": 0.2, "Hopper-v5": 0.7, "HalfCheetah-v5": 0.7, "ALE/Pong-v5": 0.5}


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def plain_loop(name: str, seconds: float) -> tuple[float, float]:
    """(a): env steps per wall-clock second and per CPU-second of a plain gymnasium loop, random
    actions, one process, one env."""
    rng = np.random.default_rng(0)
    if env_family(name) == "atari":
        env = atari_vector_env(EnvConfig(name), num_envs=1)
        env.reset(seed=0)
        n_actions = env.single_action_space.n

        def step() -> None:
            _, _, terminated, truncated, _ = env.step(rng.integers(n_actions, size=1))
            if terminated[0] or truncated[0]:
                env.reset(options={"reset_mask": terminated | truncated})
    else:
        env = gym.make(name)
        env.reset(seed=0)
        env.action_space.seed(0)

        def step() -> None:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()

    steps, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    env.close()
    return steps / wall, steps / cpu


class NatureCNN(nn.Module):
    """Mnih et al. (2015) encoder over uint8 [C, 84, 84] frames, then a linear head."""

    def __init__(self, channels: int, out: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, out),
        )

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        batch = frames.shape[:-3]
        x = frames.reshape(-1, *frames.shape[-3:]).float().div_(255.0)
        return self.net(x).reshape(*batch, -1)


def acting_policy(info: EnvInfo) -> ProbabilisticActor:
    """A stochastic acting policy as the algorithms use one: statistics + sampled action + log-prob."""
    if len(info.obs_shape) == 3:
        net = NatureCNN(info.obs_shape[0], info.num_actions)
    else:
        out = info.num_actions if info.discrete else 2 * info.action_dim
        net = MLP(in_features=info.obs_shape[0], out_features=out, num_cells=[64, 64], activation_class=nn.Tanh)
    if info.discrete:
        module = TensorDictModule(net, ["observation"], ["logits"])
        return ProbabilisticActor(module, in_keys=["logits"], distribution_class=torch.distributions.Categorical,
                                  return_log_prob=True)
    module = TensorDictModule(nn.Sequential(net, NormalParamExtractor()), ["observation"], ["loc", "scale"])
    return ProbabilisticActor(module, in_keys=["loc", "scale"], distribution_class=IndependentNormal,
                              return_log_prob=True)


def collector_rate(name: str, num_envs: int, workers: int, steps_per_env: int, seconds: float) -> tuple[float, float]:
    """(b): env steps per wall-clock second delivered by the project's collector (after one warm-up
    batch per worker), and per CPU-second of the workers and this process, times the cores."""
    cfg = EnvConfig(name, num_envs=num_envs)
    policy = acting_policy(env_info(cfg))
    with make_collector(make_env_fn(cfg), policy, num_workers=workers,
                        frames_per_batch=num_envs * steps_per_env) as collector:
        pids = [proc.pid for proc in collector.procs]
        steps, start = 0, None
        for i, batch in enumerate(collector):
            if i == workers:  # workers started and warmed up
                start, cpu = time.perf_counter(), time.process_time() + sum(map(process_cpu_seconds, pids))
            elif start is not None:
                steps += batch.numel()
                if time.perf_counter() - start >= seconds:
                    break
        wall = time.perf_counter() - start
        cpu = time.process_time() + sum(map(process_cpu_seconds, pids)) - cpu
    return steps / wall, steps / cpu * os.cpu_count()


def recipe_rows(run_dirs: list[str]) -> list[dict]:
    """(c): the ``summary.json`` of each training run directory."""
    return [json.loads((Path(run_dir) / "summary.json").read_text()) for run_dir in run_dirs]


def markdown(args, rows: list[dict], plain: dict[str, tuple[float, float]], recipes: list[dict]) -> str:
    cores = os.cpu_count()
    lines = [
        f"Command: `.venv/bin/python benchmarks/throughput.py {' '.join(sys.argv[1:])}`  ",
        f"Date: {datetime.date.today()}; {platform.machine()}, {cores} CPU cores, torch {torch.__version__}, "
        f"Python {platform.python_version()}; {args.seconds:g} s per measurement; "
        f"load average {args.load[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end.",
        "",
        "Wall: env steps per wall-clock second. CPU: per CPU-second of the processes involved (for (b): the "
        f"workers and the receiving process, times {cores} cores), what a machine without other load would allow.",
        "",
        "| env | (a) plain loop, wall | (a) CPU | workers x envs per worker | frames per batch "
        "| (b) collector, wall | (b) CPU | ratio (b)/(a), wall | ratio, CPU | target |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        (a_wall, a_cpu), target = plain[r["env"]], TARGETS.get(r["env"])
        lines.append(
            f"| {r['env']} | {a_wall:,.0f} | {a_cpu:,.0f} | {r['workers']} x {r['num_envs']} | {r['fpb']} "
            f"| {r['wall']:,.0f} | {r['cpu']:,.0f} | {r['wall'] / a_wall:.2f} | {r['cpu'] / a_cpu:.2f} "
            f"| {'>= %.1f' % target if target else '-'} |"
        )
    if recipes:
        lines += [
            "",
            "End-to-end training (c), from the runs' summary.json (ratio: to (a), wall):",
            "",
            "| algorithm | env | env steps | wall time (s) | env steps/s | ratio to (a) |",
            "|---|---|---|---|---|---|",
        ]
        for s in recipes:
            ratio = f"{s['env_steps_per_s'] / plain[s['env']][0]:.2f}" if s["env"] in plain else "-"
            lines.append(
                f"| {s['algorithm']} | {s['env']} | {s['env_steps']} | {s['wall_time_s']} "
                f"| {s['env_steps_per_s']:,.0f} | {ratio} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measurement")
    parser.add_argument("--envs", nargs="+", default=list(NUM_ENVS))
    parser.add_argument("--num-envs", nargs="+", type=int, default=None,
                        help=f"games per worker to try (default: {NUM_ENVS})")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps-per-env", type=int, default=64, help="T of the [num_envs, T] batches")
    parser.add_argument("--recipes", nargs="*", default=[], help="training run dirs with a summary.json (c)")
    args = parser.parse_args()
    args.load = os.getloadavg()
    plain, rows = {}, []
    for name in args.envs:
        plain[name] = plain_loop(name, args.seconds)
        print(f"{name}: (a) {plain[name][0]:,.0f} steps/s, {plain[name][1]:,.0f} per CPU-second", flush=True)
        for num_envs in args.num_envs or [NUM_ENVS.get(name, 8)]:
            wall, cpu = collector_rate(name, num_envs, args.workers, args.steps_per_env, args.seconds)
            rows.append({"env": name, "workers": args.workers, "num_envs": num_envs,
                         "fpb": num_envs * args.steps_per_env, "wall": wall, "cpu": cpu})
            print(f"{name}: (b) {args.workers} workers x {num_envs} envs: {wall:,.0f} steps/s "
                  f"(ratio {wall / plain[name][0]:.2f}), CPU-normalised {cpu:,.0f} "
                  f"(ratio {cpu / plain[name][1]:.2f})", flush=True)
    print(markdown(args, rows, plain, recipe_rows(args.recipes)))


if __name__ == "__main__":
    main()
