"""Each algorithm's config section and presets, importable without torch (``recipes/<algo>.py --help``), and the
algorithm registry: ``loss=<name>`` picks one of these over the very same collector, replay and trainer.

Each algorithm is three files: its loss (``objectives/<name>.py``: torch, tensordict and torchrl only), its
``<name>.*`` keys, presets and :class:`Algorithm` (``settings/<name>.py``: no torch, so that ``--help`` prints at
once) and ``algorithms/<name>.py``: its networks and ``build(cfg, env_info) -> Agent``, which the settings name by
its dotted path. It joins with one line in :data:`REGISTRY`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from acer_torchrl.validation import ConfigError

if TYPE_CHECKING:
    from acer_torchrl.agent import Agent
    from acer_torchrl.config import Config
    from acer_torchrl.envs import EnvInfo

# the collected batches whose windows the trainer keeps for an update's fresh share (replay.py OnlineWindows)
FRESH_BATCHES_KEPT = 4


def fresh_windows(online_share: float, batch_size: int) -> int:
    """The fresh collected windows an update's batch of ``batch_size`` takes for ``online_share``: the share
    rounded to whole windows (what the trainer draws, what LASER's settings check and note)."""
    return round(online_share * batch_size)
# what an update's draw from the replay reads: unused by a loss that never draws from it
REPLAY_DRAW_KEYS = ("replay.batch_size", "replay.min_size", "replay.prioritized", "replay.priority_uniform",
                    "replay.priority_block", "replay.recurrent_state", "replay.prefetch")

REGISTRY: dict[str, str] = {  # loss name -> the module whose ALGORITHM it is
    "acer": "acer_torchrl.settings.acer",
    "reactor": "acer_torchrl.settings.reactor",
    "vracer": "acer_torchrl.settings.vracer",
    "laser": "acer_torchrl.settings.laser",
}


@dataclass(frozen=True)
class Algorithm:
    """What the shared pipeline needs to know about one loss.

    ``builder`` is the dotted path of its ``build(cfg, env_info)``, which returns the
    :class:`~acer_torchrl.agent.Agent` (networks, loss module, acting and greedy policies): imported by
    :meth:`build` only, so that the registry stays torch-free. ``presets`` maps a preset name to
    ``{dotted.key: value}`` overrides. ``build_reads`` names the fields of ``config_cls`` that ``build`` reads
    itself (network sizes, updater periods); every other field goes to the loss through
    :func:`~acer_torchrl.algorithms.loss_options`, which refuses a field that neither reaches.
    """

    name: str
    config_cls: type
    builder: str
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    default_preset: str | None = None
    build_reads: tuple[str, ...] = ()

    def build(self, cfg: Config, info: EnvInfo) -> Agent:
        """The agent of ``cfg`` on the env ``info`` describes, made by ``builder``."""
        module, _, function = self.builder.rpartition(".")
        return getattr(importlib.import_module(module), function)(cfg, info)


def get_algorithm(name: str) -> Algorithm:
    if name not in REGISTRY:
        raise ConfigError(f"unknown loss '{name}'; choose one of {', '.join(REGISTRY)}")
    return importlib.import_module(REGISTRY[name]).ALGORITHM
