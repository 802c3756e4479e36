"""Typed run configuration, presets and ``key=value`` overrides.

A run is described by :class:`Config`: shared sections (env, collector, replay, optim, network, eval,
log) plus one section per registered algorithm (``acer.*``, ``reactor.*``...), whose dataclass lives next
to its loss module. ``loss=<name>`` picks the algorithm; ``preset=<name>`` applies that algorithm's named
override set first; ``key=value`` pairs are applied last. Every mistake a user can make here (unknown key,
value of the wrong type or outside the range its dataclass declares with :func:`~acer_torchrl.validation.allowed`,
unknown preset) raises :class:`ConfigError` with one line naming the key and the fix.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from acer_torchrl.commands import shell_command
from acer_torchrl.rundir import check_dir_name
from acer_torchrl.settings import REGISTRY, get_algorithm
from acer_torchrl.settings.env import EnvConfig
from acer_torchrl.validation import INT64, MAX_WIDTH, ConfigError, allowed, check_allowed

ACTIVATIONS = ("relu", "tanh", "elu", "softsign")
OPTIMISERS = ("adam", "rmsprop")


@allowed(workers="[0, 256]", frames_per_batch="[1, 1e6]")
@dataclass
class CollectorConfig:
    workers: int = 2  # collector processes; 0 = single process in the learner (debugging)
    frames_per_batch: int = 64  # env steps in one yielded batch (one worker, all its envs)


@allowed(capacity="[1, 1e9]", batch_size="[1, 1e6]", seq_len="[1, 1e4]", min_size="[0, inf)",
         recurrent_state=("refresh", "stored", "zero"), priority_uniform="[0, 1]", priority_block="[1, 1e6]")
@dataclass
class ReplayConfig:
    capacity: int = 50_000  # env steps held (whole episodes evicted oldest first)
    batch_size: int = 16  # sequences per gradient step (steps, for single-step losses)
    seq_len: int = 20  # steps per sequence; sequences never cross an episode boundary
    min_size: int = 1_000  # replay updates start once this many steps are stored
    memmap: bool = False  # memory-mapped storage under <run_dir>/replay_storage (large Atari buffers)
    recurrent_state: str = "refresh"  # refresh | stored | zero: LSTM state at a sampled sequence's start
    # prioritized sequence replay (Reactor ICLR sec. 3.3): a window's priority is its mean |TD error| once trained on,
    # estimated from its neighbours' before; draws weighted by importance weights in every loss term
    prioritized: bool = False
    priority_uniform: float = 0.1  # share epsilon of uniform draws among the prioritized ones
    priority_block: int = 32  # steps forming a neighbourhood (lazy priorities; O(log blocks + block) per draw)
    # draw an update's batch on a thread while the update before it runs (the same draws; not with refresh or
    # prioritized: those draws read what the update before changes)
    prefetch: bool = False


@allowed(name=OPTIMISERS, lr="(0, inf)", eps="(0, inf)", alpha="[0, 1)", max_grad_norm="(0, inf]",
         weight_decay="[0, inf)", lr_end_factor="[0, 1]")
@dataclass
class OptimConfig:
    # adam, or rmsprop: A3C's optimiser (Mnih et al. 2016, sec. 4 and App. "Optimization"), which ACER (sec. 4) and
    # LASER's papers name, unshared here (one learner): torch.optim.RMSprop without momentum, eps outside the root
    name: str = "adam"
    lr: float = 1e-3  # step size
    eps: float = 1e-5  # added to the root of the squared-gradient average
    alpha: float = 0.99  # RMSProp's squared-gradient decay (optim.name=rmsprop; Adam's is its beta2 = 0.999)
    max_grad_norm: float = 40.0  # gradient-norm clipping (inf: none)
    weight_decay: float = 0.0  # L2 weight decay
    # linear step-size decay over the run: lr x (1 - (1 - lr_end_factor) x env_steps / total_frames);
    # 1.0 keeps it constant (a constant step never settles near an optimum: Robbins-Monro wants it to shrink);
    # the optimiser's step only: V-RACER's ReF-ER beta step (eq. 12) anneals by eq. 13 alone
    lr_end_factor: float = 1.0


@allowed(hidden=MAX_WIDTH, activation=ACTIVATIONS, lstm_hidden=MAX_WIDTH)
@dataclass
class NetworkConfig:
    hidden: list[int] = field(default_factory=lambda: [128, 128])  # MLP encoder widths
    activation: str = "relu"  # the encoder's nonlinearity
    lstm: bool = False  # add an LSTM core after the encoder
    lstm_hidden: int = 128  # LSTM state width (network.lstm=true)


@allowed(interval="[1, inf)", episodes="[1, inf)", max_steps="[1, inf)")
@dataclass
class EvalConfig:
    interval: int = 5_000  # env steps between greedy evaluations (more at 90, 95, 100 % of the run: the final score)
    episodes: int = 10  # greedy episodes per evaluation
    max_steps: int = 10_000  # per evaluation episode
    background: bool = True  # play evaluations in a process beside the learner (false: on the learner, between updates)


@allowed(checkpoint_interval="[1, inf)")
@dataclass
class LogConfig:
    progress: bool = True  # a tqdm progress bar on a terminal; a line per evaluation in a log file (stderr)
    tensorboard: bool = False  # also write TensorBoard events (needs the [tensorboard] extra)
    wandb: bool = False  # also log to Weights & Biases, offline under <run_dir>/wandb (needs the [wandb] extra)
    checkpoint_interval: int = 10_000  # env steps between checkpoints (also written at the end)

    def validate(self, cfg: Config) -> None:
        for package in ("tensorboard", "wandb"):  # each an extra of the same name
            if getattr(self, package) and importlib.util.find_spec(package) is None:
                raise ConfigError(
                    f"log.{package}=true needs the {package} package: pip install 'acer-torchrl[{package}]'"
                )


@allowed(seed="[0, 1e9]", total_frames="[1, inf)", gamma="(0, 1]", threads="[0, 1024]")
@dataclass
class Config:
    loss: str = "acer"  # the algorithm: one of the registry (acer_torchrl/settings/__init__.py)
    preset: str | None = None  # the algorithm's named override set, applied before the other keys
    seed: int = 0  # seeds torch, numpy, the replay's sampler, the envs (offset per worker) and each evaluation
    total_frames: int = 50_000  # env steps
    gamma: float = 0.99  # discount
    device: str = "auto"  # learner device: auto | cpu | cuda | cuda:<index> (acting stays on CPU)
    # the learner's torch intra-op threads; 0: the cores the collector workers leave free (at least 1).
    # More threads than free cores make every op wait for a core (measured: benchmarks/results/learner.md).
    threads: int = 0
    run_dir: str | None = None  # where the run writes (None: runs/<loss>-<env>-s<seed>-<time>)
    # a run directory to continue from its latest checkpoint; a changed setting is applied from there on if config.py's
    # APPLIED_ON_RESUME lists it (total_frames, optim.lr, eval.*, ...), else refused (env, loss, network, seed...)
    resume: str | None = None
    # a weights file (cut from a run's checkpoint by benchmarks/gpu/cut_weights.py) a new run starts from: its networks,
    # its counters (env steps, updates: the curve continues), the optimiser's state when the file keeps it; the replay
    # starts empty
    init_from: str | None = None
    overwrite: bool = False  # run_dir= may hold a finished run (summary.json, checkpoint): replace its files
    env: EnvConfig = field(default_factory=EnvConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # the selected algorithm's own section (ACERConfig, ...), filled by :func:`load_config`
    algo: Any = None

    def sections(self) -> list[tuple[str, Any]]:
        """``(key prefix, dataclass)`` of this config and of each of its sections, the algorithm's included."""
        nested = [(f"{f.name}.", getattr(self, f.name)) for f in dataclasses.fields(self)]
        return [("", self)] + [(p, s) for p, s in nested if dataclasses.is_dataclass(s) and p != "algo."] + [
            (f"{self.loss}.", self.algo)
        ]

    def preset_values(self) -> tuple[str, dict[str, Any]] | None:
        """``(name, its key: value dict)`` of the run's preset, None without one (what an error's example shows)."""
        if self.preset is None or self.loss not in REGISTRY:
            return None
        presets = get_algorithm(self.loss).presets
        return (self.preset, presets[self.preset]) if self.preset in presets else None

    def validate(self) -> None:
        """Every declared range (:func:`~acer_torchrl.validation.allowed`), then the checks across fields."""
        preset = self.preset_values()
        for prefix, section in self.sections():
            check_allowed(section, prefix, preset)
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:<index>, got {self.device!r}")
        if self.replay.min_size > self.replay.capacity:
            raise ConfigError(
                f"replay.min_size={self.replay.min_size} exceeds replay.capacity={self.replay.capacity}: "
                "replay updates would never start; lower replay.min_size"
            )
        steps_per_batch = self.replay.batch_size * self.replay.seq_len
        if steps_per_batch > self.replay.capacity:
            raise ConfigError(
                f"replay.batch_size x replay.seq_len = {steps_per_batch} steps per update exceed "
                f"replay.capacity={self.replay.capacity}; lower them or raise replay.capacity"
            )
        if self.collector.frames_per_batch > self.replay.capacity:
            raise ConfigError(
                f"collector.frames_per_batch={self.collector.frames_per_batch} exceeds replay.capacity="
                f"{self.replay.capacity}: a collected batch must fit in the replay; lower one or raise the other"
            )
        if self.collector.frames_per_batch % self.env.num_envs:
            raise ConfigError(
                f"collector.frames_per_batch={self.collector.frames_per_batch} is not a multiple of env.num_envs="
                f"{self.env.num_envs}: a batch holds as many steps of each env (TorchRL would round it up, and the "
                "record would not hold the batch the run collects); give a multiple"
            )
        if self.run_dir is not None and not self.run_dir.strip():
            raise ConfigError("run_dir= is empty; give a directory, or drop the key for a fresh runs/<name>")
        if self.run_dir is not None:
            check_dir_name(self.run_dir, "resume" if self.resume else "run_dir")
        from acer_torchrl.envs import validate_env_config

        try:
            validate_env_config(self.env)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        for _, section in self.sections()[1:]:
            if hasattr(section, "validate"):
                section.validate(self)

    def _unused_for_the_env(self) -> dict[str, str]:
        """The keys ``env.name``'s observations and actions leave unused: Atari's frame processing elsewhere, sticky
        actions with vectors, the MLP's widths and activation with frames or grids (a CNN encoder, ReLU built in), an
        algorithm's Gaussian-policy keys (its ``continuous_keys``) with discrete actions."""
        from acer_torchrl.envs import discrete_actions, observation_kind

        kind, name = observation_kind(self.env.name), f"env.name={self.env.name}"
        continuous_keys = getattr(self.algo, "continuous_keys", ())
        unused = dict.fromkeys(continuous_keys, f"{name} (discrete actions)") if continuous_keys and discrete_actions(
            self.env.name) else {}
        if kind != "pixel":
            unused.update(dict.fromkeys(("env.frame_skip", "env.noop_max", "env.episodic_life", "env.frame_stack"),
                                        f"{name} (Atari's keys)"))
        if kind == "vector":
            unused["env.repeat_action_probability"] = f"{name} (Atari's and MinAtar's sticky actions)"
        else:
            unused.update(dict.fromkeys(("network.hidden", "network.activation"), f"{name} (its CNN encoder)"))
        return unused

    def unused_keys(self) -> dict[str, str]:
        """``{key: the setting that leaves it unused}`` for the keys this run reads nowhere: the shared sections'
        here, the algorithm's in its section's own ``unused_keys(cfg)`` (like ``validate``, per algorithm)."""
        unused = {} if self.network.lstm else dict.fromkeys(
            ("network.lstm_hidden", "replay.recurrent_state"), "network.lstm=false")
        if not self.replay.prioritized:
            priority_keys = ("replay.priority_uniform", "replay.priority_block")
            unused.update(dict.fromkeys(priority_keys, "replay.prioritized=false"))
        else:  # each draw reads the priorities the update before wrote (Trainer.draws_ahead)
            unused["replay.prefetch"] = "replay.prioritized=true"
        if self.network.lstm and self.replay.recurrent_state == "refresh":  # draws run the network: Trainer.draws_ahead
            unused["replay.prefetch"] = "replay.recurrent_state=refresh"
        if self.optim.name != "rmsprop":
            unused["optim.alpha"] = f"optim.name={self.optim.name}"
        unused.update(self._unused_for_the_env())
        algorithm_unused = getattr(self.algo, "unused_keys", None)
        return {**unused, **(algorithm_unused(self) if algorithm_unused else {})}

    def rounded_settings(self) -> list[str]:
        """A note for each setting this run applies rounded (the algorithm section's ``rounded_settings(cfg)``)."""
        rounded = getattr(self.algo, "rounded_settings", None)
        return rounded(self) if rounded else []


