"""The run directory: every file a run writes goes under it, and a new run never mixes with an old one that
finished or can be resumed.

A new run refuses a directory that already holds a run that finished or can be resumed (``summary.json``
or a checkpoint): it points to ``resume=`` or a new ``run_dir=``, unless ``overwrite=true``, which first
deletes that run's files (only those: anything else in the directory stays). A directory left by a run killed
before its first checkpoint holds nothing to resume and is taken as it is: its logs (``metrics.csv``, TensorBoard
events, the W&B run named after the directory) are written over or added to. A directory that cannot be
made or written to is one :class:`~acer_torchrl.validation.ConfigError` line, before any work.

A run holds an exclusive lock on its directory (``flock`` on ``run.lock``, which names the holder's host and
pid) for its whole life: a second run into the same directory is refused with one line naming the holder. The
kernel releases the lock when the holder ends, however it ends (a crash, SIGKILL), so no lock outlives its run.

A run given no ``run_dir=`` gets a new one, named the same way by the recipes, the sweeps and ``slurm/submit.py``
(:func:`default_run_dir`) and made at once, so that two runs started in the same second get two.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import socket
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from acer_torchrl.commands import shell_command
from acer_torchrl.validation import ConfigError

if TYPE_CHECKING:
    from acer_torchrl.config import Config

# what a run writes under its directory (trainer, metrics, checkpoint, memory-mapped replay)
RUN_FILES = (
    "config.yaml", "metrics.csv", "metrics.csv.tmp", "summary.json", "learning_curve.png", "learning_curve.tmp.png",
    "tensorboard", "wandb", "checkpoint", "checkpoint.tmp", "checkpoint.old", "replay_storage", "resumes.jsonl",
    "summary.json.tmp", "provenance.jsonl",
)
ASIDE = ".overwritten"  # an overwritten run's files while the new run is built (rundir.set_old_run_aside)
LOCK_FILE = "run.lock"  # never deleted (overwrite=true leaves it): a new file would be a second lock
FINISHED_MARKS = ("summary.json", "checkpoint", "checkpoint.old")
SWEEP_FILE = "sweep.json"  # the sweep's keys as it started, in its directory: what a resume reads back
NAME_MAX = 255  # bytes in one part of a path (ext4, XFS, NFS, Lustre)
REASONS = {
    errno.EEXIST: "it is a file, not a directory",
    errno.ENOTDIR: "a part of that path is a file, not a directory",
}


def check_dir_name(path: str | Path, key: str) -> None:
    """One :class:`ConfigError` line when a part of ``path`` (given by the setting ``key``) is longer than a file
    name may be, before anything touches it (the OS's error came up where the path was first used, a traceback)."""
    longest = max(Path(path).parts, key=lambda part: len(part.encode()), default="")
    if len(longest.encode()) > NAME_MAX:
        raise ConfigError(f"{key}={path}: a part of that path is {len(longest.encode())} bytes long, more than the "
                          f"{NAME_MAX} a file name may have; choose a shorter one")


def holds_run(path: Path) -> bool:
    """Whether ``path`` holds a run that finished or can be resumed."""
    return any((path / name).exists() for name in FINISHED_MARKS)


def default_run_dir(cfg: Config, sweep: bool = False) -> Path:
    """The directory of a run (``sweep``: of a sweep's points) given no ``run_dir=``, made now:
    ``runs/<loss>[-sweep]-<env>-s<seed>-<YYYYmmdd-HHMMSS>`` (:func:`new_dir`)."""
    kind = "-sweep" if sweep else ""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return new_dir(Path("runs"), f"{cfg.loss}{kind}-{cfg.env.name.replace('/', '_')}-s{cfg.seed}-{stamp}")


def new_dir(parent: Path, name: str) -> Path:
    """``parent/name`` made now, or ``name-2``, ``name-3``... when taken: ``mkdir`` is atomic, so two runs that
    start in the same second (on two nodes of one file system too) never get one directory."""
    for n in itertools.count(1):
        path = parent / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
        except OSError as err:
            raise ConfigError(f"cannot make a run directory in {parent} ({dir_problem(err, path)}); give run_dir=<a "
                              "writable directory>") from None


def make_writable_dir(path: Path, key: str) -> Path:
    """Make ``path`` (with its parents) and check that a file can be written there; ``key`` names the
    setting that gave it in the one-line :class:`ConfigError` otherwise."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ConfigError(f"{key}={path} cannot be used as a run directory ({dir_problem(err, path)}); choose a "
                          "writable one") from None
    return path


def dir_problem(err: OSError, path: Path) -> str:
    """Why ``path`` could not be made or written, in words, naming the part of it that failed when that is another."""
    reason = REASONS.get(err.errno, err.strerror or type(err).__name__)
    if err.filename and str(err.filename) != str(path):
        reason += f": {err.filename}"
    return reason


def lock_run_dir(path: Path, key: str) -> IO:
    """Take ``path``'s run lock; returns the open lock file (closing it, or the process ending, releases it).
    Held by another run: one :class:`ConfigError` line naming it (``key`` is the setting that gave ``path``)."""
    lock = open(path / LOCK_FILE, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with lock:
            raise _in_use(lock, path, key) from None
    lock.truncate(0)
    lock.write(f"host {socket.gethostname()}, pid {os.getpid()}\n")
    lock.flush()
    return lock


def _in_use(lock: IO, path: Path, key: str) -> ConfigError:
    """The one line for ``path``, whose ``lock`` another run holds, naming that run."""
    lock.seek(0)
    holder = lock.read().strip() or "a run that has not written its name yet"
    return ConfigError(f"{key}={path} is in use by another run ({holder}); wait for it to end or choose another "
                       "run_dir=")


def refuse_a_live_run(path: Path, key: str) -> None:
    """The one line of :func:`lock_run_dir` when a live run holds ``path``'s lock; creates nothing (no lock file
    where there is none: a refused run leaves an old run's directory as it was)."""
    try:
        probe = open(path / LOCK_FILE)
    except OSError:  # no lock file (no run there yet), or no directory
        return
    with probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(probe, path, key) from None


def refuse_an_old_run(path: Path, *, resume: bool, overwrite: bool) -> None:
    """One :class:`ConfigError` line when a new run (neither ``resume`` nor ``overwrite``) is given a ``path`` that
    holds a run already."""
    if not resume and not overwrite and holds_run(path):
        raise ConfigError(
            f"run_dir={path} already holds a run (summary.json or checkpoint): continue it with resume={path}, "
            "pick a new run_dir=, or add overwrite=true to replace it"
        )


def prepare_run_dir(path: Path, *, resume: bool, overwrite: bool) -> tuple[Path, IO]:
    """The directory a run (``resume``: the resumed run) writes to, checked, made and locked
    (:func:`lock_run_dir`) before any work; returns it and its open lock file."""
    key = "resume" if resume else "run_dir"
    refuse_a_live_run(path, key)  # named first: what a live run's directory holds is its own (its lock would refuse
    refuse_an_old_run(path, resume=resume, overwrite=overwrite)  # the resume= the refusal of an old run proposes)
    make_writable_dir(path, key)
    if resume:
        refuse_shared_files(path)  # before the lock file, which such a copy shares too, is written
    lock = lock_run_dir(path, key)
    try:
        if not resume:  # the run overwritten, or what a run killed before its first checkpoint left (its event files
            set_old_run_aside(path)  # would run on into this run's TensorBoard / W&B logs)
    except BaseException:
        lock.close()
        raise
    return path, lock


def refuse_shared_files(path: Path) -> None:
    """One :class:`ConfigError` line when a file of the run ``path`` holds is a hard link shared with another
    directory (a copy made with ``cp -al``): a resume writes some files in place (``provenance.jsonl``, the
    memory-mapped replay), and would change the other run's record and replay too."""
    for name in RUN_FILES:
        for file in [path / name] if (path / name).is_file() else sorted((path / name).rglob("*")):
            if not file.is_symlink() and file.is_file() and file.stat().st_nlink > 1:
                raise ConfigError(f"resume={path}: {file.relative_to(path)} is a hard link shared with another "
                                  "directory (a copy made with cp -al?), which a resume would write into too; copy the "
                                  "run with cp -a and resume the copy")


def delete_old_run(path: Path) -> None:
    """Delete the files of the run ``path`` holds or of one that left no checkpoint (only those, the lock file left)."""
    try:
        for name in RUN_FILES:
            _delete(path / name)
    except OSError as err:
        raise ConfigError(f"run_dir={path}: cannot delete the old run's {err.filename or path} ({err.strerror})") from None


def _delete(target: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()


def set_old_run_aside(path: Path) -> None:
    """Move the files of the run ``path`` holds (:data:`RUN_FILES`) into ``path/.overwritten`` while the new run is
    built: :func:`restore_old_run` puts them back when it is refused (an ``init_from`` that does not fit, a
    ``total_frames`` too low), :func:`drop_old_run` deletes them once it is built. (An aside left by a process killed
    meanwhile is of a run that was being overwritten: deleted.)"""
    aside = path / ASIDE
    try:
        _delete(aside)
        held = [name for name in RUN_FILES if (path / name).exists() or (path / name).is_symlink()]
        if held:
            aside.mkdir()
            for name in held:
                (path / name).rename(aside / name)
    except OSError as err:
        raise ConfigError(f"run_dir={path}: cannot move the old run's {err.filename or path} aside ({err.strerror})") from None


def restore_old_run(path: Path) -> None:
    """Put back the run :func:`set_old_run_aside` moved aside, deleting what the refused run made meanwhile."""
    aside = path / ASIDE
    if aside.is_dir():
        delete_old_run(path)
        for target in aside.iterdir():
            target.rename(path / target.name)
        aside.rmdir()


def drop_old_run(path: Path) -> None:
    """Delete the run :func:`set_old_run_aside` moved aside (the new one is built)."""
    _delete(path / ASIDE)


def shared_replay_sweep(path: Path) -> bool:
    """Whether ``path`` is a shared-replay sweep's directory (its :data:`SWEEP_FILE`). ``slurm/submit.py``'s sweeps of
    runs of their own (``points.json``) once wrote a ``sweep.json`` too, listing their ``"runs"``: not one. An
    unreadable file counts as the sweep's (refused, as a resume of one of its agents alone must be)."""
    try:
        return "runs" not in json.loads((path / SWEEP_FILE).read_text())
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return False
    except (OSError, ValueError, TypeError):
        return True


def refuse_sweep_resume(resume: str | None) -> None:
    """A one-line :class:`ConfigError` when a single run's ``resume=`` names a sweep directory or one of its agents:
    resumed alone, an agent would go on without the sweep's shared replay (held by agent 0's checkpoint)."""
    if resume is None:
        return
    check_dir_name(resume, "resume")  # before the path is first touched
    path = Path(resume)
    for sweep_dir, what in ((path, "a shared-replay sweep"),
                            (path.parent, f"an agent of the shared-replay sweep {path.parent}")):
        if shared_replay_sweep(sweep_dir):
            raise ConfigError(f"resume={resume} is {what}, not a run of its own; resume the sweep with: "
                              f"{shell_command('recipes/laser_sweep.py', f'resume={sweep_dir}')}")
