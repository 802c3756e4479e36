"""Main-process cost of the weight push after a batch: ``Trainer.sync_acting_policy()`` then the collector's
``update_policy_weights_()``, as ``Trainer.step`` calls them, with the preset's real workers collecting.

    python benchmarks/weight_push.py [--presets atari minatar] [--pushes 50] [--two-copies]

For each ACER preset: a trainer (its agent, its ``collector.workers`` worker processes) collects; after each
batch the learner's parameters are changed in place (as an update does), so that every push has new weights to
carry, and the push is timed: the learner's wall clock (``time.perf_counter``; on a loaded machine it also counts
the time the learner waited for a core) and its thread's CPU time (``time.thread_time``).
``--two-copies`` gives the trainer an acting copy apart from the learner's policy, the path of a GPU learner
(``sync_acting_policy`` then copies; here CPU to CPU). Prints a markdown table for
``benchmarks/results/weight_push.md``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import torch

from acer_torchrl.config import load_config
from acer_torchrl.trainer import Trainer


def push_times(preset: str, pushes: int, two_copies: bool) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each of ``pushes`` pushes, one after each collected batch of the ACER ``preset``."""
    cfg = load_config("acer", [f"preset={preset}", f"run_dir={tempfile.mkdtemp()}/run", "log.progress=false"])
    trainer = Trainer(cfg)
    if two_copies:
        trainer.acting = copy.deepcopy(trainer.agent.policy)
    wall, cpu = [], []
    with trainer.make_collector(10**12) as collector:
        batches = iter(collector)
        next(batches)
        for _ in range(pushes):
            next(batches)
            with torch.no_grad():
                for p in trainer.agent.policy.parameters():
                    p.mul_(1.0 + 1e-6)
            start, start_cpu = time.perf_counter(), time.thread_time()
            trainer.sync_acting_policy()
            collector.update_policy_weights_()
            wall.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - start_cpu)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["atari", "minatar"])
    parser.add_argument("--pushes", type=int, default=50)
    parser.add_argument("--two-copies", action="store_true", help="an acting copy apart from the learner's policy")
    args = parser.parse_args()
    print("| preset | acting policy | pushes | wall ms: median | mean | max | CPU ms: median | mean |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in args.presets:
        wall, cpu = ([1e3 * t for t in times] for times in push_times(preset, args.pushes, args.two_copies))
        acting = "a copy" if args.two_copies else "the learner's"
        print(f"| {preset} | {acting} | {len(wall)} | {statistics.median(wall):.3f} | {statistics.mean(wall):.3f} | "
              f"{max(wall):.3f} | {statistics.median(cpu):.3f} | {statistics.mean(cpu):.3f} |", flush=True)


if __name__ == "__main__":
    main()
