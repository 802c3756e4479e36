"""Pong learning curves of the GPU runs from their ``metrics.csv``: training and greedy evaluation returns against
env steps, ``OUT_DIR/pong-ALGO.png`` for each run given, and its rows as ``OUT_DIR/pong-ALGO-metrics.csv``. A run
of several pieces (one a GPU window, each started from the weights of the one before: ``window.sh``) is given as its
pieces' files in order; their rows are joined into one curve.

usage: python benchmarks/gpu/plot_pong.py OUT_DIR ALGO=METRICS.csv[,NEXT_PIECE.csv ...] [ALGO=...]
"""

import csv
import sys
from pathlib import Path

from acer_torchrl.metrics import finish_plot, new_plot


def joined_rows(pieces: list[Path]) -> tuple[list[str], list[dict[str, str]]]:
    """The columns and rows of ``pieces`` in order, each piece's rows from past the last env step before it (a
    piece that resumed a checkpoint logs its steps again)."""
    columns: dict[str, None] = {}
    rows: list[dict[str, str]] = []
    for piece in pieces:
        with piece.open() as f:
            reader = csv.DictReader(f)
            columns.update(dict.fromkeys(reader.fieldnames or []))
            last = float(rows[-1]["env_steps"]) if rows else -1.0
            rows += [row for row in reader if float(row["env_steps"]) > last]
    return list(columns), rows


def write_rows(path: Path, columns: list[str], rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def machine() -> str:
    """The GPU the curve was learned on (this script runs on it, in ``window.sh``), e.g. "H200"; "CPU" without one."""
    import torch

    return torch.cuda.get_device_name(0).removeprefix("NVIDIA ").split()[0] if torch.cuda.is_available() else "CPU"


def plot_run(algo: str, rows: list[dict[str, str]], out: Path, on: str) -> None:
    fig, ax = new_plot()
    for key, label in (("train_return", "training episodes"), ("eval_return_mean", "greedy evaluation, 10 episodes")):
        points = [(float(r["env_steps"]), float(r[key])) for r in rows if r.get(key)]
        ax.plot(*zip(*points) if points else ([], []), marker="o" if key.startswith("eval") else None, label=label)
    ax.set_ylim(-21.5, 21.5)
    steps, minutes = float(rows[-1]["env_steps"]), float(rows[-1]["wall_time_s"]) / 60
    title = f"{algo} ALE/Pong-v5, one {on}: {steps:,.0f} steps in {minutes:.1f} min"
    finish_plot(fig, ax, out / f"pong-{algo}.png", title, "env steps (x4 frames)", "return", threshold=18.0)


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    for run in argv[1:]:
        algo, paths = run.split("=", 1)
        pieces = [Path(p) for p in paths.split(",")]
        columns, rows = joined_rows(pieces)
        write_rows(out / f"pong-{algo}-metrics.csv", columns, rows)
        plot_run(algo, rows, out, machine())


if __name__ == "__main__":
    main(sys.argv[1:])
