"""CPU time of one learner update (drawing the batch, then the loss, backward, optimiser and the loss's
write-backs) on a filled replay, with no collector running: where ``learner.py``'s end-to-end figure goes.

    python benchmarks/update_cost.py vracer mujoco --updates 300 env.name=HalfCheetah-v5 replay.min_size=150000

Fills the replay to ``replay.min_size`` (+500) steps with the preset's acting policy in-process, then times
``--updates`` updates of the trainer (one thread, ``time.process_time``). With ``--store`` newly collected
batches are stored between them as in a run (``Trainer.store``, then the loss's ``update_plan``): what a
loss rebuilds after the replay grows (V-RACER's eq. 8 tree) is counted, acting is not. ``--wrap`` fills the
replay past its capacity instead, a long run's steady state in which every stored batch evicts episodes: 2^15
collected steps are stored again and again under new trajectory ids (acting 2^18 steps in one thread would take
~25 min), and so are the batches stored between timed updates (with ``--store``).
``--profile`` prints cProfile's top entries instead of timing plainly (cProfile inflates Python-heavy parts
several-fold).

    python benchmarks/update_cost.py vracer mujoco --wrap --store --updates 2000 env.name=Hopper-v5
"""

import argparse
import cProfile
import itertools
import pstats
import tempfile
import time
from collections.abc import Iterator

import torch
from tensordict import TensorDictBase

from acer_torchrl.config import load_config
from acer_torchrl.replay import TRAJ_KEY
from acer_torchrl.trainer import Trainer


def restored(recorded: list[TensorDictBase]) -> Iterator[TensorDictBase]:
    """``recorded`` batches over and over, each pass under trajectory ids no earlier pass used (new episodes)."""
    shift = 1 + max(int(b.get(TRAJ_KEY).max()) for b in recorded)
    for n in itertools.count(1):
        for batch in recorded:
            batch = batch.clone()
            batch.set(TRAJ_KEY, batch.get(TRAJ_KEY) + n * shift)
            yield batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("preset")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--store", action="store_true", help="store collected batches between updates, as in a run")
    parser.add_argument("--wrap", action="store_true", help="fill the replay past its capacity (see above)")
    args, overrides = parser.parse_known_args()
    run_dir = tempfile.mkdtemp()
    cfg = load_config(args.algo, [f"preset={args.preset}", "collector.workers=0", f"run_dir={run_dir}/run",
                                  "log.progress=false", *overrides])
    trainer = Trainer(cfg)
    torch.set_num_threads(1)  # acting at batch 1 with two threads is ~5x slower on a loaded 2-core machine
    collector = trainer.make_collector(10**12)
    batches = iter(collector)
    if args.wrap:
        recorded = []
        while sum(b.numel() for b in recorded) < min(2**15, cfg.replay.capacity):
            recorded.append(next(batches))
        batches = restored(recorded)
        while trainer.replay.steps_written <= cfg.replay.capacity:
            trainer.store(next(batches))
        trainer.loss.update_plan(trainer.rng)  # the fill's updates are not taken: timed ones come from --store
    else:
        trainer.fill_replay(max(2_000, cfg.replay.min_size + 500), batches)

    def plan() -> list[float]:
        """The updates the next stored batch pays for (without --store: the plan of the batches stored so far,
        or one replay-only update once that is spent)."""
        if args.store:
            trainer.store(next(batches))  # timed by the caller
            return trainer.loss.update_plan(trainer.rng)
        return trainer.loss.update_plan(trainer.rng) or [0.0]

    for _ in range(10):  # warm-up
        trainer.update(trainer.draw_batch(0.0))

    def timed() -> tuple[float, float, float]:
        draw = update = store = 0.0
        done = 0
        while done < args.updates:
            t0 = time.process_time()
            shares = plan()
            t1 = time.process_time()
            store += t1 - t0
            for share in shares[: args.updates - done]:
                t0 = time.process_time()
                sample = trainer.draw_batch(share)
                t1 = time.process_time()
                trainer.update(sample)
                draw, update = draw + t1 - t0, update + time.process_time() - t1
                done += 1
        return draw, update, store

    if args.profile:
        profile = cProfile.Profile()
        draw, update, store = profile.runcall(timed)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
    else:
        draw, update, store = timed()
    collector.shutdown()
    n = args.updates
    stored = f", storing batches {1e3 * store / n:.2f} ms" if args.store else ""
    print(f"{args.algo}:{args.preset} ({len(trainer.replay)} stored steps): draw {1e3 * draw / n:.2f} ms, "
          f"update {1e3 * update / n:.2f} ms{stored} per update (1 thread)")


if __name__ == "__main__":
    main()
