"""Learning benchmark: several seeds of one recipe, a curve plot and a row in ``results/learning.md``.

    python benchmarks/learning.py <algo> <preset> --seeds 5 --frames 50000 --threshold 475 [--parallel 2] [key=value ...]
    python benchmarks/learning.py <algo> <preset> ... --resume runs/benchmarks/<name>-<date>   # after a stop

Each seed is a separate recipe run (``recipes/<algo>.py``) in its own process; ``--parallel`` of them at a
time. Reads each run's ``summary.json`` and ``metrics.csv`` and records per seed the **final score** (the mean
greedy return over the last 10 % of the run's env steps, :func:`acer_torchrl.metrics.final_score`), across
seeds its interquartile mean with a 95 % stratified-bootstrap confidence interval (``rliable``, the ``bench``
extra: ``pip install -e '.[bench]'``), and, as secondary figures, the env steps at which the greedy
evaluation first reached the threshold, wall time and env steps/s.

SIGINT or SIGTERM, to the benchmark alone or to its whole group, stops the running seeds (each checkpoints) and
starts no further seed; ``--resume`` then goes on from there.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import platform
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

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


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


def run_seed(algo: str, preset: str, seed: int, frames: int, run_dir: Path, extra: list[str]) -> dict:
    """One seed's recipe run in ``run_dir``; a run already there is resumed from its checkpoint (or, when
    it has finished, only read). Once a run was interrupted (it checkpointed), no further seed starts."""
    if INTERRUPTED.is_set():
        return {"seed": seed, "failed": "not started: the benchmark was interrupted"}
    if (run_dir / "config.yaml").exists():
        cmd = [f"resume={run_dir}", "log.progress=false"]
    else:
        cmd = [f"preset={preset}", f"seed={seed}", f"total_frames={frames}", f"run_dir={run_dir}",
               "log.progress=false", *extra]
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
    with (run_dir / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("eval_return_mean")]
    summary["curve"] = [(int(float(r["env_steps"])), float(r["eval_return_mean"])) for r in rows]
    summary["seed"] = seed
    summary["final_score"] = final_score(summary["curve"], summary["env_steps"]).mean
    return summary


def iqm_with_ci(scores: list[float], reps: int = 50_000, seed: int = 0) -> tuple[float, float, float]:
    """Interquartile mean of per-seed final scores with its 95 % stratified-bootstrap confidence interval
    (Agarwal et al. 2021, computed by ``rliable``)."""
    from rliable import library as rly
    from rliable import metrics

    point, interval = rly.get_interval_estimates(
        {"run": np.asarray(scores, dtype=float).reshape(-1, 1)},
        lambda x: np.array([metrics.aggregate_iqm(x)]),
        reps=reps,
        random_state=np.random.RandomState(seed),
    )
    return float(point["run"][0]), float(interval["run"][0, 0]), float(interval["run"][1, 0])


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
        grid = np.array(sorted({s for c in curves for s, _ in c}))
        interp = np.array([np.interp(grid, *zip(*c)) for c in curves])
        ax.plot(grid, interp.mean(0), color="tab:blue", lw=2, label=f"mean of {len(curves)} seeds")
        ax.fill_between(grid, interp.min(0), interp.max(0), color="tab:blue", alpha=0.15, label="min-max")
        ax.axvspan((1.0 - FINAL_WINDOW) * grid[-1], grid[-1], color="tab:orange", alpha=0.12, label="final-score window")
    finish_plot(fig, ax, path, title, "env steps", "greedy evaluation return", threshold)


def main() -> None:
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
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="where the row's <name>.json/.png go and learning.md is extended (default %(default)s)")
    parser.add_argument("--replace", action="store_true",
                        help="overwrite an existing <name>.json/.png (refused otherwise: they back a committed row)")
    args, extra = parser.parse_known_args()
    name = args.name or f"{args.algo}-{args.preset}"
    if (args.results / f"{name}.json").exists() and not args.replace:
        parser.error(f"{args.results / name}.json already holds a result: give another --name, or --replace")
    require_rliable()
    bench_dir = args.resume or args.runs / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.resume is not None and not args.resume.is_dir():
        parser.error(f"--resume {args.resume}: no such benchmark directory")
    start = time.time()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward_stop)
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(
            lambda s: run_seed(args.algo, args.preset, s, args.frames, bench_dir / f"seed{s}", extra),
            range(args.first_seed, args.first_seed + args.seeds),
        ))
    elapsed = time.time() - start
    if INTERRUPTED.is_set():
        resume = [] if args.resume else ["--resume", str(bench_dir)]
        again = shell_command(os.path.abspath(sys.argv[0]), *sys.argv[1:], *resume)
        sys.exit(f"interrupted; the runs are checkpointed: continue with {again}")
    args.results.mkdir(parents=True, exist_ok=True)
    plot(results, args.results / f"{name}.png", f"{args.algo} {args.preset} ({args.seeds} seeds)", args.threshold)
    ok = [r for r in results if "failed" not in r]
    finals = [r["final_score"] for r in ok]
    iqm, ci_low, ci_high = iqm_with_ci(finals) if finals else (None, None, None)
    reached = [steps_to(r["curve"], args.threshold) for r in ok] if args.threshold is not None else []
    command = " ".join(["python benchmarks/learning.py", args.algo, args.preset, f"--seeds {args.seeds}"]
                       + ([f"--first-seed {args.first_seed}"] if args.first_seed else []) + [f"--frames {args.frames}"] + ([f"--threshold {args.threshold:g}"] if args.threshold is not None else [])
                       + [f"--parallel {args.parallel}"] + ([f"--name {args.name}"] if args.name else []) + extra)
    row = {
        "name": name,
        "seeds": args.seeds,
        "first_seed": args.first_seed,
        "frames": args.frames,
        "threshold": args.threshold,
        "final_score_iqm": _round(iqm),
        "final_score_ci95": [_round(ci_low), _round(ci_high)],
        "final_score_per_seed": [round(f, 1) for f in finals],
        "final_score_at_threshold": (f"{sum(f >= args.threshold for f in finals)}/{args.seeds}"
                                     if args.threshold is not None else "n/a"),
        "steps_to_threshold": [s for s in reached],
        "eval_return_last_per_seed": [round(r["curve"][-1][1], 1) for r in ok],
        "eval_episodes": ok[0].get("eval_episodes") if ok else None,
        "wall_time_s_per_seed": round(float(np.mean([r["wall_time_s"] for r in ok])), 1) if ok else None,
        "env_steps_per_s": round(float(np.mean([r["env_steps_per_s"] for r in ok])), 1) if ok else None,
        "curves": {str(r["seed"]): r["curve"] for r in ok},
        "failed": [r["failed"] for r in results if "failed" in r],
        "total_wall_s": round(elapsed, 1),
        "command": command,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU" if not _has_cuda() else "GPU",
        "date": time.strftime("%Y-%m-%d"),
    }
    (args.results / f"{name}.json").write_text(json.dumps(row, indent=2))
    append_markdown(row, args.results / "learning.md")
    print(json.dumps({k: v for k, v in row.items() if k != "curves"}, indent=2))


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


HEADER = (
    "# Learning results\n\n"
    "One row per benchmark run (newest last); produced by `benchmarks/learning.py`, curves in `<name>.png`, every "
    "seed's evaluations in `<name>.json`.\n"
    "**Final score**: a run's mean greedy return over the last 10 % of its env steps (at least 3 evaluations of "
    "`eval.episodes` episodes, the last included). Across seeds: interquartile mean (IQM) with its 95 % "
    "stratified-bootstrap confidence interval (rliable). Secondary: env steps at the first evaluation that "
    "reached the threshold (- = never).\n\n"
    "| benchmark | final score IQM [95 % CI] | final score per seed | seeds with final >= threshold "
    "| steps to threshold (first touch) | wall s / seed | env steps/s | machine, date | command |\n"
    "|---|---|---|---|---|---|---|---|---|\n"
)


def append_markdown(row: dict, path: Path) -> None:
    """Add ``row`` as the last line of the results table in ``path`` (the notes below the table stay below it)."""
    if not path.exists():
        path.write_text(HEADER)
    steps = ", ".join("-" if s is None else str(s) for s in row["steps_to_threshold"]) or "n/a"
    thr = f" (>= {row['threshold']:g}, {row['frames']} steps)" if row["threshold"] is not None else f" ({row['frames']} steps)"
    failed = f" FAILED: {len(row['failed'])}" if row["failed"] else ""
    low, high = row["final_score_ci95"]
    line = (
        f"| [{row['name']}]({row['name']}.png){thr} | {row['final_score_iqm']} [{low}, {high}]{failed} | "
        f"{', '.join(str(v) for v in row['final_score_per_seed'])} | {row['final_score_at_threshold']} | {steps} | "
        f"{row['wall_time_s_per_seed']} | {row['env_steps_per_s']} | {row['machine']}, {row['date']} | "
        f"`{row['command']}` |"
    )
    lines = path.read_text().splitlines()
    end = lines.index(next(text for text in lines if text.startswith("| benchmark |")))  # the results table's header
    while end + 1 < len(lines) and lines[end + 1].startswith("|"):  # not the tables of the notes below it
        end += 1
    lines.insert(end + 1, line)
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
