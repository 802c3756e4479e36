"""Where the main process's time goes in a real training run: a cost breakdown per collected batch.

    python benchmarks/pipeline_costs.py <algo> <preset> [--seconds 60] [--out costs.json] [key=value ...]
    python benchmarks/pipeline_costs.py acer atari --seconds 90 replay.min_size=2000 device=cpu
    python benchmarks/pipeline_costs.py push [--presets atari minatar] [--pushes 50] [--two-copies]

``push`` times the weight push alone (its function's docstring; ``push --help``). Otherwise:

Runs the recipe's :class:`~acer_torchrl.trainer.Trainer` as ``python recipes/<algo>.py`` would (real worker
processes, the background evaluator, checkpoints when due) for ``--seconds`` of its learning phase (from the
first update on; the replay's warm-up is not timed), and reports the main process's milliseconds per collected
batch in:

* ``receive``: inside the collector's iterator, on the main thread's CPU (taking the batch out of the workers'
  hands), and ``wait``: the rest of the time in the iterator (the learner idle, waiting for a batch);
* ``store``: the loss's preprocessing and the replay write (:meth:`Trainer.store`);
* ``draw``: drawing the batches of the updates (:meth:`Trainer.planned_batches`; with ``replay.prefetch=true``
  the main thread's wait for a batch the ``draw-ahead`` thread drew while the update before ran);
* ``update``: the updates themselves (:meth:`Trainer.update`: loss, backward, clipping, Adam, target networks);
* ``push``: the weight push to the workers (``sync_acting_policy`` + ``update_policy_weights_``);
* ``checkpoint``: periodic checkpoints (listed apart: they come every ``log.checkpoint_interval`` steps);
* ``rest``: everything else the loop does (logging, evaluations' bookkeeping, the progress bar).

Then, with the collector shut down, the same trainer times ``--alone`` updates (draw + update) on the replay the
run filled: the learner's rate on its own. **Loop efficiency** = the in-loop updates/s over that rate. On a
machine whose cores the workers share (this 2-core VM), the in-loop rate is also slowed by the workers
competing for the cores: read it with that in mind; ``overhead`` = (store + draw + push + receive + rest) / update
is the share that the loop's own bookkeeping adds to the update time.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from acer_torchrl.config import load_config
from acer_torchrl.trainer import Trainer
from learner import timed_updates  # benchmarks/ is the script's directory

PARTS = ("receive", "wait", "store", "draw", "update", "push", "checkpoint", "rest")


class TimedTrainer(Trainer):
    """A :class:`Trainer` whose main-process phases are timed (perf_counter) once the learning phase began."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.seconds: dict[str, float] = defaultdict(float)
        self.batches = 0
        self.timing = False  # from the first update on

    def _timed(self, part: str, fn, *args):
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            if self.timing:
                self.seconds[part] += time.perf_counter() - start

    def store(self, batch):
        return self._timed("store", super().store, batch)

    def planned_batches(self, shares):
        """The plan's batches, the main thread's time to get each timed as ``draw`` (with ``replay.prefetch``: the
        wait for the batch the ``draw-ahead`` thread drew during the update before)."""
        samples = super().planned_batches(shares)
        try:
            while (sample := self._timed("draw", next, samples, None)) is not None:
                yield sample
        finally:
            samples.close()

    def update(self, batch):
        self.timing = True
        self.threads = torch.get_num_threads()
        return self._timed("update", super().update, batch)

    def sync_acting_policy(self):
        return self._timed("push", super().sync_acting_policy)

    def checkpoint(self):
        return self._timed("checkpoint", super().checkpoint)

    def step(self, batch):
        timing = self.timing
        start = time.perf_counter()
        done = super().step(batch)
        if not done and self.checkpoint_due():  # what RunGuard does after each batch of a run
            self.periodic_checkpoint()
        if timing:
            self.seconds["step"] += time.perf_counter() - start
            self.batches += 1
        return done


def timed_run(trainer: TimedTrainer, seconds: float) -> tuple[float, int]:
    """Step the trainer until ``seconds`` of its learning phase passed; returns that phase's wall seconds and
    the updates taken in it."""
    batches = trainer.start()
    push = trainer._collector.update_policy_weights_
    trainer._collector.update_policy_weights_ = lambda *a, **k: trainer._timed("push", push, *a, **k)
    begin, updates0 = None, 0
    while True:
        cpu, wall = time.thread_time(), time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            break
        if begin is not None:
            cpu = time.thread_time() - cpu
            trainer.seconds["receive"] += cpu
            trainer.seconds["wait"] += max(time.perf_counter() - wall - cpu, 0.0)
        if trainer.step(batch):
            break
        if begin is None and trainer.timing:  # the first batch with updates: the learning phase starts after it
            begin, updates0 = time.perf_counter(), trainer.counters.updates
            trainer.seconds.clear()
            trainer.batches = 0
        elif begin is not None and time.perf_counter() - begin >= seconds:
            break
    elapsed = time.perf_counter() - (begin or time.perf_counter())
    trainer.stop_collecting()
    return elapsed, trainer.counters.updates - updates0


