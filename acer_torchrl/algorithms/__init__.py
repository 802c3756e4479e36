"""The algorithm registry: ``loss=<name>`` picks one of these over the very same collector, replay and trainer.

Each algorithm is three files: its loss (``objectives/<name>.py``: torch, tensordict and torchrl only), its
``<name>.*`` keys and presets (``settings/<name>.py``: no torch, so that ``--help`` prints at once) and, here,
``algorithms/<name>.py``: its networks and ``build(cfg, env_info) -> Agent``, ending with its ``ALGORITHM``.
It joins with one line below.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from acer_torchrl.validation import ConfigError

if TYPE_CHECKING:
    from acer_torchrl.agent import Agent
    from acer_torchrl.config import Config
    from acer_torchrl.envs import EnvInfo

REGISTRY: dict[str, str] = {
    "acer": "acer_torchrl.algorithms.acer",
    "reactor": "acer_torchrl.algorithms.reactor",
    "vracer": "acer_torchrl.algorithms.vracer",
    "laser": "acer_torchrl.algorithms.laser",
}


@dataclass(frozen=True)
class Algorithm:
    """What the shared pipeline needs to know about one loss.

    ``build(cfg, env_info)`` returns the :class:`~acer_torchrl.agent.Agent` (networks, loss module, acting
    and greedy policies). ``presets`` maps a preset name to ``{dotted.key: value}`` overrides. ``build_reads``
    names the fields of ``config_cls`` that ``build`` reads itself (network sizes, updater periods); every other
    field goes to the loss through :func:`loss_options`, which refuses a field that neither reaches.
    """

    name: str
    config_cls: type
    build: Callable[["Config", "EnvInfo"], "Agent"]
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_preset: str | None = None
    build_reads: tuple[str, ...] = ()


def get_algorithm(name: str) -> Algorithm:
    if name not in REGISTRY:
        raise ConfigError(f"unknown loss '{name}'; choose one of {', '.join(REGISTRY)}")
    module = importlib.import_module(REGISTRY[name])
    return module.ALGORITHM


def unread_fields(section: Any, loss_cls: type, build_reads: tuple[str, ...]) -> list[str]:
    """The fields of the config ``section`` (a dataclass or its instance) that nothing reads: neither an argument
    of ``loss_cls``'s constructor nor named in ``build_reads``."""
    params = inspect.signature(loss_cls.__init__).parameters
    return [f.name for f in dataclasses.fields(section) if f.name not in params and f.name not in build_reads]


def loss_options(section: Any, loss_cls: type, build_reads: tuple[str, ...], **given: Any) -> dict[str, Any]:
    """The keyword arguments of ``loss_cls`` that its config ``section`` (``cfg.algo``) holds, under the same
    names, with ``given`` (what ``build`` derives: networks' keys, env-dependent values) on top. A loss
    option is thus written twice, not three times: in the loss's signature (its default, for use without
    this package) and in the config dataclass (its range and the presets); ``build`` does not list it.

    ``build_reads`` are the fields ``build`` reads itself (:attr:`Algorithm.build_reads`); a field of ``section``
    that is neither a loss argument nor one of them raises :class:`ConfigError`, so that no setting is dropped."""
    unread = unread_fields(section, loss_cls, build_reads)
    if unread:
        raise ConfigError(
            f"{type(section).__name__} field(s) {', '.join(unread)} reach nothing: {loss_cls.__name__} takes no "
            "argument of that name and build does not read them"
        )
    params = inspect.signature(loss_cls.__init__).parameters
    options = {f.name: getattr(section, f.name) for f in dataclasses.fields(section) if f.name in params}
    return {**options, **given}
