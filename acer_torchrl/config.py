"""Typed run configuration, presets and ``key=value`` overrides.

A run is described by :class:`Config`: shared sections (env, collector, replay, optim, network, eval,
log) plus one section per registered algorithm (``acer.*``, ``reactor.*``...), whose dataclass lives next
to its loss module. ``loss=<name>`` picks the algorithm; ``preset=<name>`` applies that algorithm's named
override set first; ``key=value`` pairs are applied last. Every mistake a user can make here (unknown key,
value of the wrong type, unknown preset) raises :class:`ConfigError` with one line naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from acer_torchrl.envs import EnvConfig


class ConfigError(ValueError):
    """A user mistake in the configuration; the CLI prints its message as one line."""


@dataclass
class CollectorConfig:
    workers: int = 2  # collector processes; 0 = single process in the learner (debugging)
    frames_per_batch: int = 64  # env steps in one yielded batch (one worker, all its envs)


@dataclass
class ReplayConfig:
    capacity: int = 50_000  # env steps held (whole episodes evicted oldest first)
    batch_size: int = 16  # sequences per gradient step (steps, for single-step losses)
    seq_len: int = 20  # steps per sequence; sequences never cross an episode boundary
    min_size: int = 1_000  # replay updates start once this many steps are stored
    memmap: bool = False  # memory-mapped storage under <run_dir>/replay_storage (large Atari buffers)
    recurrent_state: str = "refresh"  # refresh | stored | zero: LSTM state at a sampled sequence's start


@dataclass
class OptimConfig:
    lr: float = 1e-3
    eps: float = 1e-5
    max_grad_norm: float = 40.0
    weight_decay: float = 0.0
    # linear step-size decay over the run: lr x (1 - (1 - lr_end_factor) x env_steps / total_frames);
    # 1.0 keeps it constant (a constant step never settles near an optimum: Robbins-Monro wants it to shrink)
    lr_end_factor: float = 1.0


@dataclass
class NetworkConfig:
    hidden: list[int] = field(default_factory=lambda: [128, 128])  # MLP encoder widths
    activation: str = "relu"  # relu | tanh | elu
    lstm: bool = False  # add an LSTM core after the encoder
    lstm_hidden: int = 128


@dataclass
class EvalConfig:
    interval: int = 5_000  # env steps between greedy evaluations (more at 90, 95, 100 % for the final score)
    episodes: int = 10  # greedy episodes per evaluation
    max_steps: int = 10_000  # per evaluation episode


@dataclass
class LogConfig:
    progress: bool = True  # tqdm progress bar
    tensorboard: bool = False
    checkpoint_interval: int = 10_000  # env steps between checkpoints (also written at the end)


@dataclass
class Config:
    loss: str = "acer"
    preset: str | None = None
    seed: int = 0
    total_frames: int = 50_000  # env steps
    gamma: float = 0.99
    device: str = "auto"  # learner device: auto | cpu | cuda
    # the learner's torch intra-op threads; 0: the cores the collector workers leave free (at least 1).
    # More threads than free cores make every op wait for a core (~0.5 ms each, measured).
    threads: int = 0
    run_dir: str | None = None
    resume: str | None = None
    env: EnvConfig = field(default_factory=EnvConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # the selected algorithm's own section (ACERConfig, ...), filled by :func:`load_config`
    algo: Any = None

    def validate(self) -> None:
        if self.total_frames <= 0:
            raise ConfigError(f"total_frames must be > 0, got {self.total_frames}")
        if not 0.0 < self.gamma <= 1.0:
            raise ConfigError(f"gamma must be in (0, 1], got {self.gamma}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.threads < 0:
            raise ConfigError(f"threads must be >= 0 (0: the cores the collector workers leave), got {self.threads}")
        if self.collector.workers < 0 or self.collector.frames_per_batch <= 0:
            raise ConfigError("collector.workers must be >= 0 and collector.frames_per_batch > 0")
        if not 0.0 <= self.optim.lr_end_factor <= 1.0:
            raise ConfigError(f"optim.lr_end_factor must be in [0, 1] (1: constant lr), got {self.optim.lr_end_factor}")
        r = self.replay
        if r.capacity <= 0 or r.batch_size <= 0 or r.seq_len <= 0:
            raise ConfigError("replay.capacity, replay.batch_size and replay.seq_len must be > 0")
        if r.recurrent_state not in ("refresh", "stored", "zero"):
            raise ConfigError(
                f"replay.recurrent_state must be refresh, stored or zero, got {r.recurrent_state!r}"
            )
        if self.network.activation not in ACTIVATIONS:
            raise ConfigError(
                f"network.activation must be one of {sorted(ACTIVATIONS)}, got {self.network.activation!r}"
            )
        from acer_torchrl.envs import validate_env_config

        try:
            validate_env_config(self.env)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if hasattr(self.algo, "validate"):
            self.algo.validate(self)


ACTIVATIONS = ("relu", "tanh", "elu", "softsign")


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
                value = [v for v in value.replace("[", "").replace("]", "").split(",") if v.strip()]
            return [_coerce(v, item, key) for v in value]
        if annotation is bool:
            return value if isinstance(value, bool) else _parse_bool(str(value))
        if annotation is int:
            if isinstance(value, bool):
                raise ValueError("a boolean is not an integer")
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{value} is not an integer")
            text = str(value).replace("_", "")
            return int(float(text)) if "e" in text.lower() else int(text)
        if annotation is float:
            if isinstance(value, bool):
                raise ValueError("a boolean is not a number")
            return float(value)
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
        if dataclasses.is_dataclass(value):
            keys += _valid_keys(value, f"{prefix}{name}.")
        elif name != "algo":
            keys.append(prefix + name)
    return keys


def set_key(cfg: Config, key: str, value: Any) -> None:
    """Set a dotted ``key`` on ``cfg`` with type checking; the algorithm's section is ``<loss>.<field>``."""
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


