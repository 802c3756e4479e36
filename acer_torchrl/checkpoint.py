"""Atomic, pickle-free checkpoints of a run: model/optimiser/loss state, counters and the whole replay.

Layout under ``<run_dir>``: ``checkpoint/`` holds ``state.pt`` (tensors and plain containers only, read
back with ``torch.load(weights_only=True)``: no arbitrary code runs on load), ``counters.json`` and
``replay/`` (the filled slots as raw tensor files beside a JSON layout, read without unpickling, plus the
episode links). A checkpoint is written to ``checkpoint.tmp/`` and swapped in by renames, so a kill at any
moment leaves a complete checkpoint (``checkpoint/`` or, between the two renames, ``checkpoint.old/``).
``manifest.json`` lists every file with its size and CRC-32; a checkpoint is verified against it before
anything is read (a truncated, damaged or foreign file is one line, not zeros in the replay). The replay's
tensors are written straight from their memory (:func:`write_tensor`), their CRC-32 computed on the bytes as
they go out, so that a checkpoint is written once and not read back; the previous checkpoint is removed while
training goes on (``benchmarks/checkpoint_speed.py``, ``benchmarks/results/checkpoints.md``). torch is
imported where a checkpoint is saved or loaded, so that :class:`CheckpointError` costs the command line
(``--help``) no torch import. A disk too full for a checkpoint, or an I/O error while writing it, is one
:class:`CheckpointError` line (:func:`_write_errors_reported`): the previous checkpoint stays, the partial
``checkpoint.tmp/`` is removed.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

from acer_torchrl.metrics import os_reason


MANIFEST = "manifest.json"
CHUNK_BYTES = 1 << 20  # a tensor is checksummed and written in pieces this size (still in the CPU's cache)
_removal: threading.Thread | None = None  # the previous checkpoint's removal (:func:`_remove_in_background`)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or does not fit the run; the message is one line."""


def _write_errors_reported(save):
    """``save_checkpoint``'s guard. A disk without room for the checkpoint is refused before anything is written
    (a memory-mapped replay file written into a full disk kills the process with SIGBUS, past any handler); a
    write that fails anyway (the disk filled meanwhile, an I/O error) removes ``checkpoint.tmp/`` and ends in one
    :class:`CheckpointError` line naming the path and the cause. The previous checkpoint is not touched."""

    @functools.wraps(save)
    def guarded(run_dir: Path, state: dict, counters: dict, replay, *args, **kwargs) -> None:
        tmp = run_dir / "checkpoint.tmp"
        needed = _state_bytes(state) + getattr(replay, "saved_bytes", lambda: 0)()
        free = shutil.disk_usage(run_dir).free
        if free < needed * 1.1 + (1 << 16):  # a margin for the small files (counters, manifest)
            raise CheckpointError(f"cannot write the checkpoint {tmp}: no space left on device (it needs about "
                                  f"{needed / 1e6:.1f} MB, {free / 1e6:.1f} MB are free); {_previous(run_dir)}")
        try:
            save(run_dir, state, counters, replay, *args, **kwargs)
        except (OSError, RuntimeError) as err:
            if isinstance(err, RuntimeError) and not any(w in str(err) for w in ("PytorchStreamWriter", "inline_container")):
                raise  # not a failed write (torch's writer says so in these words)
            cause = _write_failure(err, run_dir)
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"cannot write the checkpoint {tmp}: {cause}; {_previous(run_dir)}") from None

    return guarded


def _state_bytes(value) -> int:
    """The bytes of the tensors in a nest of dicts, lists and tuples."""
    if isinstance(value, dict):
        return sum(_state_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_state_bytes(v) for v in value)
    return value.nelement() * value.element_size() if hasattr(value, "element_size") else 0


def _write_failure(err: Exception, run_dir: Path) -> str:
    """Why a checkpoint write failed, in words: the OS's (e.g. "no space left on device"), or for torch's writer
    (no errno) a full disk when it is one, else its message's first line."""
    if isinstance(err, OSError) and err.errno:
        return os_reason(err)
    if shutil.disk_usage(run_dir).free < 1 << 20:
        return "no space left on device"
    return f"write failed ({str(err).splitlines()[0] if str(err) else type(err).__name__})"


def _previous(run_dir: Path) -> str:
    """What a failed checkpoint leaves to resume from."""
    try:
        path = latest_checkpoint(run_dir)
        steps = json.loads((path / "counters.json").read_text())["env_steps"]
    except (CheckpointError, OSError, ValueError, KeyError):
        return "no earlier checkpoint to resume from"
    return f"the previous checkpoint ({path}, {steps} env steps) is kept"


