"""Atomic, pickle-free checkpoints of a run: model/optimiser/loss state, counters and the whole replay.

Layout under ``<run_dir>``: ``checkpoint/`` holds ``state.pt`` (tensors and plain containers only, read
back with ``torch.load(weights_only=True)``: no arbitrary code runs on load), ``counters.json`` and
``replay/`` (the filled slots as memory-mapped TensorDicts, read without unpickling, plus the episode links). A checkpoint is written to
``checkpoint.tmp/`` and swapped in by renames, so a kill at any moment leaves a complete checkpoint
(``checkpoint/`` or, between the two renames, ``checkpoint.old/``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or does not fit the run; the message is one line."""


def save_checkpoint(run_dir: Path, state: dict, counters: dict, replay) -> None:
    final, tmp, old = (run_dir / n for n in ("checkpoint", "checkpoint.tmp", "checkpoint.old"))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    replay.save(tmp / "replay")
    (tmp / "counters.json").write_text(json.dumps(counters))
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _fsync_tree(path: Path) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())


def latest_checkpoint(run_dir: Path) -> Path:
    for name in ("checkpoint", "checkpoint.old"):
        if (run_dir / name / "counters.json").is_file():
            return run_dir / name
    raise CheckpointError(f"no checkpoint in {run_dir} (nothing to resume; start a new run instead)")


def load_checkpoint(run_dir: Path, replay=None) -> tuple[dict, dict]:
    """Return ``(state, counters)`` of the latest checkpoint and restore ``replay`` (if given) in place;
    any damage -> :class:`CheckpointError`."""
    path = latest_checkpoint(run_dir)
    try:
        counters = json.loads((path / "counters.json").read_text())
        state = torch.load(path / "state.pt", weights_only=True, map_location="cpu")
        if replay is not None:
            replay.load(path / "replay")
    except Exception as err:  # noqa: BLE001 - any failure here means the files are unusable
        raise CheckpointError(
            f"checkpoint {path} is corrupt or unreadable ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        ) from None
    return state, counters