# ----------------------------------------------------------------------------------------------
# Parsing and applying overrides
# ----------------------------------------------------------------------------------------------


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def _parse_int(value: Any) -> int:
    """``3``, ``"3"``, ``"10_000"``, ``"1e4"`` or ``4.0`` as an int; a ValueError for anything else."""
    if isinstance(value, int):
        return value
    text = str(value).strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None
    if not number.is_integer():
        raise ValueError(f"{value} is not an integer")
    return int(number)


def _list_items(text: str) -> list[str]:
    """The items of a list given on the command line: ``[128,128]``, ``128,128`` or ``128`` (``[]``: none); an
    unbalanced or nested bracket or an empty item is a ValueError, never read as some other list."""
    inner = text.strip()
    if inner.startswith("[") and inner.endswith("]"):
        inner = inner[1:-1]
    if "[" in inner or "]" in inner:
        raise ValueError(f"{text!r} is not a list like [128,128] (unbalanced or nested brackets)")
    items = [v.strip() for v in inner.split(",")] if inner.strip() else []
    if not all(items):
        raise ValueError(f"{text!r} has an empty item; give a list like [128,128]")
    return items


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Convert ``value`` (a string from the command line, or a YAML scalar) to ``annotation``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: cannot parse {value!r}")
    try:
        if origin is list:
            (item,) = args
            if isinstance(value, str):
                value = _list_items(value)
            return [_coerce(v, item, key) for v in value]
        if annotation is bool:
            return value if isinstance(value, bool) else _parse_bool(str(value))
        if annotation is int:
            if isinstance(value, bool):
                raise ValueError("a boolean is not an integer")
            number = _parse_int(value)
            if not INT64[0] <= number <= INT64[1]:
                raise ValueError(f"{value} is out of the 64-bit integer range")
            return number
        if annotation is float:
            if isinstance(value, bool):
                raise ValueError("a boolean is not a number")
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a number") from None
        if annotation is str:
            return str(value)
    except (TypeError, ValueError) as err:
        type_name = getattr(annotation, "__name__", str(annotation))
        raise ConfigError(f"config key '{key}' expects {type_name}: {err}") from None
    raise ConfigError(f"config key '{key}': unsupported type {annotation}")