def breakdown(trainer: TimedTrainer, elapsed: float, updates: int) -> dict:
    """The per-batch table and the loop's figures of a timed run (before the updates timed alone)."""
    s, n = defaultdict(float, trainer.seconds), max(trainer.batches, 1)
    s["rest"] = s["step"] - sum(s[p] for p in ("store", "draw", "update", "push", "checkpoint"))
    per_batch = {p: round(1e3 * s[p] / n, 2) for p in PARTS}
    bookkeeping = sum(s[p] for p in ("receive", "store", "draw", "push", "rest"))
    in_loop = updates / max(elapsed, 1e-9)
    return {
        "batches": trainer.batches,
        "updates": updates,
        "seconds": round(elapsed, 1),
        "env_steps_per_s": round(trainer.batches * trainer.cfg.collector.frames_per_batch / max(elapsed, 1e-9), 1),
        "ms_per_batch": per_batch,
        "updates_per_batch": round(updates / n, 2),
        "ms_per_update": round(1e3 * s["update"] / max(updates, 1), 2),
        "ms_per_draw": round(1e3 * s["draw"] / max(updates, 1), 2),
        "in_loop_updates_per_s": round(in_loop, 1),
        # the main process's time that is neither the update nor waiting for data, over the update time
        "overhead": round(bookkeeping / max(s["update"], 1e-9), 3),
    }


def cost_breakdown(argv: list[str]) -> None:
    """The breakdown of a run's main-process time per batch (the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("preset")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the timed learning phase")
    parser.add_argument("--alone", type=int, default=100, help="updates timed alone after the run")
    parser.add_argument("--out", type=Path, default=None, help="append the result as one JSON line")
    args, overrides = parser.parse_known_args(argv)
    run_dir = tempfile.mkdtemp(prefix="pipeline-costs-")
    cfg = load_config(args.algo, [f"preset={args.preset}", f"run_dir={run_dir}/run", "log.progress=false", *overrides])
    trainer = TimedTrainer(cfg)
    try:
        elapsed, updates = timed_run(trainer, args.seconds)
        if not trainer.timing:
            raise SystemExit("no update was taken: lower replay.min_size or raise --seconds")
        result = breakdown(trainer, elapsed, updates)
        # TorchRL's collector restores the process's thread count at shutdown: time alone with the loop's
        torch.set_num_threads(trainer.threads)
        alone = args.alone / timed_updates(trainer, args.alone)  # after 10 warm-up updates
        result.update(alone_updates_per_s=round(alone, 1),
                      loop_efficiency=round(result["in_loop_updates_per_s"] / alone, 3))
    finally:
        trainer.close()
    result = {"preset": f"{args.algo}:{args.preset}", "overrides": overrides, "device": str(trainer.device),
              "workers": cfg.collector.workers, "threads": trainer.threads, "cpus": os.cpu_count(),
              "machine": platform.machine(), "torch": torch.__version__, **result}
    table = " | ".join(f"{p} {v}" for p, v in result["ms_per_batch"].items())
    print(f"{result['preset']} {' '.join(overrides)}: ms per batch: {table}")
    print(f"  {result['updates_per_batch']} updates a batch, {result['ms_per_update']} ms an update, "
          f"{result['ms_per_draw']} ms a draw; {result['env_steps_per_s']} env steps/s; in-loop "
          f"{result['in_loop_updates_per_s']} updates/s, alone {result['alone_updates_per_s']}: loop efficiency "
          f"{result['loop_efficiency']}; overhead (neither update nor wait) / update {result['overhead']}")
    if args.out:
        with args.out.open("a") as f:
            f.write(json.dumps(result) + "\n")


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


def weight_push(argv: list[str]) -> None:
    """Main-process cost of the weight push after a batch: ``Trainer.sync_acting_policy()`` then the collector's
    ``update_policy_weights_()``, as ``Trainer.step`` calls them, with the preset's real workers collecting.

        python benchmarks/pipeline_costs.py push [--presets atari minatar] [--pushes 50] [--two-copies]

    For each ACER preset: a trainer (its agent, its ``collector.workers`` worker processes) collects; after each
    batch the learner's parameters are changed in place (as an update does), so that every push has new weights to
    carry, and the push is timed: the learner's wall clock (``time.perf_counter``; on a loaded machine it also counts
    the time the learner waited for a core) and its thread's CPU time (``time.thread_time``).
    ``--two-copies`` gives the trainer an acting copy apart from the learner's policy, the path of a GPU learner
    (``sync_acting_policy`` then copies; here CPU to CPU). Prints a markdown table for
    ``benchmarks/results/weight_push.md``.
    """
    parser = argparse.ArgumentParser(prog="pipeline_costs.py push", description=weight_push.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["atari", "minatar"])
    parser.add_argument("--pushes", type=int, default=50)
    parser.add_argument("--two-copies", action="store_true", help="an acting copy apart from the learner's policy")
    args = parser.parse_args(argv)
    print("| preset | acting policy | pushes | wall ms: median | mean | max | CPU ms: median | mean |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in args.presets:
        wall, cpu = ([1e3 * t for t in times] for times in push_times(preset, args.pushes, args.two_copies))
        acting = "a copy" if args.two_copies else "the learner's"
        print(f"| {preset} | {acting} | {len(wall)} | {statistics.median(wall):.3f} | {statistics.mean(wall):.3f} | "
              f"{max(wall):.3f} | {statistics.median(cpu):.3f} | {statistics.mean(cpu):.3f} |", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["push"]:
        weight_push(sys.argv[2:])
    else:
        cost_breakdown(sys.argv[1:])


if __name__ == "__main__":
    main()
