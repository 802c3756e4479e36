"""The run directory: every file a run writes goes under it, and a new run never mixes with an old one.

A new run refuses a directory that already holds a run that finished or can be resumed (``summary.json``
or a checkpoint): it points to ``resume=`` or a new ``run_dir=``, unless ``overwrite=true``, which first
deletes that run's files (only those: anything else in the directory stays). A directory that cannot be
made or written to is one :class:`~acer_torchrl.validation.ConfigError` line, before any work.
"""

from __future__ import annotations

import errno
import shutil
import tempfile
from pathlib import Path

from acer_torchrl.validation import ConfigError

# what a run writes under its directory (trainer, metrics, checkpoint, memory-mapped replay)
RUN_FILES = (
    "config.yaml", "metrics.csv", "metrics.csv.tmp", "summary.json", "learning_curve.png", "tensorboard", "wandb",
    "checkpoint", "checkpoint.tmp", "checkpoint.old", "replay_storage", "resumes.jsonl",
)
FINISHED_MARKS = ("summary.json", "checkpoint", "checkpoint.old")
REASONS = {
    errno.EEXIST: "it is a file, not a directory",
    errno.ENOTDIR: "a part of that path is a file, not a directory",
}


def holds_run(path: Path) -> bool:
    """Whether ``path`` holds a run that finished or can be resumed."""
    return any((path / name).exists() for name in FINISHED_MARKS)


def make_writable_dir(path: Path, key: str) -> Path:
    """Make ``path`` (with its parents) and check that a file can be written there; ``key`` names the
    setting that gave it in the one-line :class:`ConfigError` otherwise."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        reason = REASONS.get(err.errno, err.strerror or type(err).__name__)
        if err.filename and str(err.filename) != str(path):
            reason += f": {err.filename}"
        raise ConfigError(f"{key}={path} cannot be used as a run directory ({reason}); choose a writable one") from None
    return path


def prepare_run_dir(path: Path, *, resume: bool, overwrite: bool) -> Path:
    """The directory a run (``resume``: the resumed run) writes to, checked and made before any work."""
    if resume:
        return make_writable_dir(path, "resume")
    if holds_run(path):
        if not overwrite:
            raise ConfigError(
                f"run_dir={path} already holds a run (summary.json or checkpoint): continue it with resume={path}, "
                "pick a new run_dir=, or add overwrite=true to replace it"
            )
        try:
            for name in RUN_FILES:
                target = path / name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif target.exists() or target.is_symlink():
                    target.unlink()
        except OSError as err:
            raise ConfigError(f"overwrite=true: cannot delete {err.filename or path} ({err.strerror})") from None
    return make_writable_dir(path, "run_dir")
