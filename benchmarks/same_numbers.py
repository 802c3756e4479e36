"""A fingerprint of a fixed-seed training run in one process, to show that a speed-up changed no number.

    python benchmarks/same_numbers.py vracer mujoco --updates 1500 env.name=Hopper-v5 replay.min_size=3000
    PYTHONPATH=<checkout of the code before> python benchmarks/same_numbers.py ...   # the same line, old code

Collects in the learner's process (``collector.workers=0``: no scheduling between processes, so the run is
deterministic), stores each batch and takes the loss's planned updates as ``Trainer.step`` does, until
``--updates`` updates; prints their CPU time and the SHA-256 of every update's statistics, the loss's final
state (parameters and buffers) and, for an agent that keeps per-step estimates (V-RACER's ``VRACEREstimates``),
their statistics and stored columns.
Equal hashes: the same parameters, the same stored estimates and the same statistics at every update.
"""

import argparse
import hashlib
import tempfile
import time

import torch

from acer_torchrl.config import load_config
from acer_torchrl.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("preset")
    parser.add_argument("--updates", type=int, default=1500)
    args, overrides = parser.parse_known_args()
    cfg = load_config(args.algo, [f"preset={args.preset}", "collector.workers=0", f"run_dir={tempfile.mkdtemp()}/run",
                                  "log.progress=false", *overrides])
    trainer = Trainer(cfg)
    torch.set_num_threads(1)
    collector = trainer.make_collector(10**12)
    batches = iter(collector)
    trainer.fill_replay(cfg.replay.min_size + 100, batches)
    digest, done, cpu = hashlib.sha256(), 0, 0.0
    while done < args.updates:
        trainer.store(next(batches))
        for share in trainer.loss.update_plan(trainer.rng):
            sample = trainer.draw_batch(share)
            if sample is None:
                continue
            start = time.process_time()
            stats = trainer.update(sample)
            cpu += time.process_time() - start
            digest.update(repr(sorted(stats.items())).encode())
            done += 1
    collector.shutdown()
    estimates = trainer.agent.estimates
    state = {**trainer.loss.state_dict(), **(estimates.state_dict() if estimates is not None else {})}
    for name, value in sorted(state.items()):
        if isinstance(value, torch.Tensor):
            digest.update(name.encode())
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    for name, column in sorted(getattr(getattr(estimates, "stored", None), "columns", {}).items()):
        digest.update(name.encode())
        digest.update(column.numpy().tobytes())
    print(f"{args.algo}:{args.preset}: {done} updates, {1e3 * cpu / done:.2f} ms CPU each (update only, 1 thread); "
          f"sha256 {digest.hexdigest()}")


if __name__ == "__main__":
    main()
