"""Atomic, pickle-free checkpoints of a run: model/optimiser/loss state, counters and the whole replay.

Layout under ``<run_dir>``: ``checkpoint/`` holds ``state.pt`` (tensors and plain containers only, read
back with ``torch.load(weights_only=True)``: no arbitrary code runs on load), ``counters.json`` and
``replay/`` (the filled slots as memory-mapped TensorDicts, read without unpickling, plus the episode links). A checkpoint is written to
``checkpoint.tmp/`` and swapped in by renames, so a kill at any moment leaves a complete checkpoint
(``checkpoint/`` or, between the two renames, ``checkpoint.old/``). ``manifest.json`` lists every file with its
size and CRC-32; a checkpoint is verified against it before anything is read (a truncated, damaged or foreign
file is one line, not zeros in the replay). torch is imported where a checkpoint is saved or loaded, so
that :class:`CheckpointError` costs the command line (``--help``) no torch import.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path


MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or does not fit the run; the message is one line."""


def save_checkpoint(run_dir: Path, state: dict, counters: dict, replay) -> None:
    import torch

    final, tmp, old = (run_dir / n for n in ("checkpoint", "checkpoint.tmp", "checkpoint.old"))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    replay.save(tmp / "replay")
    (tmp / "counters.json").write_text(json.dumps(counters))
    write_manifest(tmp)
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


def _crc32(path: Path, chunk_bytes: int = 1 << 24) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(path: Path) -> None:
    """``manifest.json``: ``{file: {"bytes": size, "crc32": checksum}}`` of every file under ``path``."""
    files = {name: {"bytes": (path / name).stat().st_size, "crc32": _crc32(path / name)} for name in _files(path)}
    (path / MANIFEST).write_text(json.dumps(files, indent=1))


def verify_manifest(path: Path) -> None:
    """A one-line :class:`CheckpointError` unless ``path`` holds exactly the files of its manifest, each with
    its saved size and checksum (sizes first: a truncated file is found without reading the others)."""
    try:
        files = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        raise CheckpointError(
            f"checkpoint {path} has no readable {MANIFEST} (damaged, or written by a version that did not verify "
            "checkpoints); it cannot be resumed safely"
        ) from None
    present = _files(path)
    unexpected = sorted(set(present) - set(files))
    missing = sorted(set(files) - set(present))
    if unexpected or missing:
        which = f"{unexpected[0]} is not part of it" if unexpected else f"{missing[0]} is missing"
        raise CheckpointError(f"checkpoint {path} is corrupt: {which}; it was altered after saving and is not loaded")
    for name, saved in files.items():
        size = (path / name).stat().st_size
        if size != saved["bytes"]:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} holds {size} bytes, {saved['bytes']} were saved")
    for name, saved in files.items():
        if _crc32(path / name) != saved["crc32"]:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} fails its checksum (damaged since it was saved)")


def latest_checkpoint(run_dir: Path) -> Path:
    for name in ("checkpoint", "checkpoint.old"):
        if (run_dir / name / "counters.json").is_file():
            return run_dir / name
    raise CheckpointError(f"no checkpoint in {run_dir} (nothing to resume; start a new run instead)")


def load_checkpoint(run_dir: Path, replay=None) -> tuple[dict, dict]:
    """Return ``(state, counters)`` of the latest checkpoint and restore ``replay`` (if given) in place;
    any damage -> :class:`CheckpointError`."""
    import torch

    path = latest_checkpoint(run_dir)
    verify_manifest(path)
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
