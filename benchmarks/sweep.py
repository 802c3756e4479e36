"""LASER Figure 3 at small scale: a sweep of agents sharing one replay, with and without the trust region,
against the same agents trained apart (Schmitt et al. 2020, sec. 5.5).

    python benchmarks/sweep.py --seeds 2 --frames 50000 --threshold 475 [--agents 3] [key=value ...]

For each seed ``s`` three variants of the same ``--agents`` hyper-parameter points (agent ``i``: learning
rate and entropy cost scaled by :class:`acer_torchrl.shared_replay.SweepConfig`'s factors, seed ``s + i``):

* ``shared+TR``: ``recipes/laser_sweep.py`` (one replay, LASER's trust region);
* ``shared``: the same sweep with ``laser.trust_region=false`` (plain V-trace on the shared replay);
* ``apart``: one ``recipes/laser.py`` run per agent, each with its own replay.

Each agent's result is its **final score** (:func:`acer_torchrl.metrics.final_score`: its mean greedy return
over the last 10 % of its env steps). Per variant: the interquartile mean of all its agents' final scores
(every agent of every seed) with a 95 % stratified-bootstrap confidence interval (rliable), and the best
agent's final score per seed (the paper plots the best agent of a sweep). Secondary: the env steps *per agent*
at which the sweep's first agent's greedy evaluation reached the threshold. Results go to
``results/laser-sweep.{md,json,png}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from learning import RESULTS, ROOT, iqm_with_ci, require_rliable, steps_to

from acer_torchrl.metrics import final_score, finish_plot, new_plot

VARIANTS = ("shared+TR", "shared", "apart")


def agent_curve(metrics: Path) -> list[tuple[int, float]]:
    with metrics.open() as f:
        return [(int(float(r["env_steps"])), float(r["eval_return_mean"])) for r in csv.DictReader(f) if r.get("eval_return_mean")]


def run_logged(cmd: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed; see {log}")


def agent_points(agents: int, seed: int, extra: list[str]) -> list[list[str]]:
    """The overrides of each agent of the sweep, for runs apart (what the sweep gives agent ``i``)."""
    sys.path.insert(0, str(ROOT))
    from acer_torchrl.config import load_config
    from acer_torchrl.shared_replay import SweepConfig

    base = load_config("laser", ["preset=cartpole", *extra])
    sweep = SweepConfig(agents=agents)
    points = []
    for i in range(agents):
        lr_factor, entropy_factor = sweep.factors(i)
        points.append([f"optim.lr={base.optim.lr * lr_factor}", f"laser.entropy_coeff={base.algo.entropy_coeff * entropy_factor}",
                       f"seed={seed + i}"])
    return points


def run_variant(variant: str, seed: int, args, extra: list[str], out: Path) -> list[list[tuple[int, float]]]:
    common = ["preset=cartpole", f"total_frames={args.frames}", "log.progress=false", *extra]
    if variant == "apart":
        curves = []
        for i, point in enumerate(agent_points(args.agents, seed, extra)):
            run_dir = out / f"agent{i}"
            run_logged([sys.executable, str(ROOT / "recipes" / "laser.py"), *common, *point, f"run_dir={run_dir}"], run_dir.with_suffix(".log"))
            curves.append(agent_curve(run_dir / "metrics.csv"))
        return curves
    tr = [] if variant == "shared+TR" else ["laser.trust_region=false"]
    run_logged([sys.executable, str(ROOT / "recipes" / "laser_sweep.py"), f"agents={args.agents}", f"seed={seed}", *common, *tr,
                f"run_dir={out}"], out.with_suffix(".log"))
    return [agent_curve(out / f"agent{i}" / "metrics.csv") for i in range(args.agents)]


def plot(results: dict, path: Path, threshold: float) -> None:
    fig, ax = new_plot()
    for colour, variant in zip(("tab:blue", "tab:orange", "tab:green"), VARIANTS):
        for k, agents in enumerate(results[variant]):
            grid = sorted({s for c in agents for s, _ in c})
            best = np.max([np.interp(grid, *zip(*c)) for c in agents], axis=0)
            ax.plot(grid, best, color=colour, lw=1.5, alpha=0.8, label=variant if k == 0 else None)
    finish_plot(fig, ax, path, "LASER sweep (one line per seed)", "env steps per agent", "best agent's greedy return", threshold)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--frames", type=int, default=50_000, help="env steps per agent")
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "benchmarks")
    args, extra = parser.parse_known_args()
    require_rliable()
    top = args.runs / f"laser-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    start = time.time()
    results = {v: [] for v in VARIANTS}
    for seed in range(args.seeds):
        for variant in VARIANTS:
            results[variant].append(run_variant(variant, 10 * seed, args, extra, top / f"seed{seed}" / variant.replace("+", "-")))
    rows = {}
    for variant in VARIANTS:
        first = [min((s for s in (steps_to(c, args.threshold) for c in agents) if s is not None), default=None)
                 for agents in results[variant]]
        finals = [[round(final_score(c, args.frames).mean, 1) for c in agents] for agents in results[variant]]
        iqm, low, high = iqm_with_ci([f for agents in finals for f in agents])
        rows[variant] = {"final_score_iqm": round(iqm, 1), "final_score_ci95": [round(low, 1), round(high, 1)],
                         "final_score_per_agent_per_seed": finals, "best_final_score_per_seed": [max(a) for a in finals],
                         "steps_to_threshold_per_seed": first,
                         "agents_reaching_threshold_per_seed": [sum(steps_to(c, args.threshold) is not None for c in a) for a in results[variant]]}
    command = " ".join(["python benchmarks/sweep.py", f"--seeds {args.seeds}", f"--agents {args.agents}", f"--frames {args.frames}",
                        f"--threshold {args.threshold:g}", *extra])
    summary = {"rows": rows, "command": command, "total_wall_s": round(time.time() - start, 1), "date": time.strftime("%Y-%m-%d"),
               "machine": f"{os.cpu_count()} cores", "curves": results}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "laser-sweep.json").write_text(json.dumps(summary, indent=1))
    plot(results, RESULTS / "laser-sweep.png", args.threshold)
    lines = ["# LASER sweep: shared replay with / without trust region vs agents apart (Figure 3, small scale)", "",
             f"`{command}` ({summary['machine']}, {summary['date']}, {summary['total_wall_s']:.0f} s in all). Final score: an "
             "agent's mean greedy return over the last 10 % of its env steps; IQM over every agent of every seed with its "
             "95 % stratified-bootstrap CI (rliable); best: the sweep's best agent per seed. Secondary: env steps per agent "
             "when the sweep's first agent reached the threshold (- = never); agents: how many of the sweep reached it.",
             "", "| variant | final score IQM [95 % CI] | best agent's final score per seed | final score per agent per seed "
             "| steps to threshold per seed | agents reaching it per seed |", "|---|---|---|---|---|---|"]
    for variant, row in rows.items():
        steps = ", ".join("-" if s is None else str(s) for s in row["steps_to_threshold_per_seed"])
        low, high = row["final_score_ci95"]
        lines.append(f"| {variant} | {row['final_score_iqm']} [{low}, {high}] | {row['best_final_score_per_seed']} | "
                     f"{row['final_score_per_agent_per_seed']} | {steps} | {row['agents_reaching_threshold_per_seed']} |")
    (RESULTS / "laser-sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
