"""Learning benchmark: several seeds of one recipe, a curve plot, a row in ``results/learning.md`` and the row's
record, its line of ``results/learning-rows.jsonl`` (by its name).

    python benchmarks/learning.py <algo> <preset> --seeds 5 --frames 50000 --threshold 475 [--parallel 2] [key=value ...]
    python benchmarks/learning.py <algo> <preset> ... --resume runs/benchmarks/<name>-<date>   # after a stop
    python benchmarks/learning.py minatar   # the MinAtar summary of the committed rows (minatar_summary's docstring)
    python benchmarks/learning.py figure <stem> <row> <row> ...   # rows' curves in one <stem>.png (shared_figure)

Each seed is a separate recipe run (``recipes/<algo>.py``) in its own process; ``--parallel`` of them at a
time. Reads each run's ``summary.json`` and ``metrics.csv`` and records per seed the **final score** (the mean
greedy return over the last 10 % of the run's env steps, :func:`acer_torchrl.metrics.final_score`), across
seeds its interquartile mean with a 95 % stratified-bootstrap confidence interval (``rliable``, the ``bench``
extra: ``pip install -e '.[bench]'``), and, as secondary figures, the env steps at which the greedy
evaluation first reached the threshold, wall time and env steps/s.

SIGINT or SIGTERM, to the benchmark alone or to its whole group, stops the running seeds (each checkpoints) and
starts no further seed; ``--resume`` then goes on from there. The seeds it had finished are also kept in
``results/<name>-partial/`` (:func:`record_partial`), so that they outlive the machine: where the benchmark's
directory is gone, ``--restore-partial`` reads them from there and runs only the others. The row replaces that record.
Its ``total_wall_s`` is the benchmark's wall time over all its invocations (``invocations``; both null where an
earlier invocation left no record of its time: :func:`open_wall`); its ``code``, ``machine`` and ``date`` name each
invocation's (:func:`note_invocation`), ``packages`` their Python and package versions, and ``seed_segments`` which
code trained each seed from which env step, on which machine (its run's ``provenance.jsonl``). A seed directory an
earlier invocation left is read or resumed only when it ran this very seed (:func:`not_this_seed`); keys the benchmark
sets (``seed=``, ``total_frames=``, ...) are refused as settings. A failed seed is named in the row and exits 1; with none finished no row is written.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from acer_torchrl.commands import shell_command
from acer_torchrl.metrics import FINAL_WINDOW, final_score, finish_plot, new_plot
from acer_torchrl.provenance import FILE as SEGMENTS, contributing, segments, summarize, this_process
from acer_torchrl.rundir import holds_run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ROWS = "learning-rows.jsonl"  # every row's record (per-seed scores, curves, command...), one JSON line each, by name


INTERRUPTED = threading.Event()  # a seed's run was stopped by SIGINT / SIGTERM: start no further seed
RUNNING: set[subprocess.Popen] = set()  # the seeds' recipe processes now running
RUNNING_LOCK = threading.Lock()


def forward_stop(signum: int, _frame) -> None:
    """SIGINT / SIGTERM sent to the benchmark alone (``kill``, not a terminal's Ctrl-C to the whole group): pass it
    on to the running seeds' recipes, each of which checkpoints and exits, and start no further seed."""
    INTERRUPTED.set()
    with RUNNING_LOCK:
        for proc in RUNNING:
            proc.send_signal(signum)  # a recipe already stopping drops a second signal


def recipe_args(preset: str, seed: int, frames: int, run_dir: Path, extra: list[str]) -> list[str]:
    """The recipe's arguments for one seed: ``resume=`` where ``run_dir`` holds a checkpoint (or a finished run),
    else a new run there. A seed stopped during its start-up left a ``config.yaml`` and nothing to resume; it starts
    anew in the same directory (the recipe reuses a directory that holds no run)."""
    if holds_run(run_dir):
        return [f"resume={run_dir}", "log.progress=false"]
    return [f"preset={preset}", f"seed={seed}", f"total_frames={frames}", f"run_dir={run_dir}", "log.progress=false",
            *extra]


def run_seed(algo: str, preset: str, seed: int, frames: int, run_dir: Path, extra: list[str]) -> dict:
    """One seed's recipe run in ``run_dir``; a run already there is resumed from its checkpoint (or, when
    it has finished, only read). Once a run was interrupted (it checkpointed), no further seed starts."""
    if INTERRUPTED.is_set():
        return {"seed": seed, "failed": "not started: the benchmark was interrupted"}
    cmd = recipe_args(preset, seed, frames, run_dir, extra)
    log = run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "summary.json").exists():
        with log.open("a") as f:
            proc = subprocess.Popen([sys.executable, str(ROOT / "recipes" / f"{algo}.py"), *cmd],
                                    stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
            with RUNNING_LOCK:
                RUNNING.add(proc)
                if INTERRUPTED.is_set():  # stopped while this seed was starting
                    proc.send_signal(signal.SIGINT)
            try:
                proc.wait()
            finally:
                with RUNNING_LOCK:
                    RUNNING.discard(proc)
        if proc.returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM):  # the recipe's exit after its checkpoint
            INTERRUPTED.set()
        if proc.returncode != 0:
            return {"seed": seed, "failed": f"exit {proc.returncode}, see {log}"}
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["curve"] = read_curve(run_dir)
    summary["seed"] = seed
    # which code trained it from which env step, on which machine (its provenance.jsonl; None: a segment unrecorded)
    summary["segments"] = [None if r is None else {k: r.get(k) for k in ("from_env_steps", "code", "machine", "date")}
                           for r in contributing(segments(run_dir))]
    summary["final_score"] = final_score(summary["curve"], summary["env_steps"]).mean
    if not math.isfinite(summary["final_score"]):  # a NaN return (a NaN reward): no score to put in a row
        return {"seed": seed, "failed": f"final score {summary['final_score']} (an evaluation returned it, see "
                                        f"{run_dir / 'metrics.csv'})"}
    return summary


def read_curve(run_dir: Path) -> list[tuple[int, float]]:
    """A run's greedy evaluations from its ``metrics.csv``: ``(env steps, mean return)``."""
    with (run_dir / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("eval_return_mean")]
    return [(int(float(r["env_steps"])), float(r["eval_return_mean"])) for r in rows]


# where a seed's run lives and how it reports: the benchmark sets them, not part of what a seed ran
BOOKKEEPING = ("run_dir", "resume", "overwrite", "log.progress")


