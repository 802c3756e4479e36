"""The four losses, imported lazily (``from acer_torchrl.objectives import ACERLoss``) so that importing one
does not import the others. A loss joins with one line in ``_EXPORTS``: exported name -> defining module."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ACERLoss": "acer_torchrl.objectives.acer",
    "ReactorLoss": "acer_torchrl.objectives.reactor",
    "VRACERLoss": "acer_torchrl.objectives.vracer",
    "LASERLoss": "acer_torchrl.objectives.laser",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