def _field_types(obj: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(type(obj))
    return {f.name: hints[f.name] for f in dataclasses.fields(obj)}


def _valid_keys(obj: Any, prefix: str = "") -> list[str]:
    keys = []
    for name, annotation in _field_types(obj).items():
        value = getattr(obj, name)
        if name == "algo" and isinstance(obj, Config):  # its keys are <loss>.<field>
            continue
        if dataclasses.is_dataclass(value):
            keys += _valid_keys(value, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


# keys this package no longer has, with the value a run's config.yaml recorded for them then (a resume of such a run
# reads it: accepted, and it means nothing now) and why they went (any other value is refused in one line saying so)
REMOVED_KEYS = {
    key: (value, "torch.compile made the learner slower on a CPU and bought nothing on an H100 "
                 "(benchmarks/results/speed-pieces.md)")
    for key, value in (("compile", False), ("compile_mode", "default"))
}


def set_key(cfg: Config, key: str, value: Any) -> None:
    """Set a dotted ``key`` on ``cfg`` with type checking; the algorithm's section is ``<loss>.<field>``. A key of
    :data:`REMOVED_KEYS` is accepted with the value it stood for before it went, and refused with any other."""
    if key in REMOVED_KEYS:
        refuse_removed_key(key, value)
        return
    parts = key.split(".")
    target: Any = cfg
    if parts[0] == cfg.loss and len(parts) > 1:
        target, parts = cfg.algo, parts[1:]
    elif parts[0] in algorithm_names() and len(parts) > 1:
        raise ConfigError(
            f"config key '{key}' belongs to loss={parts[0]} but this run uses loss={cfg.loss}"
        )
    for i, part in enumerate(parts):
        types_ = _field_types(target)
        if part not in types_ or (target is cfg and part == "algo"):
            raise ConfigError(_unknown_key_message(cfg, key))
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(getattr(target, part)):
                raise ConfigError(f"config key '{key}' is a section; set one of its fields, e.g. {key}.<field>=...")
            setattr(target, part, _coerce(value, types_[part], key))
        else:
            target = getattr(target, part)
            if not dataclasses.is_dataclass(target):
                raise ConfigError(_unknown_key_message(cfg, key))


def refuse_removed_key(key: str, value: Any) -> None:
    """A one-line :class:`ConfigError` when ``value`` of the removed ``key`` asks for something that is gone."""
    before, why = REMOVED_KEYS[key]
    if _coerce(value, type(before), key) != before:
        raise ConfigError(f"{key}={value}: the key was removed ({why}); drop it")


def _unknown_key_message(cfg: Config, key: str) -> str:
    import difflib

    valid = _valid_keys(cfg) + [f"{cfg.loss}.{k}" for k in _valid_keys(cfg.algo)]
    close = difflib.get_close_matches(key, valid, n=3)
    if close:
        return f"unknown config key '{key}'; did you mean {', '.join(close)}?"
    section = key.split(".")[0] + "."
    in_section = sorted(k for k in valid if k.startswith(section))
    if "." in key and in_section:  # a section's keys, not all ~60 of them
        return f"unknown config key '{key}'; the keys of {section[:-1]} are {', '.join(in_section)}"
    sections = sorted({k.split(".")[0] for k in valid if "." in k})
    return (f"unknown config key '{key}'; the sections are {', '.join(sections)} (--help lists every key, "
            "docs/config.md explains them)")


def override_key(item: str) -> str:
    """The key of one ``key=value`` command-line item (the whole item when it has no ``=``)."""
    return item.partition("=")[0].strip()


def override_value(overrides: list[str], key: str) -> str | None:
    """The value of the last ``key=value`` in ``overrides`` (None if absent)."""
    values = [value.strip() for name, sep, value in (o.partition("=") for o in overrides) if sep and name.strip() == key]
    return values[-1] if values else None


def without_keys(overrides: list[str], *keys: str) -> list[str]:
    """``overrides`` less its items that set one of ``keys``."""
    return [o for o in overrides if override_key(o) not in keys]


def parse_overrides(overrides: list[str]) -> list[tuple[str, str]]:
    """The ``(key, value)`` pairs of ``key=value`` items, in order (a key given twice: the last one counts,
    as a script appending to a base command line expects; :func:`repeated_settings` says so)."""
    pairs = []
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        pairs.append((key.strip(), value.strip()))
    return pairs


def repeated_settings(overrides: list[str]) -> list[str]:
    """A note for each key given more than once in ``overrides`` (the command line), naming the value that counts:
    a second ``optim.lr=`` typed by mistake is said, not taken silently."""
    values: dict[str, list[str]] = {}
    for key, value in parse_overrides(overrides):
        values.setdefault(key, []).append(value)
    return [f"note: {key} is given {len(given)} times ({', '.join(given)}); the last, {key}={given[-1]}, counts"
            for key, given in values.items() if len(given) > 1]


def algorithm_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def load_config(recipe: str | None, overrides: list[str]) -> Config:
    """Build the config of a run: algorithm defaults, then the preset, then ``key=value`` overrides.

    With ``resume=<run_dir>`` the saved ``config.yaml`` of that run is the base instead and the other
    overrides (typically ``total_frames=``) are applied on top of it.
    """
    pairs = parse_overrides(overrides)
    given = dict(pairs)
    for key, what in (("resume", "a run directory"), ("init_from", "a weights file")):
        if key in given and not given[key]:  # e.g. resume=$RUN with RUN unset: not a new run in disguise
            raise ConfigError(f"{key}= is empty: give {what} ({key}=<path>), or leave {key} out for a new run")
    if "resume" in given:
        check_dir_name(given["resume"], "resume")
        saved = Path(given["resume"]) / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"resume={given['resume']}: no config.yaml there (not a run directory?)")
        cfg = _saved_config(saved, given["resume"])
        _refuse_branching(given["resume"], given.get("run_dir"))
        requested = {"loss": given.get("loss", recipe), "preset": given.get("preset")}
        for key, value in requested.items():
            if value is not None and value != getattr(cfg, key):
                raise _run_defining_change(given["resume"], key, getattr(cfg, key), value)
        for key, value in pairs:
            if key not in requested:
                set_key(cfg, key, value)
        cfg.run_dir = given["resume"]
        cfg.validate()
        check_resume_changes(cfg)
        return cfg

    loss = given.get("loss", recipe or "acer")
    algorithm = get_algorithm(loss)
    cfg = Config(loss=loss, algo=algorithm.config_cls())
    preset = given.get("preset") or algorithm.default_preset
    if preset is not None:
        if preset not in algorithm.presets:
            raise unknown_preset(preset, loss, algorithm.presets)
        cfg.preset = preset
        for key, value in algorithm.presets[preset].items():
            set_key(cfg, key, value)
    for key, value in pairs:
        if key not in ("loss", "preset"):
            set_key(cfg, key, value)
    cfg.validate()
    if preset is not None:
        _check_preset_fits_env(cfg, algorithm.presets)
    return cfg


def unknown_preset(preset: str, loss: str, presets: dict[str, dict]) -> ConfigError:
    """The one line refusing ``preset=<preset>``, which ``loss`` (its ``presets``) does not have."""
    return ConfigError(f"unknown preset '{preset}' for loss={loss}; choose one of {', '.join(presets)}")


def config_notes(cfg: Config, overrides: list[str]) -> list[str]:
    """The ``note:`` lines a run of ``overrides`` prints at its start: keys given twice, keys it reads nowhere,
    settings it applies rounded."""
    return [*repeated_settings(overrides), *unused_settings(cfg, overrides), *cfg.rounded_settings()]


def unused_settings(cfg: Config, overrides: list[str]) -> list[str]:
    """A note for each key of ``overrides`` (the command line) that ``cfg``'s run reads nowhere
    (:meth:`Config.unused_keys`): legitimately unused (e.g. a sweep over ``network.lstm``), so said once at start
    rather than refused. Only the keys given are noted: presets and defaults hold such keys on purpose."""
    unused = cfg.unused_keys()
    return [f"note: {key}={value} has no effect with {unused[key]}" for key, value in parse_overrides(overrides)
            if key in unused]


def _refuse_branching(resume: str, run_dir: str | None) -> None:
    """A resumed run trains on in its own directory: ``run_dir=`` naming another one (a branch of the run, which
    would otherwise be ignored while the original trains on) is one :class:`ConfigError` line saying how to branch."""
    if run_dir and Path(run_dir).resolve() != Path(resume).resolve():
        raise ConfigError(
            f"resume={resume} trains that run on in its own directory, not in run_dir={run_dir}; to branch it, copy "
            f"the run (cp -r {resume} {run_dir}) and resume the copy: resume={run_dir}"
        )


def _check_preset_fits_env(cfg: Config, presets: dict[str, dict]) -> None:
    """A one-line :class:`ConfigError` when ``env.name`` observes another kind of thing (vectors, Atari pixels,
    MinAtar grids) than the env its preset was made for (e.g. ``preset=cartpole env.name=ALE/Pong-v5``: an MLP on
    raw frames)."""
    from acer_torchrl.envs import observation_kind

    made_for = presets[cfg.preset].get("env.name")
    if made_for is None or observation_kind(made_for) == observation_kind(cfg.env.name):
        return
    kind = observation_kind(cfg.env.name)
    fitting = [name for name, p in presets.items() if "env.name" in p and observation_kind(p["env.name"]) == kind]
    raise ConfigError(
        f"preset={cfg.preset} is made for {observation_kind(made_for)} observations ({made_for}), but "
        f"env.name={cfg.env.name} gives {kind} observations; choose a preset made for them: "
        f"{', '.join(f'preset={n}' for n in fitting) or 'none of this algorithm has one'}"
    )


# The one rule for settings on resume: a key is *applied* (named here: the resumed trainer sets it on its live objects
# after the checkpoint is loaded, or reads it afresh at each use, see Trainer.apply_resumed_settings) or else
# *run-defining*, refused if changed: the env, the loss and its section, the network, gamma, the seed and the replay's
# shape, which the checkpoint's networks, optimiser state and replay were made for. A key not listed here is refused,
# never silently ignored: a new key joins this list once a resume really applies it.
APPLIED_ON_RESUME = (
    "total_frames", "device", "threads",
    "collector.workers", "collector.frames_per_batch",
    "replay.batch_size", "replay.seq_len", "replay.min_size", "replay.recurrent_state",
    "replay.prefetch",
    "optim.lr", "optim.eps", "optim.max_grad_norm", "optim.weight_decay", "optim.lr_end_factor",
    "eval.interval", "eval.episodes", "eval.max_steps", "eval.background",
    "log.progress", "log.tensorboard", "log.wandb", "log.checkpoint_interval",
)
RESUME_BOOKKEEPING = ("resume", "run_dir", "overwrite")  # where a run lives, not how it trains


def is_run_defining(key: str) -> bool:
    """Whether ``key`` (``section.field``; the algorithm's ``<loss>.field``) is refused if changed on resume: every
    key that is neither applied to the resumed run (:data:`APPLIED_ON_RESUME`) nor where it lives."""
    return key not in APPLIED_ON_RESUME and key not in RESUME_BOOKKEEPING


def trained_settings(cfg: Config) -> dict[str, Any]:
    """``cfg``'s keys and their values (lists for tuples), but where the run lives: what a checkpoint keeps of the
    settings it was trained with, so that a resume whose ``config.yaml`` was edited by hand is refused where the edit
    is run-defining (:func:`edited_settings`) and recorded as a change where it is applied (:func:`resume_changes`)."""
    def plain(value: Any) -> Any:
        return [plain(v) for v in value] if isinstance(value, (list, tuple)) else value

    return {k: plain(v) for k, v in flat_settings(cfg).items() if k not in RESUME_BOOKKEEPING}


def run_defining_settings(cfg: Config) -> dict[str, Any]:
    """``cfg``'s run-defining keys and their values (:func:`trained_settings`)."""
    return {k: v for k, v in trained_settings(cfg).items() if is_run_defining(k)}


def differing_settings(now: dict[str, Any], then: dict[str, Any]) -> list[str]:
    """The keys of ``then`` whose value ``now`` holds otherwise (a key ``now`` lacks, of another version of the
    package, is not compared)."""
    return [k for k, v in then.items() if k in now and now[k] != v]


def edited_settings(cfg: Config, trained_with: dict[str, Any]) -> ConfigError | None:
    """The one line refusing a resume of ``cfg.resume`` whose run-defining settings (from its ``config.yaml``) differ
    from ``trained_with``, those its checkpoint recorded; None when they agree (keys one side lacks, of another
    version of the package, are not compared)."""
    now = run_defining_settings(cfg)
    edited = differing_settings(now, trained_with)
    if not edited:
        return None
    listed = ", ".join(f"{k}={now[k]} (trained with {trained_with[k]})" for k in edited[:3])
    return ConfigError(f"resume={cfg.resume}: config.yaml holds {listed}, not the settings its checkpoint was trained "
                       "with (edited by hand?); put them back, or start a new run to change them")


def check_resume_changes(cfg: Config) -> dict[str, tuple[Any, Any]]:
    """The changes a ``resume=<run_dir>`` config makes to that run's ``config.yaml`` (:func:`resume_changes`), all of
    them applied ones; a one-line :class:`ConfigError` for the first run-defining one. What a resumed run (or a
    sweep's agent) calls before it builds anything."""
    changes = resume_changes(cfg)
    for key, (before, now) in changes.items():
        if is_run_defining(key):
            raise _run_defining_change(cfg.resume, key, before, now)
    return changes


def _run_defining_change(run_dir: str, key: str, before: Any, now: Any) -> ConfigError:
    """The one line refusing a resume of ``run_dir`` that would change its ``key`` from ``before`` to ``now``."""
    if key == "loss":  # e.g. recipes/laser.py resume=<an ACER run>
        return ConfigError(f"resume={run_dir} is a {before} run, not {now}: continue it with "
                           f"{shell_command(f'recipes/{before}.py', f'resume={run_dir}')}")
    return ConfigError(
        f"resume={run_dir}: {key}={now} differs from the run's {key}={before}; a resumed run keeps its "
        "env, loss, network, gamma, seed and replay shape (start a new run with run_dir=<new dir> to change them)"
    )


def flat_settings(cfg: Config) -> dict[str, Any]:
    """Every key of ``cfg`` as given on the command line (``section.field``; the algorithm's ``<loss>.field``)."""

    def walk(section: dict[str, Any], prefix: str) -> dict[str, Any]:
        flat = {}
        for name, value in section.items():
            flat.update(walk(value, f"{prefix}{name}.") if isinstance(value, dict) else {prefix + name: value})
        return flat

    return walk(to_dict(cfg), "")


def resume_changes(cfg: Config, trained_with: dict[str, Any] | None = None) -> dict[str, tuple[Any, Any]]:
    """The settings in which ``cfg`` (a ``resume=<run_dir>`` config) differs from that run's ``config.yaml``, or from
    ``trained_with`` (the settings its checkpoint recorded: :func:`trained_settings`) for the keys that holds:
    ``{key: (value before, value now)}``."""
    before = {**trained_settings(_saved_config(Path(cfg.resume) / "config.yaml", cfg.resume)), **(trained_with or {})}
    return {k: (before.get(k), v) for k, v in trained_settings(cfg).items() if before.get(k) != v}


MAX_CONFIG_BYTES = 64 * 1024  # a run's config.yaml holds ~100 keys in a few KB


class _NotARunsYaml(ValueError):
    """A file no run wrote: too large, or with YAML aliases (``dump_yaml`` writes neither)."""


def _file_stamp(path: Path) -> tuple[int, int]:
    """``(size, mtime_ns)`` of ``path``: what :func:`_read_yaml`'s cache is keyed by beside the path."""
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=4)
def _read_yaml(path: str, size: int, _mtime_ns: int) -> Any:
    """The YAML document in ``path``, read once per version of the file (a resume reads its config.yaml for the
    run and again for what it changes). Refused before parsing when larger than :data:`MAX_CONFIG_BYTES`, and
    when it holds an alias (``*name``): an alias bomb expands to gigabytes in an error message."""
    if size > MAX_CONFIG_BYTES:
        raise _NotARunsYaml(f"holds {size} bytes, more than a run's config.yaml ever does ({MAX_CONFIG_BYTES})")
    text = Path(path).read_text()
    if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text)):
        raise _NotARunsYaml("uses YAML aliases (*name), which no run writes")
    return yaml.safe_load(text)