def seed_settings(algo: str, preset: str, seed: int, frames: int, extra: list[str]) -> dict:
    """Every setting a seed of this benchmark runs with (``config.flat_settings``' keys), but :data:`BOOKKEEPING`."""
    from acer_torchrl.config import flat_settings, load_config

    cfg = load_config(algo, [f"preset={preset}", f"seed={seed}", f"total_frames={frames}", *extra])
    return {k: v for k, v in flat_settings(cfg).items() if k not in BOOKKEEPING}


# settings a seed's resume may change without changing its numbers (total_frames: a benchmark made longer)
LEAVE_THE_NUMBERS = ("total_frames", "threads", "device", "replay.prefetch", "eval.background", "log.progress",
                     "log.tensorboard", "log.wandb", "log.checkpoint_interval")


def leaves_the_numbers(key: str, settings: dict) -> bool:
    """Whether a resume that changed ``key`` leaves a run of ``settings`` (:func:`seed_settings`) with the numbers of
    one that ran with the new value all along: :data:`LEAVE_THE_NUMBERS`, but ``total_frames`` where the step size
    falls over it (``optim.lr_end_factor`` below 1: a run made longer had a schedule that jumped back up)."""
    if key == "total_frames" and settings.get("optim.lr_end_factor", 1.0) != 1.0:
        return False
    return key in LEAVE_THE_NUMBERS


def changed_on_resume(run_dir: Path) -> list[tuple[int, str, object]]:
    """``(env steps, key, value before)`` of each setting a resume of ``run_dir`` changed (its ``resumes.jsonl``)."""
    path = run_dir / "resumes.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [(r["env_steps"], key, change["from"]) for r in records for key, change in r["changed"].items()]


def not_this_seed(algo: str, preset: str, seed: int, frames: int, extra: list[str], run_dir: Path) -> str | None:
    """Why ``run_dir``, a seed's directory an earlier invocation left (``--resume``, ``--restore-partial``), is not a
    run of this benchmark's seed ``seed``, in words; None when it is, or holds nothing. Its ``config.yaml`` must hold
    this seed's settings (:func:`seed_settings`: the same length and every other key, those a resume may change
    included), and have run with them all along (no resume that changed one of them, :data:`LEAVE_THE_NUMBERS`
    aside); a finished one's ``summary.json`` this algorithm, seed and length, and the final score its
    ``metrics.csv`` gives. Before, such a directory was read (finished) or resumed to its own length and settings,
    and the row said it ran this command."""
    from acer_torchrl.config import ConfigError, flat_settings, load_config

    if (run_dir / "config.yaml").exists():
        try:
            saved = flat_settings(load_config(algo, [f"resume={run_dir}"]))
        except ConfigError as err:
            return str(err)
        expected = seed_settings(algo, preset, seed, frames, extra)
        differ = [k for k, v in expected.items() if saved.get(k) != v]
        if differ:
            ran = ", ".join(f"{k}={saved.get(k)}" for k in differ)
            wanted = ", ".join(f"{k}={expected[k]}" for k in differ)
            return f"it ran with {ran}; this benchmark's seed {seed} has {wanted}"
        for env_steps, key, before in changed_on_resume(run_dir):
            if not leaves_the_numbers(key, expected) and before != expected.get(key):
                return (f"it ran with {key}={before} up to {env_steps} env steps (its resumes.jsonl); this benchmark's "
                        f"seed {seed} has {key}={expected.get(key)}")
    if not (run_dir / "summary.json").exists():
        return None
    summary = json.loads((run_dir / "summary.json").read_text())
    for key, value in (("algorithm", algo), ("seed", seed)):
        if summary.get(key, value) != value:
            return f"its summary.json is of {key} {summary[key]}, not {value}"
    if summary["env_steps"] < frames:
        return f"it finished at {summary['env_steps']} env steps, not the benchmark's {frames}"
    score = final_score(read_curve(run_dir), summary["env_steps"])
    if score is None or not math.isclose(score.mean, summary["eval_return_mean"], rel_tol=1e-6, abs_tol=1e-9):
        found = "no evaluation" if score is None else f"a final score of {score.mean:g}"
        return (f"its metrics.csv gives {found} at {summary['env_steps']} env steps, its summary.json "
                f"{summary['eval_return_mean']:g} (evaluations logged after it finished?)")
    return None


def check_seed_dirs(algo: str, preset: str, seeds: range, frames: int, extra: list[str], bench_dir: Path) -> None:
    """:func:`not_this_seed` for every seed directory of ``bench_dir``, before any seed runs: one line for the
    first that is not this benchmark's, exit code 1."""
    for seed in seeds:
        run_dir = bench_dir / f"seed{seed}"
        if run_dir.is_dir() and (why := not_this_seed(algo, preset, seed, frames, extra, run_dir)):
            sys.exit(f"error: {run_dir} is not a run of this benchmark's seed {seed}: {why}; move it away, or give "
                     "the benchmark's own command")


def partial_dir(results: Path, name: str) -> Path:
    """Where an interrupted benchmark keeps the seeds it finished (``<row>-partial``: the MinAtar summary reads it)."""
    return results / f"{name}-partial"


def record_partial(folder: Path, bench_dir: Path, finished: list[dict], command: str, ran: dict,
                   threshold: float | None = None) -> None:
    """The ``finished`` seeds' (:func:`run_seed`'s results) ``summary.json`` and ``metrics.csv`` from ``bench_dir``
    as ``folder/seed<k>-summary.json`` and ``seed<k>-metrics.csv``, their curves (``curves.png``) and a README with
    ``command`` and their final scores. A row's seeds can take longer than a session, and a session's machine may be
    a fresh one. ``ran`` (:func:`what_ran`) goes into ``benchmark.json``: :func:`restore_partial` checks it; the wall
    ledger (:func:`open_wall`) goes with them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "benchmark.json").write_text(json.dumps(ran) + "\n")
    for ledger in (WALL, PROVENANCE):
        if (bench_dir / ledger).exists():
            shutil.copyfile(bench_dir / ledger, folder / ledger)
    plot(finished, folder / "curves.png", f"{folder.name} ({len(finished)} seeds)", threshold)
    for result in finished:
        seed = result["seed"]
        for stem in ("summary.json", "metrics.csv", "config.yaml", SEGMENTS):
            if (bench_dir / f"seed{seed}" / stem).exists():
                shutil.copyfile(bench_dir / f"seed{seed}" / stem, folder / f"seed{seed}-{stem}")
    scores = ", ".join(f"seed {r['seed']} {r['final_score']:.1f}" for r in sorted(finished, key=lambda r: r["seed"]))
    (folder / "README.md").write_text(
        f"# {folder.name}: the seeds a benchmark finished before it was stopped (not a learning.md row)\n\n"
        f"    {command}\n\n"
        f"Final scores (mean greedy return over the last 10 % of the env steps): {scores}; their curves:\n"
        f"[`curves.png`](curves.png). Written {time.strftime('%Y-%m-%d')}. The other seeds go on with `--resume <its\n"
        "directory>`, or, where that is gone, `--restore-partial` (these seeds read from here, the others run); the\n"
        "row replaces this record.\n")


def what_ran(algo: str, preset: str, frames: int, extra: list[str]) -> dict:
    """What a seed's run depends on: a recorded seed is restored only into a benchmark of the same."""
    return {"algo": algo, "preset": preset, "frames": frames, "settings": extra}