def _unknown_key_message(cfg: Config, key: str) -> str:
    import difflib

    valid = _valid_keys(cfg) + [f"{cfg.loss}.{k}" for k in _valid_keys(cfg.algo)]
    close = difflib.get_close_matches(key, valid, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(sorted(valid))}"
    return f"unknown config key '{key}'{hint}"


def parse_overrides(overrides: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        pairs.append((key.strip(), value.strip()))
    return pairs


def algorithm_names() -> tuple[str, ...]:
    from acer_torchrl.algorithms import REGISTRY

    return tuple(REGISTRY)


def load_config(recipe: str | None, overrides: list[str]) -> Config:
    """Build the config of a run: algorithm defaults, then the preset, then ``key=value`` overrides.

    With ``resume=<run_dir>`` the saved ``config.yaml`` of that run is the base instead and the other
    overrides (typically ``total_frames=``) are applied on top of it.
    """
    from acer_torchrl.algorithms import get_algorithm

    pairs = parse_overrides(overrides)
    given = dict(pairs)
    if "resume" in given and given["resume"]:
        saved = Path(given["resume"]) / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"resume={given['resume']}: no config.yaml there (not a run directory?)")
        cfg = from_dict(yaml.safe_load(saved.read_text()))
        for key, value in pairs:
            if key not in ("loss", "preset"):
                set_key(cfg, key, value)
        cfg.run_dir = given["resume"]
        cfg.validate()
        return cfg

    loss = given.get("loss", recipe or "acer")
    algorithm = get_algorithm(loss)
    cfg = Config(loss=loss, algo=algorithm.config_cls())
    preset = given.get("preset") or algorithm.default_preset
    if preset is not None:
        if preset not in algorithm.presets:
            raise ConfigError(
                f"unknown preset '{preset}' for loss={loss}; choose one of {', '.join(algorithm.presets)}"
            )
        cfg.preset = preset
        for key, value in algorithm.presets[preset].items():
            set_key(cfg, key, value)
    for key, value in pairs:
        if key not in ("loss", "preset"):
            set_key(cfg, key, value)
    cfg.validate()
    return cfg


def to_dict(cfg: Config) -> dict[str, Any]:
    out = dataclasses.asdict(dataclasses.replace(cfg, algo=None))
    out.pop("algo")
    out[cfg.loss] = dataclasses.asdict(cfg.algo)
    return out


def from_dict(data: dict[str, Any]) -> Config:
    """Inverse of :func:`to_dict`, with the same type checks as command-line overrides."""
    from acer_torchrl.algorithms import get_algorithm

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
