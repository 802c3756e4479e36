"""Replay memory: bytes per stored Atari step and peak RSS of a large memory-mapped Atari replay.

    python benchmarks/memory.py [--steps 1000000] [--frame-stack 1] [--dir /tmp/acer-memmap]

Fills an ``EpisodeReplay`` on ``LazyMemmapStorage`` with Atari-shaped steps exactly as the collector
yields them (uint8 ``[frame_stack, 84, 84]`` observation and next observation, action, behaviour
statistics, LSTM state for recurrent agents), in 1000-step batches of 4 interleaved episodes, samples from
it, and reports bytes per step on disk (blocks allocated: the file of chunk ends' next observations is
sparse) and the process's peak resident memory (``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time
from pathlib import Path

import torch
from tensordict import TensorDict

from acer_torchrl.replay import EpisodeReplay

RESULTS = Path(__file__).resolve().parent / "results"


def atari_batch(n_rows: int, T: int, frame_stack: int, first_traj: int, lstm: int) -> TensorDict:
    shape = (n_rows, T)
    frames = torch.randint(0, 255, (n_rows, T + 1, frame_stack, 84, 84), dtype=torch.uint8)
    done = torch.zeros(*shape, 1, dtype=torch.bool)
    done[:, -1] = True
    data = {
        "observation": frames[:, :-1],
        "action": torch.randint(0, 6, shape),
        "is_init": torch.zeros(*shape, 1, dtype=torch.bool),
        ("behaviour", "logits"): torch.randn(*shape, 6),
        ("behaviour", "log_prob"): torch.randn(shape),
        ("collector", "traj_ids"): (first_traj + torch.arange(n_rows)).unsqueeze(-1).expand(shape),
        ("next", "observation"): frames[:, 1:],
        ("next", "reward"): torch.zeros(*shape, 1),
        ("next", "done"): done,
        ("next", "terminated"): done.clone(),
        ("next", "truncated"): torch.zeros_like(done),
    }
    if lstm:
        data["recurrent_state_h"] = torch.zeros(*shape, 1, lstm)
        data["recurrent_state_c"] = torch.zeros(*shape, 1, lstm)
    return TensorDict(data, batch_size=shape)


def proc_status_mib(field: str) -> int:
    """A memory field of /proc/self/status in MiB (RssAnon: the process's own memory; RssFile: mapped
    file pages, i.e. the memory-mapped replay's page cache, which the kernel reclaims under pressure)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--frame-stack", type=int, default=1, help="1 for recurrent agents, 4 for feed-forward")
    parser.add_argument("--lstm", type=int, default=256, help="LSTM width stored per step (0: none)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/acer-memmap"))
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    replay = EpisodeReplay(args.steps, scratch_dir=args.dir)
    rows, T = 4, 250
    start = time.time()
    for i in range(args.steps // (rows * T)):
        replay.extend(atari_batch(rows, T, args.frame_stack, i * rows, args.lstm))
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
        "command": f"python benchmarks/memory.py --steps {args.steps} --frame-stack {args.frame_stack} --lstm {args.lstm}",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, no GPU",
    }
    shutil.rmtree(args.dir, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"memory-fs{args.frame_stack}.json"
    out.write_text(json.dumps(row, indent=2))
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