WALL = "wall.json"  # a benchmark's wall time over its invocations: a resumed one ran in several


def open_wall(bench_dir: Path, resumed: bool) -> dict:
    """The wall-time ledger of ``bench_dir`` as this invocation starts, written back marked open: ``seconds`` of the
    earlier invocations and ``invocations`` counting this one, each None where an earlier invocation left no full
    record (a directory from before the ledger, or one killed before :func:`close_wall`). A row's ``total_wall_s``
    comes from here, so that a benchmark resumed across sessions records all of its time or says it cannot."""
    path = bench_dir / WALL
    if path.exists():
        ledger = json.loads(path.read_text())
        if ledger["open"]:
            ledger["seconds"] = None
    else:
        ledger = {"seconds": None if resumed else 0.0, "invocations": None if resumed else 0}
    count = ledger["invocations"]
    bench_dir.mkdir(parents=True, exist_ok=True)
    return _write_wall(bench_dir, {"seconds": ledger["seconds"], "invocations": None if count is None else count + 1,
                                   "open": True})


def close_wall(bench_dir: Path, ledger: dict, elapsed: float) -> dict:
    """:func:`open_wall`'s ``ledger`` with this invocation's ``elapsed`` seconds added, written back closed."""
    seconds = None if ledger["seconds"] is None else ledger["seconds"] + elapsed
    return _write_wall(bench_dir, {**ledger, "seconds": seconds, "open": False})


def _write_wall(bench_dir: Path, ledger: dict) -> dict:
    (bench_dir / WALL).write_text(json.dumps(ledger) + "\n")
    return ledger


PROVENANCE = "provenance.json"  # each invocation's code, machine and date: a resumed row's seeds ran in several


def note_invocation(bench_dir: Path, resumed: bool) -> list[dict | None]:
    """``bench_dir``'s record of its invocations with this one's appended: its code, machine, date and packages
    (:func:`acer_torchrl.provenance.this_process`, the code including this script), a None first where earlier
    invocations left no record (a directory from before it). The row names them all: a row resumed across sessions,
    or restored from another machine's record, ran on each."""
    path = bench_dir / PROVENANCE
    runs = json.loads(path.read_text()) if path.exists() else ([None] if resumed else [])
    runs.append(this_process(CODE_PATHS))
    bench_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(runs) + "\n")
    return runs


CODE_PATHS = ("acer_torchrl", "recipes", "benchmarks/learning.py")  # a row's numbers come from these


def restore_partial(folder: Path, bench_dir: Path, ran: dict) -> list[int]:
    """Each seed of the record ``folder`` (:func:`record_partial`) that ``bench_dir`` has not finished, put back
    there as a finished run (its ``summary.json`` and ``metrics.csv``: what :func:`run_seed` reads); the seeds.
    Refused in one line when the record's seeds ran otherwise than ``ran`` (:func:`what_ran`)."""
    written = folder / "benchmark.json"
    recorded = json.loads(written.read_text()) if written.exists() else None
    if recorded != ran:
        raise SystemExit(f"error: {folder} holds seeds of {recorded}, not of this benchmark's {ran}")
    restored = []
    for seed in recorded_seeds(folder):
        summary = folder / f"seed{seed}-summary.json"
        run_dir = bench_dir / f"seed{seed}"
        if (run_dir / "summary.json").exists():
            continue
        if holds_run(run_dir):
            raise SystemExit(f"error: {run_dir} holds a run of seed {seed} and {folder} a finished one: "
                             "drop one of them")
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / f"seed{seed}-metrics.csv", run_dir / "metrics.csv")
        for stem in ("config.yaml", SEGMENTS):  # (records of before 2026-11-29 / -30 have none)
            if (folder / f"seed{seed}-{stem}").exists():
                shutil.copyfile(folder / f"seed{seed}-{stem}", run_dir / stem)
        shutil.copyfile(summary, run_dir / "summary.json")
        restored.append(seed)
    merge_ledgers(folder, bench_dir)
    return restored


def recorded_seeds(folder: Path) -> list[int]:
    """The seeds whose finished runs the record ``folder`` (:func:`record_partial`) holds, ascending."""
    names = (p.name for p in folder.glob("seed*-summary.json"))
    return sorted(int(name.removeprefix("seed").removesuffix("-summary.json")) for name in names)


def merge_ledgers(folder: Path, bench_dir: Path) -> None:
    """The wall-time and provenance ledgers of the record ``folder`` into ``bench_dir``: copied where it has none;
    else its invocations put before ``bench_dir``'s (they ran first) and their seconds added, so that the row names
    the code and machines the restored seeds ran on and counts their time. A record whose invocations ``bench_dir``
    has already (one it was written from, or restored before) adds nothing."""
    bench_dir.mkdir(parents=True, exist_ok=True)
    if not (bench_dir / PROVENANCE).exists():
        for ledger in (WALL, PROVENANCE):
            if (folder / ledger).exists():
                shutil.copyfile(folder / ledger, bench_dir / ledger)
        return
    ours = json.loads((bench_dir / PROVENANCE).read_text())
    theirs = json.loads((folder / PROVENANCE).read_text()) if (folder / PROVENANCE).exists() else None
    if theirs is not None and all(r in ours for r in theirs):
        return
    (bench_dir / PROVENANCE).write_text(json.dumps((theirs or [None]) + ours) + "\n")
    walls = [json.loads(p.read_text()) if p.exists() else {} for p in (folder / WALL, bench_dir / WALL)]
    totals = {key: None if any(w.get(key) is None for w in walls) else sum(w[key] for w in walls)
              for key in ("seconds", "invocations")}
    _write_wall(bench_dir, {**totals, "open": walls[1].get("open", False)})


