"""Replay costs of Atari steps: drawing a batch from a large replay by storage layout, and (``memory``) the
memory a large memory-mapped replay takes.

    python benchmarks/replay_draw.py --steps 100000 [--batch 16 --seq-len 20] [--layouts frames stacks memmap-stacks]
    python benchmarks/replay_draw.py memory [--steps 1000000] [--frame-stack 1] [--lstm 256] [--dir /tmp/acer-memmap]

Both fill an :class:`~acer_torchrl.replay.EpisodeReplay` with synthetic Atari steps (``synthetic.py``: uint8
``[k, 84, 84]`` observation stacks, actions, rewards, flags and 6 behaviour logits).

The draw: ``--steps`` steps of 2 envs whose episodes last 200-2 000 steps, in collected batches of ``2 x 40``
steps; ``sample_sequences(batch, seq_len)`` with the keys a feed-forward ACER loss reads (observation and next
observation included) timed by wall clock after 5 warm-up draws. Layouts:

* ``frames``: each frame stored once, in RAM (``frame_stack=4``, what the Atari presets use);
* ``stacks``: the observation stacks stored as collected, in RAM (``frame_stack=1``);
* ``memmap-stacks``: the stacks in a memory-mapped storage (``replay.memmap=true`` before frame stores).

``memory``: ``--steps`` steps on ``LazyMemmapStorage`` in 1000-step batches of 4 episodes of 250 steps (with the
LSTM state of recurrent agents), then samples from it, and writes ``results/memory-fs<k>.json``: bytes per step on
disk (blocks allocated: the file of chunk ends' next observations is sparse) and the process's peak resident
memory (``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from acer_torchrl.replay import EpisodeReplay
from synthetic import SyntheticAtari  # benchmarks/ is the script's directory

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = ["observation", ("next", "observation"), "action", ("next", "reward"), ("next", "done"),
        ("next", "terminated"), ("behaviour", "logits")]


def draw(argv: list[str]) -> None:
    """The cost of one batch draw, by storage layout."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=20)
    parser.add_argument("--draws", type=int, default=50)
    parser.add_argument("--layouts", nargs="+", default=["frames", "stacks", "memmap-stacks"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for layout in args.layouts:
        scratch = tempfile.mkdtemp(prefix="replay-draw-") if layout.startswith("memmap") else None
        # frame_stack only where asked for: the same command times the code before frame stores (PYTHONPATH=...)
        replay = EpisodeReplay(args.steps, scratch_dir=scratch, **({"frame_stack": 4} if layout == "frames" else {}))
        start = time.perf_counter()
        for batch in SyntheticAtari(2, episode=(200, 2000)).batches(args.steps, 40):
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
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def proc_status_mib(field: str) -> int:
    """A memory field of /proc/self/status in MiB (RssAnon: the process's own memory; RssFile: mapped
    file pages, i.e. the memory-mapped replay's page cache, which the kernel reclaims under pressure)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return -1


def memory(argv: list[str]) -> None:
    """Bytes per stored Atari step and peak RSS of a large memory-mapped replay."""
    parser = argparse.ArgumentParser(prog="replay_draw.py memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--frame-stack", type=int, default=1, help="1 for recurrent agents, 4 for feed-forward")
    parser.add_argument("--lstm", type=int, default=256, help="LSTM width stored per step (0: none)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/acer-memmap"))
    parser.add_argument("--results", type=Path, default=RESULTS, help="where memory-fs<k>.json goes")
    args = parser.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    replay = EpisodeReplay(args.steps, scratch_dir=args.dir)
    start = time.time()
    steps = SyntheticAtari(4, frame_stack=args.frame_stack, episode=250, lstm=args.lstm)
    for batch in steps.batches(args.steps, 250):
        replay.extend(batch)
    fill_s = time.time() - start
    sample_start = time.time()
    for _ in range(20):
        replay.sample_sequences(32, 20)
    sample_ms = (time.time() - sample_start) / 20 * 1e3
    disk = sum(f.stat().st_blocks * 512 for f in args.dir.rglob("*") if f.is_file())
    row = {
        "steps": len(replay),
        "frame_stack": args.frame_stack,
        "bytes_per_step_on_disk": round(disk / len(replay)),
        "frame_bytes_per_step": round(
            (len(replay) + min(replay.end_entries_written, args.steps)) * args.frame_stack * 84 * 84 / len(replay)
        ),
        "chunk_end_next_observations": replay.end_entries_written,
        "link_bytes_per_step": 6 * 8 + 1,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_anon_mib_at_end": proc_status_mib("RssAnon"),
        "rss_file_mib_at_end": proc_status_mib("RssFile"),
        "fill_s": round(fill_s, 1),
        "sample_32x20_ms": round(sample_ms, 1),
        "command": f"python benchmarks/replay_draw.py memory --steps {args.steps} --frame-stack {args.frame_stack} "
                   f"--lstm {args.lstm}",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, no GPU",
    }
    shutil.rmtree(args.dir, ignore_errors=True)
    args.results.mkdir(exist_ok=True)
    out = args.results / f"memory-fs{args.frame_stack}.json"
    out.write_text(json.dumps(row, indent=2))
    print(json.dumps(row, indent=2))


def main() -> None:
    if sys.argv[1:2] == ["memory"]:
        memory(sys.argv[2:])
    else:
        draw(sys.argv[1:])


if __name__ == "__main__":
    main()
