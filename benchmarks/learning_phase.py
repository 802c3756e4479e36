"""Env steps per second of runs once their updates have started (the learning phase), from their run directories.

    python recipes/vracer.py preset=mujoco env.name=Hopper-v5 total_frames=100000 seed=1 run_dir=runs/hopper-s1
    python benchmarks/learning_phase.py runs/hopper-s1 [more run dirs] --from 25000

A run's whole-run figure (``summary.json``'s ``env_steps_per_s``) includes the warm-up, where the collectors fill the
replay at their own speed with no update (V-RACER's mujoco preset: 10 000 steps). This one is the env steps between
the first logged row at or after ``--from`` steps and the last row, over the wall time between them (each row's
``wall_time_s`` is taken when its evaluation is asked for, so evaluations still being played do not count).
"""

import argparse
import csv
import json
from pathlib import Path


def learning_phase(run_dir: Path, start: int) -> dict:
    """The learning-phase figures of one run directory (``metrics.csv`` and ``summary.json``)."""
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    first = next((r for r in rows if int(r["env_steps"]) >= start), None)
    last = rows[-1]
    if first is None or first is last:
        raise SystemExit(f"{run_dir}: no two logged rows from {start} env steps on (its last: {last['env_steps']})")
    steps = int(last["env_steps"]) - int(first["env_steps"])
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "run": str(run_dir),
        "from": int(first["env_steps"]),
        "to": int(last["env_steps"]),
        "env_steps_per_s": round(steps / (float(last["wall_time_s"]) - float(first["wall_time_s"])), 1),
        "whole_run_env_steps_per_s": summary["env_steps_per_s"],
        "learner_cpu_per_wall_s": summary["learner_cpu_per_wall_s"],
        "final_score": round(summary["eval_return_mean"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--from", dest="start", type=int, default=25000, help="env steps where the phase starts")
    args = parser.parse_args()
    for run_dir in args.run_dirs:
        print(json.dumps(learning_phase(run_dir, args.start)))


if __name__ == "__main__":
    main()