def iqm_with_ci(scores: list[float], reps: int = 50_000, seed: int = 0) -> tuple[float, float, float]:
    """Interquartile mean of per-seed final scores with its 95 % stratified-bootstrap confidence interval
    (Agarwal et al. 2021, computed by ``rliable``), the same bits for the same scores and ``seed``. With 2 to 4 seeds
    the interval is exactly [min, max] and the IQM their mean (with 4, the mean of the middle two)."""
    from rliable import library as rly
    from rliable import metrics

    with numpy_global_seed(seed):
        point, interval = rly.get_interval_estimates(
            {"run": np.asarray(scores, dtype=float).reshape(-1, 1)},
            lambda x: np.array([metrics.aggregate_iqm(x)]),
            reps=reps,
        )
    return float(point["run"][0]), float(interval["run"][0, 0]), float(interval["run"][1, 0])


@contextlib.contextmanager
def numpy_global_seed(seed: int):
    """numpy's global generator seeded with ``seed`` inside the block, as it was after it. rliable's bootstraps
    (``StratifiedBootstrap``, the performance profiles' CIs) draw their resamples from it (``np.random.choice``)
    whatever ``random_state`` they are given: seeded here, a CI is reproducible."""
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(saved)


def require_rliable() -> None:
    """Checked before a benchmark's runs, not after hours of them."""
    if importlib.util.find_spec("rliable") is None:
        sys.exit("error: the learning benchmark needs rliable: .venv/bin/pip install -c constraints.txt -e '.[bench]'")


def steps_to(curve: list[tuple[int, float]], threshold: float) -> int | None:
    return next((s for s, r in curve if r >= threshold), None)


def plot(results: list[dict], path: Path, title: str, threshold: float | None) -> None:
    fig, ax = new_plot()
    curves = [r["curve"] for r in results if "curve" in r and r["curve"]]
    for curve in curves:
        ax.plot(*zip(*curve), color="tab:blue", alpha=0.25, lw=1)
    if curves:
        grid, interp = on_common_steps(curves)
        ax.plot(grid, interp.mean(0), color="tab:blue", lw=2, label=f"mean of {len(curves)} seeds")
        ax.fill_between(grid, interp.min(0), interp.max(0), color="tab:blue", alpha=0.15, label="min-max")
        ax.axvspan((1.0 - FINAL_WINDOW) * grid[-1], grid[-1], color="tab:orange", alpha=0.12, label="final-score window")
    finish_plot(fig, ax, path, title, "env steps", "greedy evaluation return", threshold)


def on_common_steps(curves: list[list[tuple[int, float]]]) -> tuple[np.ndarray, np.ndarray]:
    """Seeds' evaluation curves on the steps any of them evaluated at: the steps and the returns interpolated there,
    ``[seeds, steps]``."""
    grid = np.array(sorted({s for c in curves for s, _ in c}))
    return grid, np.array([np.interp(grid, *zip(*c)) for c in curves])


def plot_rows(rows: list[dict], path: Path, title: str) -> None:
    """Several rows in one plot: each row's mean over its seeds, its [min, max] shaded where it has several."""
    fig, ax = new_plot((7, 4.5))
    for row in rows:
        grid, returns = on_common_steps([c for c in row["curves"].values() if c])
        seeds = f" ({len(returns)} seeds)" if len(returns) > 1 else ""
        (line,) = ax.plot(grid, returns.mean(0), lw=1.5, label=f"{row['name']}{seeds}: {row['final_score_iqm']:g}")
        if len(returns) > 1:
            ax.fill_between(grid, returns.min(0), returns.max(0), color=line.get_color(), alpha=0.12)
    finish_plot(fig, ax, path, title, "env steps", "greedy evaluation return (legend: final score)", legend_size=7)


def shared_figure(argv: list[str]) -> None:
    """Rows whose curves belong together (a tuning study's runs, each a row of its own) in one ``<stem>.png``: each
    record's ``figure`` names it, ``learning.md``'s line of each row links it, and the row's own ``<name>.png`` goes
    (the record keeps every seed's evaluations). A row run again with ``--replace`` gets its own curve back.

        python benchmarks/learning.py figure acer-hopper-tuning acer-hopper-tune-base acer-hopper-tune-rr16 ...
    """
    parser = argparse.ArgumentParser(prog="learning.py figure", description=shared_figure.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stem", help="the figure's file name without .png")
    parser.add_argument("rows", nargs="+", help="the rows it shows, by name")
    parser.add_argument("--title", default=None)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    records = read_rows(args.results / ROWS)
    unknown = [name for name in args.rows if name not in records]
    if unknown:
        parser.error(f"no record of the rows {unknown} in {args.results / ROWS}")
    if args.stem in records:
        parser.error(f"{args.stem!r} is a row's name: its own curve's file")
    figure = f"{args.stem}.png"
    rows = [records[name] for name in args.rows]
    plot_rows(rows, args.results / figure, args.title or args.stem)
    for row in rows:
        row["figure"] = figure
        write_row(args.results / ROWS, row)
        put_markdown_row(row, args.results / "learning.md")
        (args.results / f"{row['name']}.png").unlink(missing_ok=True)
    print(f"{args.results / figure}: {', '.join(args.rows)}")


def redraw_shared_figure(results: Path, figure: str) -> None:
    """``figure`` (:func:`shared_figure`) drawn again from the rows that still name it (a row replaced with
    ``--replace`` has its own curve now), or deleted when none does."""
    rows = [r for r in read_rows(results / ROWS).values() if r.get("figure") == figure]
    if rows:
        plot_rows(rows, results / figure, Path(figure).stem)
    else:
        (results / figure).unlink(missing_ok=True)


def read_rows(path: Path) -> dict[str, dict]:
    """The row records of ``path`` (a ``learning-rows.jsonl``) by their ``name``, in file order; none when it is
    missing."""
    if not path.exists():
        return {}
    records = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {record["name"]: record for record in records}


def record_line(path: Path, name: str) -> int:
    """The line of ``path`` (a ``learning-rows.jsonl``) that holds the row ``name``, from 1."""
    return list(read_rows(path)).index(name) + 1


def write_row(path: Path, row: dict) -> None:
    """``row`` as its line of ``path``: the line of the same name replaced in place, else a new last line. The file
    is written whole and atomically (a benchmark killed meanwhile leaves every row as before)."""
    rows = read_rows(path)
    rows[row["name"]] = row
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(record) + "\n" for record in rows.values()))
    os.replace(tmp, path)


# keys the benchmark sets for each seed itself: given as settings, the last value would count (config.py) and
# every seed would run, say, seed 7 under the labels 0-4, or another length than the row's ``frames``
OWN_KEYS = {"seed": "--seeds and --first-seed", "total_frames": "--frames", "preset": "the preset argument",
            "run_dir": "--runs", "resume": "--resume", "overwrite": "--resume"}


