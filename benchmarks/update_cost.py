"""CPU time of one learner update (drawing the batch, then the loss, backward, optimiser and the loss's
write-backs) on a filled replay, with no collector running: where ``learner.py``'s end-to-end figure goes.

    python benchmarks/update_cost.py vracer mujoco --updates 300 env.name=HalfCheetah-v5 replay.min_size=150000

Fills the replay to ``replay.min_size`` (+500) steps with the preset's acting policy in-process, then times
``--updates`` updates of the trainer (one thread, ``time.process_time``). ``--profile`` prints cProfile's top
entries instead of timing plainly (cProfile inflates Python-heavy parts several-fold).
"""

import argparse
import cProfile
import pstats
import tempfile
import time

import torch

from acer_torchrl.config import load_config
from acer_torchrl.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("preset")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--profile", action="store_true")
    args, overrides = parser.parse_known_args()
    run_dir = tempfile.mkdtemp()
    cfg = load_config(args.algo, [f"preset={args.preset}", "collector.workers=0", f"run_dir={run_dir}/run",
                                  "log.progress=false", *overrides])
    trainer = Trainer(cfg)
    trainer.fill_replay(max(2_000, cfg.replay.min_size + 500))
    torch.set_num_threads(1)
    shares = [s for _ in range(args.updates) for s in trainer.loss.update_plan(trainer.rng)][: args.updates]
    shares += [0.0] * (args.updates - len(shares))
    for share in shares[:10]:  # warm-up
        trainer.update(trainer.draw_batch(share))

    def timed() -> tuple[float, float]:
        draw = update = 0.0
        for share in shares:
            t0 = time.process_time()
            sample = trainer.draw_batch(share)
            t1 = time.process_time()
            trainer.update(sample)
            draw, update = draw + t1 - t0, update + time.process_time() - t1
        return draw, update

    if args.profile:
        profile = cProfile.Profile()
        draw, update = profile.runcall(timed)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
    else:
        draw, update = timed()
    n = len(shares)
    print(f"{args.algo}:{args.preset} ({len(trainer.replay)} stored steps): draw {1e3 * draw / n:.2f} ms, "
          f"update {1e3 * update / n:.2f} ms per update (1 thread)")


if __name__ == "__main__":
    main()
