"""Pong learning curves of the GPU runs (``pong_pair.sh``) from their ``metrics.csv``: training and greedy
evaluation returns against env steps, ``OUT_DIR/pong-ALGO.png`` for each run given.

usage: python benchmarks/gpu/plot_pong.py OUT_DIR ALGO=METRICS.csv [ALGO=METRICS.csv ...]
"""

import csv
import sys
from pathlib import Path

from acer_torchrl.metrics import finish_plot, new_plot


def plot_run(algo: str, metrics: Path, out: Path) -> None:
    rows = list(csv.DictReader(metrics.open()))
    steps = [float(r["env_steps"]) for r in rows]
    fig, ax = new_plot()
    for key, label in (("train_return", "training episodes"), ("eval_return_mean", "greedy evaluation, 10 episodes")):
        ax.plot(steps, [float(r[key]) for r in rows], marker="o" if key.startswith("eval") else None, label=label)
    ax.set_ylim(-21.5, 21.5)
    minutes = float(rows[-1]["wall_time_s"]) / 60
    title = f"{algo} ALE/Pong-v5, one H100: {steps[-1]:,.0f} steps in {minutes:.1f} min"
    finish_plot(fig, ax, out / f"pong-{algo}.png", title, "env steps (x4 frames)", "return", threshold=18.0)


if __name__ == "__main__":
    for run in sys.argv[2:]:
        algo, path = run.split("=", 1)
        plot_run(algo, Path(path), Path(sys.argv[1]))