def check_overrides(parser: argparse.ArgumentParser, algo: str, preset: str, extra: list[str]) -> None:
    """One usage error, before any seed starts, for a flag this script does not know (it would reach every seed's
    recipe as a setting and fail it), for a key the benchmark sets itself (:data:`OWN_KEYS`) and for settings the
    recipe would refuse (an unknown key, a bad value)."""
    flags = [arg for arg in extra if arg.startswith("-")]
    if flags:
        parser.error(f"unrecognized arguments: {' '.join(flags)}")
    from acer_torchrl.config import ConfigError, load_config, override_key

    own = next((key for key in map(override_key, extra) if key in OWN_KEYS), None)
    if own is not None:
        parser.error(f"{own}= is the benchmark's to set for each seed ({OWN_KEYS[own]}): drop it")

    try:
        load_config(algo, [f"preset={preset}", *extra])
    except ConfigError as err:
        parser.error(str(err))


def benchmark(argv: list[str]) -> None:
    """Several seeds of one recipe, their row and curves (the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("preset")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="seeds run are first-seed .. first-seed + seeds - 1 (default 0)")
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--threshold", type=float, default=None)
    parser.add_argument("--parallel", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--name", default=None, help="label of the row and file stem (default algo-preset)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "benchmarks")
    parser.add_argument("--resume", type=Path, default=None,
                        help="a killed benchmark's directory (<runs>/<name>-<date>): finished seeds are read, "
                             "the others resume from their checkpoints, missing ones start")
    parser.add_argument("--restore-partial", action="store_true",
                        help="the seeds an interrupted benchmark of this name recorded in <results>/<name>-partial/ "
                             "are read from there, the others run (its directory is gone: another machine)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help=f"where the row's line of {ROWS} and its <name>.png go and learning.md is extended "
                             "(default %(default)s)")
    parser.add_argument("--replace", action="store_true",
                        help=f"replace the row's line of {ROWS} and its <name>.png (refused otherwise: they back "
                             "a committed row)")
    args, extra = parser.parse_known_args(argv)
    check_overrides(parser, args.algo, args.preset, extra)
    name = args.name or f"{args.algo}-{args.preset}"
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: give at least 1")
    records = read_rows(args.results / ROWS)
    if name in records and not args.replace:
        parser.error(f"{args.results / ROWS} already holds a row {name}: give another --name, or --replace")
    shared = {record.get("figure") for record in records.values()}
    if name not in records and (f"{name}.png" in shared or (args.results / f"{name}.png").exists()):
        parser.error(f"{args.results / name}.png is another figure's (rows share it, or a page shows it): "
                     "give another --name")
    require_rliable()
    bench_dir = args.resume or args.runs / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.resume is not None and not args.resume.is_dir():
        parser.error(f"--resume {args.resume}: no such benchmark directory")
    partial = partial_dir(args.results, name)
    if args.restore_partial:
        if not partial.is_dir():
            parser.error(f"--restore-partial: no record {partial}")
        restored = restore_partial(partial, bench_dir, what_ran(args.algo, args.preset, args.frames, extra))
        print(f"seeds {restored} read from {partial}")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    check_seed_dirs(args.algo, args.preset, seeds, args.frames, extra, bench_dir)
    resumed = args.resume is not None or args.restore_partial
    ledger, invocations = open_wall(bench_dir, resumed), note_invocation(bench_dir, resumed)
    start = time.time()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward_stop)
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(
            lambda s: run_seed(args.algo, args.preset, s, args.frames, bench_dir / f"seed{s}", extra),
            seeds,
        ))
    ledger = close_wall(bench_dir, ledger, time.time() - start)
    threshold = [] if args.threshold is None else ["--threshold", exact(args.threshold)]
    command = "python benchmarks/learning.py " + shlex.join(
        [args.algo, args.preset, "--seeds", str(args.seeds)]
        + (["--first-seed", str(args.first_seed)] if args.first_seed else []) + ["--frames", str(args.frames)]
        + threshold + ["--parallel", str(args.parallel)] + (["--name", args.name] if args.name else []) + extra)
    ok = [r for r in results if "failed" not in r]
    failed = [f"seed {r['seed']}: {r['failed']}" for r in results if "failed" in r]
    if INTERRUPTED.is_set():
        resume = [] if args.resume else ["--resume", str(bench_dir)]
        again = shell_command(os.path.abspath(sys.argv[0]), *sys.argv[1:], *resume)
        if ok:
            ran = what_ran(args.algo, args.preset, args.frames, extra)
            record_partial(partial, bench_dir, ok, command, ran, args.threshold)
        kept = f"; seeds {[r['seed'] for r in ok]} recorded in {partial}" if ok else ""
        sys.exit(f"interrupted; the runs are checkpointed{kept}: continue with {again}")
    if not ok:  # a row of failures would stand for the benchmark (or replace its row, with --replace)
        sys.exit(f"error: no seed finished ({'; '.join(failed)}): no row written")
    args.results.mkdir(parents=True, exist_ok=True)
    plot(results, args.results / f"{name}.png", f"{args.algo} {args.preset} ({args.seeds} seeds)", args.threshold)
    finals = [r["final_score"] for r in ok]
    iqm, ci_low, ci_high = iqm_with_ci(finals) if finals else (None, None, None)
    reached = [steps_to(r["curve"], args.threshold) for r in ok] if args.threshold is not None else []
    row = {
        "name": name,
        "seeds": args.seeds,
        "first_seed": args.first_seed,
        "frames": args.frames,
        "threshold": args.threshold,
        "final_score_iqm": _round(iqm),
        "final_score_ci95": [_round(ci_low), _round(ci_high)],
        "final_score_per_seed": [shown(f, args.threshold) for f in finals],
        "final_score_at_threshold": (f"{sum(f >= args.threshold for f in finals)}/{args.seeds}"
                                     if args.threshold is not None else "n/a"),
        "steps_to_threshold": [s for s in reached],
        "eval_return_last_per_seed": [round(r["curve"][-1][1], 1) for r in ok],
        "eval_episodes": ok[0].get("eval_episodes") if ok else None,
        # what each seed's final-score evaluations played: eval.episodes (a list where a resume changed it) and the
        # games eval.max_steps cut before they ended (the table notes fewer than 10 episodes, or any game cut)
        "eval_episodes_per_seed": [r.get("eval_episodes") for r in ok],
        "eval_games_cut_per_seed": [r.get("final_score_games_cut", 0) for r in ok],
        "wall_time_s_per_seed": round(float(np.mean([r["wall_time_s"] for r in ok])), 1) if ok else None,
        "env_steps_per_s": round(float(np.mean([r["env_steps_per_s"] for r in ok])), 1) if ok else None,
        "curves": {str(r["seed"]): r["curve"] for r in ok},
        "seeds_finished": [r["seed"] for r in ok],  # final_score_per_seed's seeds
        "failed": failed,
        # seeds whose run the health watch marked diverged (acer_torchrl.health): in the scores, marked in the table
        "diverged_seeds": [r["seed"] for r in ok if r.get("health", {}).get("status") == "diverged"],
        # seeds with a greedy evaluation whose mean return was not finite (outside the final score's window, or the
        # seed failed), marked in the table the same way
        "evaluation_not_finite_seeds": [r["seed"] for r in ok
                                        if r.get("health", {}).get("status") == "evaluation_not_finite"],
        "final_score_evaluations": [r.get("final_score_evaluations") for r in ok],
        "total_wall_s": _round(ledger["seconds"]),  # every invocation's (None: an earlier one left no record)
        "invocations": ledger["invocations"],
        "command": command,
        **summarize(invocations, "invocations"),
        # the code each seed's run trained on (its summary.json's segments): a seed resumed by hand elsewhere too
        "seed_code": ", ".join(dict.fromkeys(part for r in ok for part in str(r.get("code") or "").split(", ") if part)),
        "seed_segments": {str(r["seed"]): r.get("segments") for r in ok},  # per seed: which code from which step
        "packages": distinct_packages(invocations),
    }
    write_row(args.results / ROWS, row)
    put_markdown_row(row, args.results / "learning.md")
    if "figure" in records.get(name, {}):  # --replace of a row a shared figure drew: drawn again without its old curves
        redraw_shared_figure(args.results, records[name]["figure"])
    if partial.is_dir():
        others = sorted(set(recorded_seeds(partial)) - set(row["seeds_finished"]))
        if others:  # (a resume with other --seeds / --first-seed): their only record outside runs/
            print(f"note: {partial} kept: it holds seeds {others}, which this row does not", file=sys.stderr)
        else:  # its seeds are in the row now
            shutil.rmtree(partial)
    print(json.dumps({k: v for k, v in row.items() if k != "curves"}, indent=2))
    if failed:
        sys.exit(f"error: {len(failed)} of {args.seeds} seeds failed ({'; '.join(failed)}); the row holds the others")


def distinct_packages(invocations: list[dict | None]) -> list[dict[str, str]]:
    """The Python and package versions the invocations (:func:`note_invocation`) ran with, each distinct set once."""
    sets = [{"python": r.get("python"), **r.get("packages", {})} for r in invocations if r is not None]
    return [dict(items) for items in dict.fromkeys(tuple(s.items()) for s in sets)]


def exact(x: float) -> str:
    """``x`` as short as ``:g`` writes it where that is exact (``475``), else every digit (``1234567.5``)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def shown(score: float, threshold: float | None) -> float:
    """A seed's final score as the table shows it: one decimal, more where one would put it on the other side of the
    threshold than it is (474.96 against 475 is shown 474.96, not 475.0)."""
    for digits in range(1, 7):
        rounded = round(score, digits)
        if threshold is None or (rounded >= threshold) == (score >= threshold):
            return rounded
    return score


