"""The loss registry: ``loss=<name>`` picks one of these over the very same collector, replay and trainer.

A loss joins with one line below: the module that defines its ``ALGORITHM`` (an :class:`Algorithm`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from acer_torchrl.agent import Agent
    from acer_torchrl.config import Config
    from acer_torchrl.envs import EnvInfo

REGISTRY: dict[str, str] = {
    "acer": "acer_torchrl.objectives.acer",
    "reactor": "acer_torchrl.objectives.reactor",
    "vracer": "acer_torchrl.objectives.vracer",
    "laser": "acer_torchrl.objectives.laser",
}


@dataclass(frozen=True)
class Algorithm:
    """What the shared pipeline needs to know about one loss.

    ``build(cfg, env_info)`` returns the :class:`~acer_torchrl.agent.Agent` (networks, loss module, acting
    and greedy policies). ``presets`` maps a preset name to ``{dotted.key: value}`` overrides.
    """

    name: str
    config_cls: type
    build: Callable[["Config", "EnvInfo"], "Agent"]
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_preset: str | None = None


def get_algorithm(name: str) -> Algorithm:
    from acer_torchrl.config import ConfigError

    if name not in REGISTRY:
        raise ConfigError(f"unknown loss '{name}'; choose one of {', '.join(REGISTRY)}")
    module = importlib.import_module(REGISTRY[name])
    return module.ALGORITHM
