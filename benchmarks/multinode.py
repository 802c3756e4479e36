"""One learner collecting on one node vs on two nodes of a SLURM job, same number of collector processes.

    bash slurm/local_cluster.sh start --nodes 2
    .venv/bin/python benchmarks/multinode.py [--algo acer] [--preset cartpole] [--frames 20000]

Each configuration is a real job submitted with ``slurm/submit.py ... --wait``:

- one node: ``collector.workers=3``, one task (the learner and its three worker processes, batches through
  shared memory);
- two nodes: ``collector.workers=1 --nodes 2``, two tasks a node (the learner and collector rank 1 on the
  first node, ranks 2 and 3 on the second; batches and weights over ``torch.distributed``, TCP).

and each runs twice: collection only (``replay.min_size`` = the run's steps: updates start at its last batch,
the transport's cost shows) and training (the preset as it is). Env steps/s are read from each run's ``summary.json``.
Prints a markdown table for ``benchmarks/results/multinode.md``. On the local test cluster both nodes share
this machine's cores (no real network between them): the figures compare transports, not scaling.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {  # name: (nodes, collector.workers, --cpus a task)
    "1 node: learner + 3 worker processes": (1, 3, 2),
    "2 nodes: learner + 3 collector ranks (1 + 2)": (2, 1, 1),
}
MODES = {"collection only": lambda frames: [f"replay.min_size={frames}", f"replay.capacity={2 * frames}"],
         "training": lambda frames: []}


def run(algo: str, preset: str, frames: int, nodes: int, workers: int, cpus: int, extra: list[str], run_dir: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "slurm" / "submit.py"), algo, f"preset={preset}", f"total_frames={frames}",
           f"collector.workers={workers}", "log.progress=false", "eval.interval=1000000000", "device=cpu",
           f"run_dir={run_dir}", *extra, "--nodes", str(nodes), "--cpus", str(cpus), "--time", "60", "--wait"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout}{out.stderr}")
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="acer")
    parser.add_argument("--preset", default="cartpole")
    parser.add_argument("--frames", type=int, default=20000)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (mode, overrides) in enumerate(MODES.items()):
            extra = overrides(args.frames)
            for name, (nodes, workers, cpus) in CONFIGS.items():
                s = run(args.algo, args.preset, args.frames, nodes, workers, cpus, extra, Path(tmp) / f"{i}-{nodes}")
                rows.append(f"| {mode} | {name} | {s['env_steps']} | {s['updates']} | {s['wall_time_s']:.1f} | "
                            f"{s['env_steps_per_s']:.0f} |")
                print(rows[-1], flush=True)
    print(f"\n{args.algo} preset={args.preset}, {args.frames} env steps a run, {time.strftime('%Y-%m-%d %H:%M')}\n")
    print("| mode | job | env steps | updates | wall s | env steps/s |\n|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