MIN_EPISODES = 10  # the project's rule: a final score's evaluations play at least 10 greedy episodes each


def evaluation_notes(row: dict) -> str:
    """What the table says of a row whose evaluations break the rule for a final score: fewer than
    :data:`MIN_EPISODES` episodes, or games ``eval.max_steps`` cut before they ended (their returns so far
    counted); empty otherwise (and for rows recorded before the row kept them)."""
    episodes = [min(e) if isinstance(e, list) else e for e in row.get("eval_episodes_per_seed", []) if e is not None]
    cut = sum(row.get("eval_games_cut_per_seed", []))
    notes = []
    if episodes and min(episodes) < MIN_EPISODES:
        notes.append(f"evaluations of {min(episodes)} episodes, under {MIN_EPISODES}")
    if cut:
        notes.append(f"{cut} evaluation games cut at eval.max_steps")
    return "".join(f" ({note})" for note in notes)


HEADER = (
    "# Learning results\n\n"
    "One row per benchmark run (newest last); produced by `benchmarks/learning.py`, curves in `<name>.png` (or a "
    "figure a tuning study's rows share: `learning.py figure`), every "
    f"seed's evaluations in the row's line of `{ROWS}` (its `record` link, by line number).\n"
    "**Final score**: a run's mean greedy return over the last 10 % of its env steps (at least 3 evaluations of "
    "`eval.episodes` episodes, the last included). Across seeds: interquartile mean (IQM) with its 95 % "
    "stratified-bootstrap confidence interval (rliable; with 2 to 4 seeds it is exactly their [min, max] and the "
    "IQM their mean, with 4 the mean of the middle two, and such rows say so). Secondary: env steps at the first "
    "evaluation that "
    "reached the threshold (- = never).\n\n"
    "| benchmark | final score IQM [95 % CI] | final score per seed | seeds with final >= threshold "
    "| steps to threshold (first touch) | wall s / seed | env steps/s | machine, date | command |\n"
    "|---|---|---|---|---|---|---|---|---|\n"
)


def markdown_row(row: dict, line: int) -> str:
    """``row`` (the benchmark's JSON record) as a line of the results table, its name linking its curves (its own
    ``<name>.png``, or the figure it shares: :func:`shared_figure`) and its record (``line``, its line of
    ``learning-rows.jsonl``: ``#L<line>``, where a repository's file view scrolls to). A row of 1 to 4 seeds says that its CI is their [min, max] (:data:`FEW_SEEDS`): the
    interval adds nothing to the seeds. A diverged seed's score is marked, and one with an evaluation that was not
    finite; the code it ran is named (rows of before
    2026-11-29 have no record of it)."""
    steps = ", ".join("-" if s is None else str(s) for s in row["steps_to_threshold"]) or "n/a"
    rejudged = " re-judged" if "threshold_note" in row else ""  # against another bar than its command's (the note)
    thr = (f" (>= {row['threshold']:g}{rejudged}, {row['frames']} steps)" if row["threshold"] is not None
           else f" ({row['frames']} steps)")
    failed = f" FAILED: {len(row['failed'])}" if row["failed"] else ""
    low, high = row["final_score_ci95"]
    scores = row["final_score_per_seed"]
    seeds = row.get("seeds_finished", [None] * len(scores))
    marks = {seed: f" ({why})" for key, why in (("evaluation_not_finite_seeds", "an evaluation not finite"),
                                                  ("diverged_seeds", "diverged")) for seed in row.get(key, [])}
    per_seed = ", ".join(f"{v}{marks.get(seed, '')}" for seed, v in zip(seeds, scores))
    code = f", code {row['code']}" if "code" in row else ""
    seed_code = set(filter(None, row.get("seed_code", "").split(", ")))
    if seed_code and seed_code != set(row.get("code", "").split(", ")):
        # the code the seeds trained on, where the benchmark's invocations ran other code too (a row ported by a
        # checkout that trained nothing, a seed resumed by hand elsewhere)
        code += f" (seeds trained on {row['seed_code']})"
    return (
        f"| [{row['name']}]({row.get('figure', row['name'] + '.png')}) ([record]({ROWS}#L{line})){thr} | "
        f"{row['final_score_iqm']} [{low}, {high}]{FEW_SEEDS.get(len(scores), '')}{evaluation_notes(row)}{failed} | "
        f"{per_seed} | {row['final_score_at_threshold']} | {steps} | "
        f"{row['wall_time_s_per_seed']} | {row['env_steps_per_s']} | {row['machine']}, {row['date']}{code} | "
        f"`{row['command']}` |"
    )


