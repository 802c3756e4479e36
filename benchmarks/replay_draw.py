"""The cost of drawing an Atari batch from a large replay, by storage layout.

    python benchmarks/replay_draw.py --steps 100000 [--batch 16 --seq-len 20] [--layouts frames stacks memmap-stacks]

Fills an :class:`~acer_torchrl.replay.EpisodeReplay` with ``--steps`` synthetic Atari steps (uint8 ``[4, 84, 84]``
observation stacks of the frames of 2 envs whose episodes last 200-2 000 steps, actions, rewards, flags and
6 behaviour logits, in collected batches of ``2 x 40`` steps) and times ``sample_sequences(batch, seq_len)``
with the keys a feed-forward ACER loss reads (observation and next observation included), by wall clock after
5 warm-up draws. Layouts:

* ``frames``: each frame stored once, in RAM (``frame_stack=4``, what the Atari presets use);
* ``stacks``: the observation stacks stored as collected, in RAM (``frame_stack=1``);
* ``memmap-stacks``: the stacks in a memory-mapped storage (``replay.memmap=true`` before frame stores).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from tensordict import TensorDict

from acer_torchrl.replay import EpisodeReplay

KEYS = ["observation", ("next", "observation"), "action", ("next", "reward"), ("next", "done"),
        ("next", "terminated"), "behaviour_logits"]


def atari_batches(steps: int, envs: int = 2, T: int = 40, k: int = 4, seed: int = 0):
    """Collected batches ``[envs, T]`` of synthetic Atari steps, ``steps`` in all."""
    g = torch.Generator().manual_seed(seed)
    frame = lambda: torch.randint(0, 256, (84, 84), dtype=torch.uint8, generator=g)  # noqa: E731
    stacks = [torch.stack([frame() for _ in range(k)]) for _ in range(envs)]
    traj, count = list(range(envs)), [0] * envs
    length = [int(torch.randint(200, 2000, (), generator=g)) for _ in range(envs)]
    for _ in range(steps // (envs * T)):
        obs, nxt, done, tids, step_count = [], [], [], [], []
        for e in range(envs):
            row_obs, row_next, row_done, row_tid, row_count = [], [], [], [], []
            for _ in range(T):
                following = torch.cat([stacks[e][1:], frame().unsqueeze(0)])
                ends = count[e] + 1 >= length[e]
                row_obs.append(stacks[e]), row_next.append(following), row_done.append(ends)
                row_tid.append(traj[e]), row_count.append(count[e])
                stacks[e], count[e] = following, count[e] + 1
                if ends:
                    traj[e], count[e] = max(traj) + 1, 0
                    length[e] = int(torch.randint(200, 2000, (), generator=g))
            obs.append(torch.stack(row_obs)), nxt.append(torch.stack(row_next)), done.append(row_done)
            tids.append(row_tid), step_count.append(row_count)
        done = torch.tensor(done).unsqueeze(-1)
        yield TensorDict(
            {
                "observation": torch.stack(obs),
                ("next", "observation"): torch.stack(nxt),
                "action": torch.randint(0, 6, (envs, T), generator=g),
                "behaviour_logits": torch.randn(envs, T, 6, generator=g),
                "step_count": torch.tensor(step_count).unsqueeze(-1),
                ("collector", "traj_ids"): torch.tensor(tids),
                ("next", "reward"): torch.randn(envs, T, 1, generator=g),
                ("next", "done"): done,
                ("next", "terminated"): done.clone(),
                ("next", "truncated"): torch.zeros_like(done),
            },
            batch_size=[envs, T],
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=20)
    parser.add_argument("--draws", type=int, default=50)
    parser.add_argument("--layouts", nargs="+", default=["frames", "stacks", "memmap-stacks"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    for layout in args.layouts:
        scratch = tempfile.mkdtemp(prefix="replay-draw-") if layout.startswith("memmap") else None
        # frame_stack only where asked for: the same command times the code before frame stores (PYTHONPATH=...)
        replay = EpisodeReplay(args.steps, scratch_dir=scratch, **({"frame_stack": 4} if layout == "frames" else {}))
        start = time.perf_counter()
        for batch in atari_batches(args.steps):
            replay.extend(batch)
        fill = time.perf_counter() - start
        for _ in range(5):
            replay.sample_sequences(args.batch, args.seq_len, KEYS)
        start = time.perf_counter()
        for _ in range(args.draws):
            replay.sample_sequences(args.batch, args.seq_len, KEYS)
        draw_ms = 1e3 * (time.perf_counter() - start) / args.draws
        print(f"{layout}: {len(replay)} stored steps, {draw_ms:.2f} ms a draw of {args.batch} x {args.seq_len} "
              f"(filled in {fill:.0f} s)", flush=True)
        del replay


if __name__ == "__main__":
    main()
