"""Run logging: ``metrics.csv`` (rewritten atomically on every row; the record the project reads), optional
TensorBoard and Weights & Biases through TorchRL's loggers, the curve PNG, and the run's final score.

A run's **final score** is the mean of its greedy evaluations over the last 10 % of its env steps (at least
three evaluations, the last one always included): a run is judged by the policy it ends with, not by the
first evaluation that touched a threshold. The trainer schedules evaluations at 90 %, 95 % and 100 % of the
run's env steps (:func:`final_window_steps`) on top of the periodic ones, so the window holds three of them
whatever ``eval.interval`` is, once it spans three collected batches (a run of 20 batches or more); a shorter
run evaluates its last three batches, and its final score averages those.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
from collections.abc import Collection
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from acer_torchrl.validation import ConfigError

BASE_COLUMNS = ["env_steps", "updates", "wall_time_s"]
FINAL_WINDOW = 0.1  # the last 10 % of a run's env steps
MIN_FINAL_EVALUATIONS = 3


def final_window_steps(end: int, frames_per_batch: int) -> list[int]:
    """Env steps at which an evaluation is due on top of the periodic ones, each taken at the batch that reaches it,
    in a run that ends at ``end`` env steps (``total_frames`` rounded up to whole batches of ``frames_per_batch``):
    the start, middle and end of the final window (90 %, 95 % and 100 % of ``end``, rounded up in exact
    arithmetic), reached by three different batches once the window spans three; in a shorter run, the ends of its
    last three batches (what :func:`final_score` then averages)."""
    window = Fraction(FINAL_WINDOW).limit_denominator(10_000)
    last = MIN_FINAL_EVALUATIONS - 1  # batches before the last one
    if window * end < last * frames_per_batch:
        return [step for step in range(end - last * frames_per_batch, end + 1, frames_per_batch) if step > 0]
    points = (1 - window, 1 - window / 2, Fraction(1))
    return sorted({-(-end * p.numerator // p.denominator) for p in points})


@dataclass
class FinalScore:
    mean: float  # the final score
    std: float  # spread of the window's evaluation means
    evaluations: int  # how many evaluations it averages
    from_step: int  # env steps of the first of them
    last: float  # the last evaluation alone


def final_score(curve: list[tuple[float, float]], env_steps: float) -> FinalScore | None:
    """The final score of a run of ``env_steps`` steps from its ``(env_steps, greedy return)`` evaluations:
    those at or after ``(1 - FINAL_WINDOW) * env_steps``, or the last ``MIN_FINAL_EVALUATIONS`` when the
    window holds fewer (the last evaluation is always included). None without evaluations."""
    if not curve:
        return None
    curve = sorted(curve)
    window = [r for s, r in curve if s >= (1.0 - FINAL_WINDOW) * env_steps]
    if len(window) < MIN_FINAL_EVALUATIONS:
        window = [r for _, r in curve[-MIN_FINAL_EVALUATIONS:]]
    return FinalScore(
        mean=float(np.mean(window)),
        std=float(np.std(window)),
        evaluations=len(window),
        from_step=int(curve[-len(window)][0]),
        last=float(curve[-1][1]),
    )


def window_settings(rows: list[dict], from_step: int, defaults: dict[str, int]) -> dict[str, int | list[int]]:
    """The evaluation settings (``defaults``' keys: ``eval_episodes``, ``eval_max_steps``) of the evaluation rows from
    ``from_step`` on (a final score's window): each setting's value, or the sorted list of its values where a resume
    changed it within the window. A row without the setting (logged before rows recorded it) counts as ``defaults``'."""
    window = window_evaluations(rows, from_step)
    settings = {}
    for key, default in defaults.items():
        values = sorted({int(r.get(key, default)) for r in window} or {default})
        settings[key] = values[0] if len(values) == 1 else values
    return settings


def window_games_cut(rows: list[dict], from_step: int) -> int:
    """The greedy games of the evaluation rows from ``from_step`` on (a final score's window) that ``eval.max_steps``
    cut before they ended (their returns so far counted): ``eval_games_cut``, 0 in rows logged before it was."""
    return sum(int(r.get("eval_games_cut", 0)) for r in window_evaluations(rows, from_step))


def window_evaluations(rows: list[dict], from_step: int) -> list[dict]:
    """The evaluation rows of ``rows`` from ``from_step`` on (a final score's window)."""
    return [r for r in rows if "eval_return_mean" in r and r["env_steps"] >= from_step]


def make_loggers(run_dir: Path, tensorboard: bool = False, wandb: bool = False,
                 resumed_at: int | None = None) -> list:
    """TorchRL loggers (``torchrl.record.loggers``) beside ``metrics.csv``: TensorBoard events under
    ``<run_dir>/tensorboard``; a Weights & Biases run in offline mode under ``<run_dir>/wandb`` (``wandb sync``
    uploads it), its id fixed by the run directory so that a resumed run continues the same W&B run. The
    config checks that their packages are installed (``LogConfig.validate``).

    ``resumed_at``: the env steps after which a resumed run logs every row again (its checkpoint's, or before the
    first evaluation the checkpoint kept unfinished). TensorBoard then hides the points the killed run logged
    after them, as ``metrics.csv`` drops their rows (:meth:`MetricsLog.load_existing`): the resumed run logs those
    steps again. W&B keeps them (an offline run cannot rewind its history)."""
    loggers = []
    if tensorboard:
        loggers.append(tensorboard_logger(run_dir, purge_step=None if resumed_at is None else resumed_at + 1))
    if wandb:
        from torchrl.record.loggers.wandb import WandbLogger

        run_id = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
        loggers.append(WandbLogger(exp_name=run_dir.name, offline=True, save_dir=str(run_dir), id=run_id,
                                   project="acer-torchrl", log_env_packages=False))
    return loggers


def tensorboard_logger(run_dir: Path, purge_step: int | None):
    """TorchRL's ``TensorboardLogger`` writing under ``<run_dir>/tensorboard``, its ``SummaryWriter`` given
    ``purge_step``: TensorBoard hides the events at that step or later that an earlier writer of the directory
    logged (``SummaryWriter``'s own rule for a restarted run). Without it a point that both the killed and the
    resumed run logged shows twice, and the killed run's later ones stay where the resumed run logs on another grid.
    (The subclass is made here: TorchRL's module is imported only when a run asks for TensorBoard.)"""
    from torchrl.record.loggers.tensorboard import TensorboardLogger

    class PurgingTensorboardLogger(TensorboardLogger):
        def __init__(self):
            self.purge_step = purge_step  # read when the base class makes the writer
            super().__init__(exp_name="tensorboard", log_dir=str(run_dir))

        def _create_experiment(self):
            from torch.utils.tensorboard import SummaryWriter

            return SummaryWriter(log_dir=os.path.join(self.log_dir, self.exp_name), purge_step=self.purge_step)

    return PurgingTensorboardLogger()


def _number(text: str) -> int | float:
    """A metrics.csv cell as it was logged: ``2560`` an int (step and update counts), ``0.5`` a float, so that a
    resumed run rewrites the older rows as they were."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def _cells(line: str) -> list[str] | None:
    """The cells of one metrics.csv line; None when the line is not CSV (damaged bytes)."""
    try:
        return next(csv.reader([line]))
    except csv.Error:
        return None


def _metrics_row(header: list[str], line: str) -> dict[str, int | float] | None:
    """One metrics.csv row under ``header``, as it was logged; None when it cannot be read: a cell too many or too
    few (a row cut short), or a cell that is not a number."""
    cells = _cells(line)
    if cells is None or len(cells) != len(header):
        return None
    try:
        row = {key: _number(cell) for key, cell in zip(header, cells) if cell != ""}
    except ValueError:
        return None
    return row if "env_steps" in row else None


class MetricsLog:
    """The run's metric rows in ``metrics.csv``, each also handed to ``loggers`` (:func:`make_loggers`)."""

    def __init__(self, run_dir: Path, loggers: list | None = None):
        self.path = run_dir / "metrics.csv"
        self.rows: list[dict[str, float]] = []
        self.loggers = loggers or []
        self._write_failing = False  # the last write of metrics.csv failed (warned once until one succeeds)

    def load_existing(self, up_to_env_steps: int, asked_again: Collection[int] = ()) -> str | None:
        """Continue the rows of a resumed run. Rows logged after its checkpoint (``env_steps`` beyond
        ``up_to_env_steps``) are dropped, and those at ``asked_again`` (the evaluations the checkpoint kept
        unfinished, which a killed run may have logged after it): the resumed run logs those steps again. Rows that
        cannot be read (a tail cut short by a kill, damaged bytes, text in a number's column) are dropped too and
        the file rewritten without them: returns what was repaired, in words (None when the file was whole). One
        that cannot be read at all (a directory in its place, no read permission) is a one-line
        :class:`ConfigError`: it is left as it is."""
        if not self.path.exists():
            return None
        try:
            text = self.path.read_bytes().decode(errors="replace")
        except OSError as err:
            raise ConfigError(f"cannot read {self.path} ({os_reason(err)}) to continue its rows; move it away (the "
                              "resumed run then starts a new one) or make it a readable file") from None
        lines = [line for line in text.splitlines() if line.strip()]
        header = _cells(lines[0]) if lines else None
        if header is None or "env_steps" not in header:
            header, lines = [], ["", *lines]  # no header to read the rows by: every line is unreadable
        rows = [_metrics_row(header, line) for line in lines[1:]]
        if rows and not text.endswith("\n"):  # every write ends its last row with a newline: this one was cut short
            rows[-1] = None
        self.rows = [r for r in rows if r is not None and r["env_steps"] <= up_to_env_steps
                     and r["env_steps"] not in asked_again]
        unreadable = rows.count(None)
        if len(self.rows) < len(rows):  # the file keeps only what the resumed run continues (not the rows of the
            self.write(self.columns())  # killed segment after its checkpoint: evaluations of weights now gone)
        return f"metrics.csv: {unreadable} unreadable line(s) dropped" if unreadable else None

    def columns(self) -> list[str]:
        """``metrics.csv``'s header: the base columns, then every metric in the order the rows first hold it."""
        columns = list(BASE_COLUMNS)
        for r in self.rows:
            columns += [k for k in r if k not in columns]
        return columns

    def row(self, env_steps: int, updates: int, wall_time_s: float, metrics: dict[str, float]) -> None:
        row = {"env_steps": env_steps, "updates": updates, "wall_time_s": round(wall_time_s, 3), **metrics}
        self.rows.append(row)
        self.write(self.columns())
        for logger in self.loggers:
            for key, value in metrics.items():
                logger.log_scalar(key, value, step=env_steps)

    def write(self, columns: list[str]) -> None:
        """Rewrite ``metrics.csv`` with every row (atomically). A write that fails (a full disk, an I/O error) is
        one warning line, not the run's end: the rows stay in memory and the next row's write holds them all."""
        tmp = self.path.with_suffix(".csv.tmp")
        try:
            with tmp.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(self.rows)
            os.replace(tmp, self.path)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            if not self._write_failing:
                print(f"warning: cannot write {self.path} ({os_reason(err)}); the run goes on, its rows are written "
                      "with the next one that fits", file=sys.stderr)
            self._write_failing = True
            return
        self._write_failing = False

    def flush(self) -> None:
        """Write the rows again if the last write failed (a checkpoint's: what a resume reads back is every row up
        to it, not the file as it was before the failure)."""
        if self._write_failing:
            self.write(self.columns())

    def series(self, key: str) -> tuple[list[float], list[float]]:
        pts = [(r["env_steps"], r[key]) for r in self.rows if key in r]
        return [p[0] for p in pts], [p[1] for p in pts]


def new_plot(size: tuple[float, float] = (6, 4)):
    """A figure and its axes, drawn off-screen (matplotlib is imported here, when a plot is made)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=size)


def finish_plot(fig, ax, path: Path, title: str, xlabel: str, ylabel: str, threshold: float | None = None,
                legend_size: float | None = None) -> None:
    """Threshold line, labels, legend and grid; save ``fig`` to ``path`` and close it."""
    import matplotlib.pyplot as plt

    if threshold is not None:
        ax.axhline(threshold, color="k", ls="--", lw=1, label=f"threshold {threshold:g}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=legend_size)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def os_reason(err: OSError) -> str:
    """A failed write's cause in the OS's words ("no space left on device"), else its message."""
    return os.strerror(err.errno).lower() if err.errno else str(err)


def write_summary(path: Path, summary: dict) -> None:
    """``summary.json``, atomically: a write that fails (a full disk) leaves no partial file and raises OSError."""
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def read_summary(path: Path) -> dict | None:
    """``summary.json`` as the run wrote it; None when it is missing or cannot be read (cut short, damaged):
    the run's checkpoint rebuilds it (:meth:`acer_torchrl.trainer.Trainer.finish`)."""
    try:
        summary = json.loads(path.read_bytes())
    except (OSError, ValueError):  # a decoding or JSON error is a ValueError
        return None
    return summary if isinstance(summary, dict) and {"env_steps", "run_dir"} <= summary.keys() else None


def save_learning_curve(log: MetricsLog, path: Path, title: str) -> None:
    """The curve PNG, written atomically (a run killed meanwhile leaves the one before); a log like metrics.csv: a
    write that fails is one warning line, not the run's end."""
    tmp = path.with_suffix(".tmp.png")  # the suffix names the format for matplotlib
    try:
        plot_learning_curve(log, tmp, title)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        print(f"warning: cannot write {path} ({os_reason(err)}); metrics.csv holds the same curve", file=sys.stderr)


def plot_learning_curve(log: MetricsLog, path: Path, title: str) -> None:
    fig, ax = new_plot()
    for key, label in (("train_return", "training episodes"), ("eval_return_mean", "greedy evaluation")):
        x, y = log.series(key)
        if x:
            ax.plot(x, y, marker="o" if key.startswith("eval") else None, label=label)
    x, _ = log.series("eval_return_mean")
    if x:
        ax.axvspan((1.0 - FINAL_WINDOW) * max(x), max(x), color="tab:orange", alpha=0.12, label="final-score window")
    finish_plot(fig, ax, path, title, "env steps", "return")