# what the IQM and its 95 % CI are for so few seeds that the CI is exactly their [min, max] (:func:`iqm_with_ci`;
# rliable's IQM trims a quarter of the seeds at each end, none of 2 or 3)
FEW_SEEDS = {1: " (1 seed: no interval)", 2: " (2 seeds: mean [min, max])", 3: " (3 seeds: mean [min, max])",
             4: " (4 seeds: mean of the middle two [min, max])"}


def put_markdown_row(row: dict, path: Path) -> None:
    """``row`` as its line of the results table in ``path``: in place of the line of the same name (``--replace``:
    the figures it showed have no record any more), else the table's last line (the notes below it stay below).
    Its record is a line of the ``learning-rows.jsonl`` beside ``path`` already (:func:`write_row`, which keeps
    every record on its line: the links of the other rows stay right)."""
    if not path.exists():
        path.write_text(HEADER)
    line = markdown_row(row, record_line(path.parent / ROWS, row["name"]))
    lines = path.read_text().splitlines()
    end = lines.index(next(text for text in lines if text.startswith("| benchmark |")))  # the results table's header
    while end + 1 < len(lines) and lines[end + 1].startswith("|"):  # not the tables of the notes below it
        end += 1
    same_name = f"| [{row['name']}]("
    replaced = next((i for i in range(end + 1) if lines[i].startswith(same_name)), None)
    if replaced is None:
        lines.insert(end + 1, line)
    else:
        lines[replaced] = line
    tmp = path.with_suffix(".md.tmp")  # whole and atomically, as write_row: a kill leaves the table as it was
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)



GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
ALGOS = ("acer", "laser", "reactor")
COLORS = dict(zip(ALGOS, ("tab:blue", "tab:orange", "tab:green")))

# Young & Tian 2019 (MinAtar), read off the learning curves of the MinAtar repository (img/learning_curves.gif,
# 30 runs each): the moving average of training returns over 100 episodes at 5M frames (DQN's are
# epsilon-greedy, AC(0.8)'s the sampled policy's; ours are greedy evaluations). gymnax-blines' PPO at 10M steps
# (as issue 48 quotes them; none for Seaquest). Seaquest's curves are MinAtar <= 1.0.10 (the oxygen-bar bug).
ANCHORS = {
    "Asterix": {"DQN": 17.0, "AC(0.8)": 19.0, "PPO": 15.0},
    "Breakout": {"DQN": 10.0, "AC(0.8)": 17.5, "PPO": 28.0},
    "Freeway": {"DQN": 50.0, "AC(0.8)": 47.5, "PPO": 58.0},
    "Seaquest": {"DQN": 20.5, "AC(0.8)": 15.5, "PPO": None},
    "SpaceInvaders": {"DQN": 43.0, "AC(0.8)": 185.0, "PPO": 131.0},
}
NORMALISER = "AC(0.8)"

# The row that stands for an algorithm's preset on a game where its name is not ``<algo>-minatar-<game>``:
# LASER's preset took 4 updates a batch after its first Breakout row (settings/laser.py says why); ACER's Breakout
# row on the code with Atari frames stored once and the evaluator's fix (issue 45) replaces its first.
HEADLINE = {("laser", "Breakout"): "laser-minatar-breakout-updates4",
            ("acer", "Breakout"): "acer-minatar-breakout-framestore"}


def row_name(algo: str, game: str) -> str:
    return HEADLINE.get((algo, game), f"{algo}-minatar-{game.lower()}")


def finished_row(algo: str, game: str) -> dict | None:
    """The finished row's record (its line of ``learning-rows.jsonl``), or None where there is none."""
    return read_rows(RESULTS / ROWS).get(row_name(algo, game))


def finished_scores(algo: str, game: str) -> list[float] | None:
    """Per-seed final scores of the finished row, or None where there is none."""
    row = finished_row(algo, game)
    return None if row is None else [float(s) for s in row["final_score_per_seed"]]


def partial_scores(algo: str, game: str) -> list[float]:
    """Final scores of the seeds a partial record (``<row>-partial/seed<k>-summary.json``) holds."""
    folder = RESULTS / f"{row_name(algo, game)}-partial"
    summaries = sorted(folder.glob("seed*-summary.json")) if folder.exists() else []
    return [float(json.loads(p.read_text())["eval_return_mean"]) for p in summaries]


def cell(algo: str, game: str) -> str:
    row = finished_row(algo, game)
    if row is None:
        partial = partial_scores(algo, game)
        return f"partial: {', '.join(f'{s:.1f}' for s in partial)}" if partial else "-"
    (low, high), scores = row["final_score_ci95"], row["final_score_per_seed"]
    link = f"[{row['final_score_iqm']:.1f} [{low:.1f}, {high:.1f}]]({row_name(algo, game)}.png)"
    return f"{link}<br>{', '.join(f'{s:.1f}' for s in scores)}"


def three_seeds_note() -> str:
    """What a CI of 3 seeds says, for the table's rows that have 3 (:func:`learning.iqm_with_ci`)."""
    rows = [finished_scores(a, g) for a in ALGOS for g in GAMES]
    seeds = {len(r) for r in rows if r is not None}
    which = "Every row here has 3 seeds" if seeds == {3} else "A row of 3 seeds"
    return (f"{which}: its 95 % stratified-bootstrap CI is exactly [min, max] of them and its IQM their mean; the\n"
            "interval adds nothing to the seeds listed under it.")


