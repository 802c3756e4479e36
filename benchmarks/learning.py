"""Learning benchmark: several seeds of one recipe, a curve plot and a row in ``results/learning.md``.

    python benchmarks/learning.py <algo> <preset> --seeds 5 --frames 50000 --threshold 475 [--parallel 2] [key=value ...]
    python benchmarks/learning.py <algo> <preset> ... --resume runs/benchmarks/<name>-<date>   # after a kill

Each seed is a separate recipe run (``recipes/<algo>.py``) in its own process; ``--parallel`` of them at a
time. Reads each run's ``summary.json`` and ``metrics.csv`` and records: env steps at which the greedy
evaluation first reached the threshold (per seed), the final greedy return, wall time and env steps/s.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def run_seed(algo: str, preset: str, seed: int, frames: int, run_dir: Path, extra: list[str]) -> dict:
    """One seed's recipe run in ``run_dir``; a run already there is resumed from its checkpoint (or, when
    it has finished, only read)."""
    if (run_dir / "config.yaml").exists():
        cmd = [f"resume={run_dir}", "log.progress=false"]
    else:
        cmd = [f"preset={preset}", f"seed={seed}", f"total_frames={frames}", f"run_dir={run_dir}",
               "log.progress=false", *extra]
    log = run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "summary.json").exists():
        with log.open("a") as f:
            proc = subprocess.run([sys.executable, str(ROOT / "recipes" / f"{algo}.py"), *cmd],
                                  stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        if proc.returncode != 0:
            return {"seed": seed, "failed": f"exit {proc.returncode}, see {log}"}
    summary = json.loads((run_dir / "summary.json").read_text())
    with (run_dir / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("eval_return_mean")]
    summary["curve"] = [(int(float(r["env_steps"])), float(r["eval_return_mean"])) for r in rows]
    summary["seed"] = seed
    return summary


def steps_to(curve: list[tuple[int, float]], threshold: float) -> int | None:
    return next((s for s, r in curve if r >= threshold), None)


def plot(results: list[dict], path: Path, title: str, threshold: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    curves = [r["curve"] for r in results if "curve" in r and r["curve"]]
    for curve in curves:
        ax.plot(*zip(*curve), color="tab:blue", alpha=0.25, lw=1)
    if curves:
        grid = np.array(sorted({s for c in curves for s, _ in c}))
        interp = np.array([np.interp(grid, *zip(*c)) for c in curves])
        ax.plot(grid, interp.mean(0), color="tab:blue", lw=2, label=f"mean of {len(curves)} seeds")
        ax.fill_between(grid, interp.min(0), interp.max(0), color="tab:blue", alpha=0.15, label="min-max")
    finish_plot(fig, ax, path, title, threshold, "env steps", "greedy evaluation return")


def finish_plot(fig, ax, path: Path, title: str, threshold: float | None, xlabel: str, ylabel: str) -> None:
    """Threshold line, labels, legend and grid; save ``fig`` to ``path`` and close it."""
    import matplotlib.pyplot as plt

    if threshold is not None:
        ax.axhline(threshold, color="k", ls="--", lw=1, label=f"threshold {threshold:g}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("preset")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--threshold", type=float, default=None)
    parser.add_argument("--parallel", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--name", default=None, help="label of the row and file stem (default algo-preset)")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "benchmarks")
    parser.add_argument("--resume", type=Path, default=None,
                        help="a killed benchmark's directory (<runs>/<name>-<date>): finished seeds are read, "
                             "the others resume from their checkpoints, missing ones start")
    args, extra = parser.parse_known_args()
    name = args.name or f"{args.algo}-{args.preset}"
    bench_dir = args.resume or args.runs / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.resume is not None and not args.resume.is_dir():
        parser.error(f"--resume {args.resume}: no such benchmark directory")
    start = time.time()
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(
            lambda s: run_seed(args.algo, args.preset, s, args.frames, bench_dir / f"seed{s}", extra),
            range(args.seeds),
        ))
    elapsed = time.time() - start
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(results, RESULTS / f"{name}.png", f"{args.algo} {args.preset} ({args.seeds} seeds)", args.threshold)
    ok = [r for r in results if "failed" not in r]
    reached = [steps_to(r["curve"], args.threshold) for r in ok] if args.threshold is not None else []
    finals = [r["eval_return_mean"] for r in ok]
    n_reached = sum(s is not None for s in reached)
    command = " ".join(["python benchmarks/learning.py", args.algo, args.preset, f"--seeds {args.seeds}",
                        f"--frames {args.frames}"] + ([f"--threshold {args.threshold:g}"] if args.threshold is not None else [])
                       + [f"--parallel {args.parallel}"] + ([f"--name {args.name}"] if args.name else []) + extra)
    row = {
        "name": name,
        "seeds": args.seeds,
        "frames": args.frames,
        "threshold": args.threshold,
        "reached": f"{n_reached}/{args.seeds}" if args.threshold is not None else "n/a",
        "steps_to_threshold": [s for s in reached],
        "final_greedy_mean": round(float(np.mean(finals)), 1) if finals else None,
        "final_greedy_per_seed": [round(f, 1) for f in finals],
        "wall_time_s_per_seed": round(float(np.mean([r["wall_time_s"] for r in ok])), 1) if ok else None,
        "env_steps_per_s": round(float(np.mean([r["env_steps_per_s"] for r in ok])), 1) if ok else None,
        "failed": [r["failed"] for r in results if "failed" in r],
        "total_wall_s": round(elapsed, 1),
        "command": command,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, no GPU" if not _has_cuda() else "GPU",
        "date": time.strftime("%Y-%m-%d"),
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(row, indent=2))
    append_markdown(row)
    print(json.dumps(row, indent=2))


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def append_markdown(row: dict) -> None:
    path = RESULTS / "learning.md"
    if not path.exists():
        path.write_text(
            "# Learning results\n\nOne row per benchmark run (newest last); produced by `benchmarks/learning.py`.\n"
            "Steps to threshold: env steps at the first greedy evaluation reaching it (per seed; - = never).\n\n"
            "| benchmark | seeds reaching threshold | steps to threshold | final greedy return (mean; per seed) "
            "| wall s / seed | env steps/s | machine, date | command |\n|---|---|---|---|---|---|---|---|\n"
        )
    steps = ", ".join("-" if s is None else str(s) for s in row["steps_to_threshold"]) or "n/a"
    thr = f" (>= {row['threshold']:g} within {row['frames']})" if row["threshold"] is not None else f" ({row['frames']} steps)"
    failed = f" FAILED: {len(row['failed'])}" if row["failed"] else ""
    with path.open("a") as f:
        f.write(
            f"| {row['name']}{thr} | {row['reached']}{failed} | {steps} | {row['final_greedy_mean']}; "
            f"{row['final_greedy_per_seed']} | {row['wall_time_s_per_seed']} | {row['env_steps_per_s']} | "
            f"{row['machine']}, {row['date']} | `{row['command']}` |\n"
        )


if __name__ == "__main__":
    main()
