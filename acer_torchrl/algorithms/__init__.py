"""What every algorithm's ``build`` shares: :func:`loss_options` hands a loss its options from the config section.

Each algorithm's ``algorithms/<name>.py`` holds its networks and ``build(cfg, env_info) -> Agent``, named by its
:class:`~acer_torchrl.settings.Algorithm` (``settings/<name>.py``, in the torch-free registry
:data:`acer_torchrl.settings.REGISTRY`).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from acer_torchrl.validation import ConfigError


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

    ``build_reads`` are the fields ``build`` reads itself (:attr:`~acer_torchrl.settings.Algorithm.build_reads`);
    a field of ``section`` that is neither a loss argument nor one of them raises :class:`ConfigError`, so that no
    setting is dropped."""
    unread = unread_fields(section, loss_cls, build_reads)
    if unread:
        raise ConfigError(
            f"{type(section).__name__} field(s) {', '.join(unread)} reach nothing: {loss_cls.__name__} takes no "
            "argument of that name and build does not read them"
        )
    params = inspect.signature(loss_cls.__init__).parameters
    options = {f.name: getattr(section, f.name) for f in dataclasses.fields(section) if f.name in params}
    return {**options, **given}