@_write_errors_reported
def save_checkpoint(run_dir: Path, state: dict, counters: dict, replay) -> None:
    """Write ``state`` (``torch.save``), ``counters`` (JSON) and ``replay`` (its ``save``, which may return the
    manifest entries of the files it wrote) as ``run_dir``'s checkpoint, atomically."""
    import torch

    final, tmp, old = (run_dir / n for n in ("checkpoint", "checkpoint.tmp", "checkpoint.old"))
    _wait_for_removal()
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    checksums = replay.save(tmp / "replay") or {}
    (tmp / "counters.json").write_text(json.dumps(counters))
    write_manifest(tmp, {f"replay/{name}": entry for name, entry in checksums.items()})
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    _remove_in_background(old)


def _remove_in_background(path: Path) -> None:
    """Remove ``path`` (the previous checkpoint: unlinking gigabytes takes a second) in a thread while training
    goes on. The next :func:`save_checkpoint` waits for it first and the interpreter at exit; a kill leaves part
    of ``checkpoint.old``, which no load prefers to the complete ``checkpoint`` and the next save removes."""
    global _removal
    _removal = threading.Thread(
        target=shutil.rmtree, args=(path,), kwargs={"ignore_errors": True}, name="checkpoint-removal"
    )
    _removal.start()


def _wait_for_removal() -> None:
    if _removal is not None:
        _removal.join()


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


