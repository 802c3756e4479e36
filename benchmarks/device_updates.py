"""Learner updates per second of a preset on each device (``device=cuda`` against ``device=cpu``), on one
replay filled once in-process, with no collector running: the learner's own ceiling on that machine.

    python benchmarks/device_updates.py acer atari --devices cuda cpu --updates 200 --out results.json

Every device gets a trainer of its own (same seed, so the same initial weights) over the same stored steps;
each times ``--updates`` full updates (batch draw, loss, backward, clipping, Adam, target / average networks,
the loss's write-backs) by wall clock after 10 warm-up updates. The statistics of every update are read back
to the host (``Trainer.update`` does), so every timed update ends synchronised with the GPU.
"""

import argparse
import cProfile
import json
import os
import platform
import pstats
import tempfile
import time
from pathlib import Path

import torch

from acer_torchrl.config import load_config
from acer_torchrl.trainer import Trainer


def timed_updates(trainer: Trainer, updates: int) -> float:
    shares = [s for _ in range(updates) for s in trainer.loss.update_plan(trainer.rng)][:updates]
    shares += [0.0] * (updates - len(shares))
    for share in shares[:10]:
        trainer.update(trainer.draw_batch(share))
    start = time.perf_counter()
    for share in shares:
        trainer.update(trainer.draw_batch(share))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("preset")
    parser.add_argument("--devices", nargs="+", default=["cuda", "cpu"])
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--stored", type=int, default=5_000, help="env steps in the replay before timing")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", action="store_true", help="cProfile's top entries of each device's updates")
    args, overrides = parser.parse_known_args()
    tmp = tempfile.mkdtemp()
    base = [f"preset={args.preset}", "collector.workers=0", "log.progress=false", "replay.memmap=false",
            f"replay.min_size={args.stored // 2}", *overrides]
    filled = None
    rows = []
    for device in args.devices:
        trainer = Trainer(load_config(args.algo, [*base, f"device={device}", f"run_dir={tmp}/{device}"]))
        if filled is None:
            trainer.fill_replay(args.stored)
            filled = trainer.replay, trainer.online
        trainer.replay, trainer.online = filled  # the same stored steps and the same online windows
        if args.profile:
            profile = cProfile.Profile()
            seconds = profile.runcall(timed_updates, trainer, args.updates)
            pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
        else:
            seconds = timed_updates(trainer, args.updates)
        cfg = trainer.cfg
        rows.append({"device": device, "updates": args.updates, "seconds": round(seconds, 3),
                     "updates_per_s": round(args.updates / seconds, 1), "threads": torch.get_num_threads(),
                     "batch": [cfg.replay.batch_size, trainer.loss.seq_len]})
        print(f"{args.algo}:{args.preset} on {device}: {rows[-1]['updates_per_s']} updates/s "
              f"(batch {cfg.replay.batch_size} x {trainer.loss.seq_len}, {torch.get_num_threads()} threads)", flush=True)
    result = {"preset": f"{args.algo}:{args.preset}", "overrides": overrides, "stored_steps": len(filled[0]),
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "cpus": os.cpu_count(), "machine": platform.machine(), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