def _saved_config(path: Path, resume: str) -> Config:
    """The config saved in ``path`` (a run's ``config.yaml``); a one-line :class:`ConfigError` when that file
    is unreadable, empty, not YAML or not a run's configuration."""
    fix = "restore that file, or start a new run with run_dir=<new dir>"
    try:
        data = copy.deepcopy(_read_yaml(str(path), *_file_stamp(path)))
    except _NotARunsYaml as err:
        raise ConfigError(f"resume={resume}: {path} {err}; {fix}") from None
    except yaml.MarkedYAMLError as err:
        where = err.problem_mark or err.context_mark
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = f"{err.problem or err.context}{line}"
        raise ConfigError(f"resume={resume}: {path} is not valid YAML ({problem}); {fix}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"resume={resume}: {path} cannot be read ({type(err).__name__}); {fix}") from None
    if not isinstance(data, dict) or not isinstance(data.get("loss", "acer"), str):
        raise ConfigError(f"resume={resume}: {path} holds no run configuration (empty or not a mapping); {fix}")
    try:
        return from_dict(data)
    except (ConfigError, TypeError) as err:
        raise ConfigError(f"resume={resume}: {path}: {err}") from None


def to_dict(cfg: Config) -> dict[str, Any]:
    out = dataclasses.asdict(dataclasses.replace(cfg, algo=None))
    out.pop("algo")
    out[cfg.loss] = dataclasses.asdict(cfg.algo)
    return out


def from_dict(data: dict[str, Any]) -> Config:
    """Inverse of :func:`to_dict`, with the same type checks as command-line overrides."""
    loss = data.get("loss", "acer")
    cfg = Config(loss=loss, algo=get_algorithm(loss).config_cls())

    def walk(section: dict[str, Any], prefix: str) -> None:
        for name, value in section.items():
            key = f"{prefix}{name}"
            if isinstance(value, dict):
                walk(value, key + ".")
            elif key != "loss":
                set_key(cfg, key, value)

    walk(data, "")
    return cfg


def dump_yaml(cfg: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