def anchor(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def table() -> str:
    head = "| game | " + " | ".join(ALGOS) + " | DQN (5M frames) | AC(0.8) (5M frames) | PPO (10M steps) |"
    lines = [head, "|" + "---|" * (len(ALGOS) + 4)]
    for game in GAMES:
        anchors = ANCHORS[game]
        cells = [cell(algo, game) for algo in ALGOS]
        lines.append(f"| {game} | " + " | ".join(cells) + " | "
                     + " | ".join(anchor(anchors[k]) for k in ("DQN", "AC(0.8)", "PPO")) + " |")
    return "\n".join(lines)


def normalised_matrices(algos: list[str]) -> tuple[dict[str, np.ndarray], list[str]]:
    """``{algo: [seeds, games]}`` of final scores over the AC(0.8) anchor, on the games every one of ``algos`` has."""
    common = [g for g in GAMES if all(finished_scores(a, g) is not None for a in algos)]
    matrices = {}
    for algo in algos:
        columns = [np.asarray(finished_scores(algo, g)) / ANCHORS[g][NORMALISER] for g in common]
        seeds = min(len(c) for c in columns)
        matrices[algo] = np.stack([c[:seeds] for c in columns], axis=1)
    return matrices, common


def plot_aggregates(matrices: dict[str, np.ndarray], games: list[str], path: Path) -> None:
    from rliable import library as rly
    from rliable import metrics, plot_utils

    def aggregates(x):
        return np.array([metrics.aggregate_median(x), metrics.aggregate_iqm(x), metrics.aggregate_mean(x)])

    with numpy_global_seed(0):
        points, intervals = rly.get_interval_estimates(matrices, aggregates, reps=2_000)
    fig, _ = plot_utils.plot_interval_estimates(points, intervals, metric_names=["Median", "IQM", "Mean"],
                                                algorithms=list(matrices), colors=COLORS, row_height=0.6,
                                                xlabel=f"score / {NORMALISER} anchor", xlabel_y_coordinate=-0.3)
    fig.suptitle(f"MinAtar, 2M env steps: {', '.join(games)}", y=1.3)
    fig.savefig(path, dpi=100, bbox_inches="tight")


def plot_profiles(matrices: dict[str, np.ndarray], games: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import library as rly
    from rliable import plot_utils

    taus = np.linspace(0.0, 2.5, 101)
    with numpy_global_seed(0):
        profiles, cis = rly.create_performance_profile(matrices, taus, reps=2_000)
    fig, ax = plt.subplots(figsize=(6, 4))
    plot_utils.plot_performance_profiles(profiles, taus, performance_profile_cis=cis, colors=COLORS, ax=ax,
                                         xlabel=rf"score / {NORMALISER} anchor $(\tau)$")
    ax.legend(handles=[plt.Line2D([], [], color=COLORS[a], lw=2, label=a) for a in matrices], loc="upper right")
    ax.set_title(f"MinAtar performance profiles\n{', '.join(games)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def aggregate_plots(algos: list[str], suffix: str) -> str:
    """The aggregate and profile plots of ``algos`` on the games they all have; the summary's line linking them."""
    matrices, games = normalised_matrices(algos)
    plot_aggregates(matrices, games, RESULTS / f"minatar-aggregates{suffix}.png")
    plot_profiles(matrices, games, RESULTS / f"minatar-profiles{suffix}.png")
    return (f"- {', '.join(algos)} on {', '.join(games)}: [IQM, median and mean with 95 % CIs]"
            f"(minatar-aggregates{suffix}.png), [performance profiles](minatar-profiles{suffix}.png)")


def minatar_summary() -> None:
    """MinAtar at a glance (issue 48): final scores game x algorithm beside the published anchors, and rliable's
    aggregate plots of anchor-normalised scores.

        python benchmarks/learning.py minatar   # needs rliable: .venv/bin/pip install -c constraints.txt -e '.[bench]'

    Reads the rows ``benchmarks/learning.py`` committed (their lines of ``benchmarks/results/learning-rows.jsonl``:
    per-seed final scores, each the mean of the greedy evaluations over the last 10 % of the run's env steps) and writes
    ``benchmarks/results/minatar.md`` (the table), ``minatar-aggregates.png`` (IQM, median and mean of the
    normalised scores with 95 % stratified-bootstrap CIs) and ``minatar-profiles.png`` (performance profiles).
    A game an algorithm has no finished row for shows ``-`` (or the seeds a partial record holds, marked partial);
    the aggregates are drawn twice: every game for the algorithms that have them all (``minatar-aggregates.png``,
    ``minatar-profiles.png``), and every algorithm on the games they all have (``-all`` beside them), each saying which.
    """
    require_rliable()
    complete = [a for a in ALGOS if all(finished_scores(a, g) is not None for g in GAMES)]
    plots = [aggregate_plots(complete, "")]  # every game, the algorithms that have them all
    if len(complete) < len(ALGOS):
        plots.append(aggregate_plots(list(ALGOS), "-all"))  # every algorithm, the games they all have
    plot_lines = "\n".join(plots)
    text = f"""# MinAtar: five games, three algorithms

Final scores at 2M env steps (each seed's mean greedy evaluation over the last 10 % of its env steps; IQM with its
95 % stratified-bootstrap CI over seeds, then every seed; the link is the row's curves), each algorithm's
`minatar` preset, beside the anchors. Rows, commands and machines: [learning.md](learning.md). Made by
`python benchmarks/learning.py minatar`.

{table()}

{three_seeds_note()}

Anchors: Young & Tian 2019's DQN and AC(0.8), read off the MinAtar repository's learning curves at 5M frames
(moving average of training returns over 100 episodes: DQN's epsilon-greedy, AC's sampled; Seaquest's from
MinAtar <= 1.0.10); gymnax-blines' PPO at 10M steps. A cell marked partial lists the seeds of an unfinished
record (`<row>-partial/`). The anchors' protocol is not the rows': they are **training returns** of the acting
(exploring) policy, the rows **greedy evaluations**; Young & Tian's agents chose among **all 6 actions** (MinAtar's
`-v0`), the rows play the `-v1` ids, MinAtar's minimal action set of each game; MinAtar skips no frames, so a frame
is an env step: the DQN and AC(0.8) anchors come after 5M env steps, PPO's after 10M, the rows after 2M. They place a
row, they are not a like-for-like comparison. Every algorithm's row of a game is judged against the same bar,
{NORMALISER}'s (`--threshold` in learning.md; Reactor's first rows, run against DQN's, re-judged from their JSON).

Aggregates of the scores divided by the {NORMALISER} anchor, over the seeds and games each plot names (rliable, 2 000
stratified-bootstrap samples):
{plot_lines}
"""
    (RESULTS / "minatar.md").write_text(text)
    print(text)


def main() -> None:
    if sys.argv[1:2] == ["minatar"]:
        minatar_summary()
    elif sys.argv[1:2] == ["figure"]:
        shared_figure(sys.argv[2:])
    else:
        benchmark(sys.argv[1:])


if __name__ == "__main__":
    main()