def _memory_of(tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor (memory-mapped or not), without a copy."""
    import torch

    return memoryview(tensor.view(-1).view(torch.uint8).numpy())


def write_tensor(path: Path, tensor) -> dict:
    """Write a contiguous tensor's bytes to ``path`` (a raw file, no header) and return its manifest entry,
    ``{"bytes": size, "crc32": checksum}``, the checksum computed on the bytes in memory as they are written."""
    data = _memory_of(tensor)
    crc = 0
    with open(path, "wb") as f:
        for start in range(0, len(data), CHUNK_BYTES):
            chunk = data[start : start + CHUNK_BYTES]
            crc = zlib.crc32(chunk, crc)
            f.write(chunk)
    return {"bytes": len(data), "crc32": crc}


def read_tensor(path: Path, tensor) -> None:
    """Fill a contiguous tensor in place with a file written by :func:`write_tensor` (``ValueError`` unless the
    file holds exactly the tensor's bytes)."""
    data = _memory_of(tensor)
    size = path.stat().st_size
    if size != len(data):
        raise ValueError(f"{path.name} holds {size} bytes, its tensor {len(data)}")
    with open(path, "rb") as f:
        for start in range(0, len(data), CHUNK_BYTES):
            chunk = data[start : start + CHUNK_BYTES]
            if f.readinto(chunk) != len(chunk):
                raise ValueError(f"{path.name} ended early")


def _files(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(path: Path, known: dict[str, dict] | None = None) -> None:
    """``manifest.json``: ``{file: {"bytes": size, "crc32": checksum}}`` of every file under ``path``; the
    entries of ``known`` (those :func:`write_tensor` returned, by path relative to ``path``) as given, the
    other files read."""
    known = known or {}
    files = {
        name: known.get(name) or {"bytes": (path / name).stat().st_size, "crc32": _crc32(path / name)}
        for name in _files(path)
    }
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


def load_checkpoint(run_dir: Path, replay=None, check: Callable[[dict], None] | None = None) -> tuple[dict, dict]:
    """Return ``(state, counters)`` of the latest checkpoint and restore ``replay`` (if given) in place; any damage
    -> :class:`CheckpointError`. ``check(state)`` runs before the replay is read: a refusal of its own (settings
    edited by hand) is said as such, not as damage when the replay then does not fit. A replay that cannot be written
    where it is restored (a memory-mapped replay's ``replay_storage``) is said as that, not as damage."""
    import torch

    path = latest_checkpoint(run_dir)
    verify_manifest(path)
    try:
        counters = json.loads((path / "counters.json").read_text())
        state = torch.load(path / "state.pt", weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - any failure here means the files are unusable
        raise _damaged(path, err) from None
    if check is not None:
        check(state)
    if replay is not None:
        try:
            replay.load(path / "replay")
        except OSError as err:
            if err.filename is None or Path(err.filename).is_relative_to(path):
                raise _damaged(path, err) from None
            raise CheckpointError(f"checkpoint {path}: its replay cannot be restored into {err.filename} "
                                  f"({os_reason(err)})") from None
        except Exception as err:  # noqa: BLE001 - any failure here means the files are unusable
            raise _damaged(path, err) from None
    return state, counters


def _damaged(path: Path, err: BaseException) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} is corrupt or unreadable ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    )


# ------------------------------------------------------------------ weights only (a new run from a run's learner)
WEIGHTS_MAX_BYTES = 16 << 20  # what a weights file may hold: small enough to commit (benchmarks/gpu/window.sh)
NOT_CARRIED = ("rng", "health", "next_eval", "next_checkpoint")  # a new run's own: its seed's, its schedules


def cut_weights(run_dir: Path, out: Path, max_bytes: int = WEIGHTS_MAX_BYTES) -> dict:
    """Write ``out``, the weights-only file of ``run_dir``'s latest checkpoint that a new run starts from
    (``init_from=<out>``): the loss's state (its networks, the average / target copies it keeps), the statistics its
    agent fitted beside them (``estimates``: the state standardisation's ``fitted`` flag, V-RACER's reward scale; not
    its per-step columns, which belong to the replay), the target networks' copy counters, the run's counters (env
    steps, updates, episodes, clocks; not its RNG, divergence watch or schedules), the algorithm, env and
    ``network.*`` settings they belong to; the optimiser's state too when the whole fits in
    ``max_bytes`` (ACER's Atari network and its average network are 13.5 MB, Adam's moments as much again: left
    out). No replay. Returns what it kept: ``bytes``, ``optimizer`` (bool), ``env_steps``, ``updates``."""
    import torch
    import yaml

    if out.is_dir():
        raise CheckpointError(f"{out} is a directory: give the weights file's path (e.g. {out / 'weights.pt'})")
    from acer_torchrl.provenance import contributing, segments

    state, counters = load_checkpoint(run_dir)
    # the settings the checkpoint was trained with, not config.yaml's (a file anyone can edit)
    trained = state.get("settings")
    if not trained:  # a checkpoint of before they were kept: config.yaml's
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        trained = {"loss": config["loss"], "env.name": config["env"]["name"], "seed": config.get("seed"),
                   **{f"network.{k}": v for k, v in config["network"].items()}}
    weights = {
        "algorithm": trained["loss"],
        "env": trained["env.name"],
        # what the weights' shapes do not say (the activation): compared by init_from
        "network": {k.removeprefix("network."): v for k, v in trained.items() if k.startswith("network.")},
        "loss": state["loss"],
        "updater_counters": state.get("updater_counters", []),
        "counters": {k: v for k, v in counters.items() if k not in NOT_CARRIED},
        # where they come from: the run (its directory, seed) and what it ran on, for the new run's provenance.jsonl
        "source": {"run_dir": str(run_dir.resolve()), "seed": trained.get("seed"),
                   "segments": [r for r in contributing(segments(run_dir))
                                if r is None or r["from_env_steps"] < counters["env_steps"]]},
    }
    if "estimates" in state:  # its tensors: the statistics (a dict of per-step columns stays with the replay)
        weights["estimates"] = {k: v for k, v in state["estimates"].items() if isinstance(v, torch.Tensor)}
    if _state_bytes(weights) + _state_bytes(state["optimizer"]) <= max_bytes:
        weights["optimizer"] = state["optimizer"]
    size = _state_bytes(weights)
    if size > max_bytes:
        raise CheckpointError(f"the weights of {run_dir} are {size / 1e6:.1f} MB, more than {max_bytes / 1e6:.1f} MB")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save(weights, tmp)
    try:
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"bytes": out.stat().st_size, "optimizer": "optimizer" in weights,
            "env_steps": counters["env_steps"], "updates": counters["updates"]}


def load_weights(path: Path) -> dict:
    """A weights file of :func:`cut_weights` (read without unpickling); a one-line :class:`CheckpointError` when
    ``path`` is missing or not one."""
    import zipfile

    import torch

    try:
        with zipfile.ZipFile(path) as archive:  # torch.load does not check the members' CRC-32
            damaged = archive.testzip()
    except OSError as err:
        raise CheckpointError(f"init_from={path} cannot be read ({os_reason(err)})") from None
    except zipfile.BadZipFile:
        damaged = None  # not a torch file: torch.load says so below
    if damaged is not None:
        raise CheckpointError(f"init_from={path} is damaged ({damaged} fails its CRC-32 check); cut it again from its "
                              "run directory with benchmarks/gpu/cut_weights.py")
    try:
        weights = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - any failure here means the file is unusable
        if isinstance(err, OSError):
            raise CheckpointError(f"init_from={path} cannot be read ({os_reason(err)})") from None
        # (torch's own message would suggest weights_only=False: unpickling a file of unknown origin)
        raise CheckpointError(f"init_from={path} is not a weights file (torch.load: {type(err).__name__}); cut one "
                              "from a run directory with benchmarks/gpu/cut_weights.py") from None
    missing = [k for k in ("algorithm", "env", "loss", "counters") if not isinstance(weights, dict) or k not in weights]
    if missing:
        raise CheckpointError(f"init_from={path} is not a weights file (no {missing[0]}); cut one from a run directory "
                              "with benchmarks/gpu/cut_weights.py")
    return weights
