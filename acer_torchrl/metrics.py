"""Run logging: ``metrics.csv`` (rewritten atomically on every row), optional TensorBoard, the curve PNG."""

from __future__ import annotations

import csv
import os
from pathlib import Path

BASE_COLUMNS = ["env_steps", "updates", "wall_time_s"]


class MetricsLog:
    def __init__(self, run_dir: Path, tensorboard: bool = False):
        self.path = run_dir / "metrics.csv"
        self.rows: list[dict[str, float]] = []
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ImportError(
                    "log.tensorboard=true needs the tensorboard package: pip install 'acer-torchrl[tensorboard]'"
                ) from None
            self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def load_existing(self, up_to_env_steps: int) -> None:
        """Continue the rows of a resumed run. Rows logged after its checkpoint (``env_steps`` beyond
        ``up_to_env_steps``) are dropped: the resumed run logs those steps again."""
        if self.path.is_file():
            with self.path.open() as f:
                rows = [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
            self.rows = [r for r in rows if r["env_steps"] <= up_to_env_steps]

    def row(self, env_steps: int, updates: int, wall_time_s: float, metrics: dict[str, float]) -> None:
        row = {"env_steps": env_steps, "updates": updates, "wall_time_s": round(wall_time_s, 3), **metrics}
        self.rows.append(row)
        columns = list(BASE_COLUMNS)
        for r in self.rows:
            columns += [k for k in r if k not in columns]
        tmp = self.path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(tmp, self.path)
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, env_steps)
            self.writer.flush()

    def series(self, key: str) -> tuple[list[float], list[float]]:
        pts = [(r["env_steps"], r[key]) for r in self.rows if key in r]
        return [p[0] for p in pts], [p[1] for p in pts]


def plot_learning_curve(log: MetricsLog, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("train_return", "training episodes"), ("eval_return_mean", "greedy evaluation")):
        x, y = log.series(key)
        if x:
            ax.plot(x, y, marker="o" if key.startswith("eval") else None, label=label)
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
