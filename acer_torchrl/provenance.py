"""What a run ran on, recorded with it: the code (the checkout's commit, or the installed package's version), the
packages that compute its numbers, Python and the machine.

A run appends one line to ``<run_dir>/provenance.jsonl`` when it starts and at each resume that trains (a run
resumed on other code or another machine ran on each, from the env steps the line gives), and ``summary.json``
names the code and machines of all of them. ``benchmarks/learning.py`` records the same for each invocation of a
row.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout, when the package is run from one
FILE = "provenance.jsonl"
PACKAGES = ("torch", "torchrl", "tensordict", "numpy", "gymnasium", "mujoco", "ale-py", "minatar")
CODE_PATHS = ("acer_torchrl", "recipes")  # what a run's numbers come from, in the checkout


@functools.cache
def code_version(root: Path = ROOT, paths: tuple[str, ...] = CODE_PATHS) -> str:
    """``root``'s commit, ``+changes`` when ``paths`` differ from it; where ``root`` is not the top of a git
    checkout (an installed package, or a folder inside another project's repository), the installed version."""
    git = ["git", "-C", str(root)]

    def out(*args: str) -> str:
        return subprocess.run([*git, *args], capture_output=True, text=True, check=True).stdout.strip()

    try:
        if Path(out("rev-parse", "--show-toplevel")).resolve() == root.resolve():
            changed = out("status", "--porcelain", "--", *paths)
            return out("rev-parse", "--short", "HEAD") + ("+changes" if changed else "")
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        return f"acer-torchrl {importlib.metadata.version('acer-torchrl')} (not a git checkout)"
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not a git checkout, not installed)"


def machine() -> str:
    """The CPU architecture, core count and GPUs, e.g. ``x86_64, 2 cores, no GPU``."""
    import torch

    cpu = f"{platform.machine()}, {os.cpu_count()} cores"
    if not torch.cuda.is_available():
        return f"{cpu}, no GPU"
    return f"{cpu}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"


def packages() -> dict[str, str]:
    """The installed versions of :data:`PACKAGES` (those installed)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def this_process(code_paths: tuple[str, ...] = CODE_PATHS) -> dict:
    """This process's record: ``code`` (:func:`code_version` of ``code_paths``), ``machine``, ``date``
    (``YYYY-MM-DD``), ``started`` (local time, ISO 8601), ``python`` and ``packages``."""
    return {"code": code_version(ROOT, code_paths), "machine": machine(), "date": time.strftime("%Y-%m-%d"),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
            "packages": packages()}


def record_segment(run_dir: Path, env_steps: int, inherited: dict | None = None) -> None:
    """Append this process's record (:func:`this_process`) to ``<run_dir>/provenance.jsonl``, from ``env_steps``.

    ``inherited``: a new run from another run's weights (``init_from``; :func:`~acer_torchrl.checkpoint.cut_weights`
    keeps its ``source``): that run's segments come first, each naming its ``run_dir``, and this one says
    ``init_from`` (the file, its SHA-256, the run and seed it was cut from)."""
    lines = []
    if inherited is not None:
        source = inherited["source"]
        lines = [None if r is None else {**r, "run_dir": source["run_dir"]} for r in source["segments"]]
        extra = {"init_from": {k: inherited[k] for k in ("path", "sha256")} | {"run_dir": source["run_dir"],
                                                                                 "seed": source["seed"]}}
    else:
        extra = {}
    lines.append({"from_env_steps": env_steps, **this_process(), **extra})
    with open(run_dir / FILE, "a") as f:
        f.write("".join(json.dumps(line) + "\n" for line in lines))


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file ``path`` (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def started_from(records: list[dict | None]) -> dict:
    """``{"init_from": ...}`` of a run begun from another run's weights (:func:`record_segment`), else ``{}``."""
    return next(({"init_from": r["init_from"]} for r in records if r is not None and "init_from" in r), {})


def segments(run_dir: Path) -> list[dict | None]:
    """The records of ``<run_dir>/provenance.jsonl`` in order; a line that cannot be read (cut short by a kill) is
    None, and so is a first segment of a run begun before runs recorded theirs (its first line not from step 0)."""
    path = run_dir / FILE
    lines = path.read_text().splitlines() if path.exists() else []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            records.append(None)
    if not records or (records[0] is not None and records[0].get("from_env_steps", 0) > 0):
        records.insert(0, None)
    return records


def contributing(records: list[dict | None]) -> list[dict | None]:
    """The segments of :func:`segments` that the run's record comes from: a segment followed by one from the same env
    steps left nothing in it (it stopped before its first checkpoint, or its resume failed before training, and the
    next one went back to the same checkpoint), so it is left out; ``provenance.jsonl`` keeps every line."""
    def steps(record: dict | None) -> int | None:
        return None if record is None else record.get("from_env_steps")

    return [r for r, after in zip(records, [*records[1:], None])
            if steps(r) is None or steps(r) != steps(after)]


def summarize(records: list[dict | None], kind: str = "segments") -> dict[str, str]:
    """``code``, ``machine`` and ``date`` of several records (a run's segments, a benchmark row's invocations: the
    ``kind``): each distinct value once, in order; ``(some <kind> unrecorded)`` after the code where one is None."""
    known = [r for r in records if r is not None]
    if not known:
        return {"code": "unrecorded", "machine": "unrecorded", "date": "unrecorded"}
    dates = [r["date"] for r in known]
    unrecorded = f" (some {kind} unrecorded)" if None in records else ""
    return {"code": ", ".join(dict.fromkeys(r["code"] for r in known)) + unrecorded,
            "machine": " + ".join(dict.fromkeys(r["machine"] for r in known)),
            "date": dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"}
