"""Speed of a run's checkpoint (``save_checkpoint`` / ``load_checkpoint``) with an Atari replay.

    python benchmarks/checkpoint_speed.py --steps 100000 [--memmap] [--dir /tmp] [--repeat 2]

Fills an ``EpisodeReplay`` of ``--steps`` slots (in RAM, or with ``--memmap`` on ``LazyMemmapStorage`` in
``--dir``) with ``--steps`` synthetic steps holding what the Atari preset stores of a collected batch (the
keys and dtypes of ``recipes/acer.py preset=atari``'s batches, without the policy's activations): uint8
``[4, 84, 84]`` observations (ale-py's frame stacks), action, reward, done / terminated / truncated,
``is_init``, ``step_count``, episode returns, the collector's trajectory ids and the behaviour policy's
logits [6] and log-probability; two envs, 1 000-step episodes. The state saved beside it is the preset's
size: 27 MB (its network, ACER's average network and Adam's two moments, 1.69 M floats each).

Then saves a checkpoint into a run directory under ``--dir`` ``--repeat`` times (the second and later
over the previous checkpoint, as a run does) and loads it back into a new replay (the files evicted from
the page cache first, ``posix_fadvise(DONTNEED)``: a resumed run reads them from the disk). Prints the
seconds and MB/s (10^6 bytes of checkpoint a second) of each, split into phases: for a save ``state.pt``,
the replay's rows, its links, the manifest (checksums), ``fsync`` and the rest (renames; waiting for the
removal of the checkpoint before the previous one); for a load the manifest's verification (every file
read and checksummed) and the replay's rows. After each save the disk's own speed at that moment is printed
(as many bytes of zeros written and fsynced): the disk is shared, and no checkpoint writes faster than it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from acer_torchrl import checkpoint, replay
from acer_torchrl.checkpoint import load_checkpoint, save_checkpoint
from acer_torchrl.replay import EpisodeReplay
from synthetic import SyntheticAtari  # benchmarks/ is the script's directory

EPISODE = 1_000  # steps of each synthetic episode
STATE_FLOATS = 4 * 1_690_000  # the Atari preset's state.pt: 4 copies of a 1.69 M-parameter network


def filled_replay(steps: int, scratch_dir: Path | None, layout: dict, n_envs: int = 2, T: int = 500) -> EpisodeReplay:
    """An ``EpisodeReplay`` of ``steps`` slots holding ``steps`` synthetic Atari steps of ``n_envs`` envs."""
    rb = EpisodeReplay(steps, scratch_dir=scratch_dir, seed=0, **layout)
    for batch in SyntheticAtari(n_envs, episode=EPISODE).batches(steps, T):
        rb.extend(batch)
    return rb


class PhaseTimer:
    """Seconds spent in named functions of the checkpoint code, summed over calls, while :meth:`wrapped`."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self._restore: list[tuple] = []  # (owner, name, the function wrapped)

    def wrap(self, owner, name: str, phase) -> None:
        """Time ``owner.name`` under ``phase`` (a name, or a function of the call's arguments giving one)."""
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase(*args) if callable(phase) else phase] += time.perf_counter() - start

        setattr(owner, name, timed)
        self._restore.append((owner, name, original))

    @contextlib.contextmanager
    def wrapped(self):
        """Time the checkpoint's phases: ``state.pt`` and ``links.pt`` (``torch.save``), the replay's rows
        (saved or loaded), the manifest (written or verified) and ``fsync``."""
        self.wrap(torch, "save", lambda obj, path, *rest: Path(path).name)
        self.wrap(replay, "save_rows", "rows")
        self.wrap(replay, "load_rows", "rows")
        self.wrap(checkpoint, "write_manifest", "manifest")
        self.wrap(checkpoint, "verify_manifest", "verify")
        self.wrap(checkpoint, "_fsync_tree", "fsync")
        try:
            yield self
        finally:
            for owner, name, original in reversed(self._restore):
                setattr(owner, name, original)
            self._restore.clear()

    def phases(self, total: float) -> str:
        """``"phase seconds, ..."``, the time outside the timed functions (of ``total``) as ``rest``."""
        rest = total - sum(self.seconds.values())
        return ", ".join(f"{k} {v:.2f}" for k, v in {**self.seconds, "rest": rest}.items())


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def evict(path: Path) -> None:
    """Drop ``path``'s files from the page cache (clean pages: no privilege needed), so that reading them
    back reads the disk."""
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def disk_reference(directory: Path, nbytes: int) -> float:
    """MB/s of the disk right now: ``nbytes`` of zeros written in 16 MiB pieces and fsynced (what ``dd
    conv=fsync`` measures), the bound on a checkpoint's speed on a disk others write to as well."""
    block = bytes(1 << 24)
    path = directory / "disk-reference"
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(0, nbytes, len(block)):
            f.write(block)
        os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    path.unlink()
    return nbytes / 1e6 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--memmap", action="store_true", help="the replay on LazyMemmapStorage (the Atari preset's)")
    parser.add_argument("--dir", default=None, help="where the run directory goes (default: the system's temp dir)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--frames-once", action="store_true",
                        help="each frame stored once (frame_stack=4, the Atari presets' replay since the frame store)")
    args = parser.parse_args()
    layout = {"frame_stack": 4} if args.frames_once else {}  # none: the same command on the code before
    work = Path(tempfile.mkdtemp(prefix="checkpoint-speed-", dir=args.dir))
    try:
        start = time.perf_counter()
        rb = filled_replay(args.steps, work / "scratch" if args.memmap else None, layout)
        where = "memmap" if args.memmap else "in RAM"
        print(f"filled {args.steps} steps ({where}) in {time.perf_counter() - start:.1f} s")
        state = {"loss": {f"copy{i}": torch.randn(STATE_FLOATS // 4) for i in range(4)}}
        run_dir = work / "run"
        run_dir.mkdir()
        for i in range(args.repeat):
            with PhaseTimer().wrapped() as timer:
                start = time.perf_counter()
                save_checkpoint(run_dir, state, {"env_steps": args.steps}, rb)
                seconds = time.perf_counter() - start
            size = tree_bytes(run_dir / "checkpoint")
            print(f"save {i + 1}: {size / 1e6:.0f} MB in {seconds:.2f} s = {size / 1e6 / seconds:.0f} MB/s "
                  f"({timer.phases(seconds)})")
            disk = disk_reference(work, size)
            print(f"  the disk then: {disk:.0f} MB/s (as many bytes of zeros, written and fsynced)")
        evict(run_dir / "checkpoint")
        other = EpisodeReplay(args.steps, scratch_dir=work / "scratch2" if args.memmap else None, seed=1, **layout)
        with PhaseTimer().wrapped() as timer:
            start = time.perf_counter()
            load_checkpoint(run_dir, other)
            seconds = time.perf_counter() - start
        print(f"load: {size / 1e6:.0f} MB in {seconds:.2f} s = {size / 1e6 / seconds:.0f} MB/s (from the disk; "
              f"{timer.phases(seconds)})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
