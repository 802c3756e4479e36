"""Divergence watch: flags a run whose loss, gradient norm or value estimates blow up, never stops it.

After every update the trainer hands :meth:`Health.observe` the statistics it already converted to floats
(no extra device syncs): the ``loss_*`` terms, ``grad_norm`` (before clipping) and the loss's value
estimates (:attr:`~acer_torchrl.objectives.common.ReplayLoss.value_keys`). Each has a running scale that
follows it by at most ``GROWTH`` per update (up or down) and never drops below ``FLOOR``. A statistic that
is non-finite, or over ``FACTOR`` times its scale for ``PATIENCE`` updates in a row, marks the run
diverged: one warning line, and the first such update (with its env steps and the statistic) goes to
``summary.json`` as ``health``. A noisy run, whose spikes last a few updates or stay within ``FACTOR``,
stays ``ok``.
"""

from __future__ import annotations

import math

FACTOR = 100.0  # how far above its running scale a statistic may go
PATIENCE = 5  # updates in a row it must stay there (a short spike is noise)
GROWTH = 0.01  # the running scale follows a statistic by at most 1 % per update
FLOOR = 1.0  # statistics below this magnitude never count as blown up


class Health:
    """The divergence watch of one run; :meth:`state` / :meth:`load_state` carry it across a resume."""

    def __init__(self, value_keys: tuple[str, ...] = ()):
        self.value_keys = tuple(value_keys)
        self.scale: dict[str, float] = {}
        self.streak: dict[str, tuple[int, int, int]] = {}  # key -> (first update, its env steps, length)
        self.diverged: dict | None = None  # the first update where it went wrong

    def watched(self, stats: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in stats.items() if k.startswith("loss_") or k == "grad_norm" or k in self.value_keys}

    def observe(self, stats: dict[str, float], update: int, env_steps: int) -> str | None:
        """Record the statistics of update number ``update`` (1 for the first), taken at ``env_steps``;
        returns a warning line the first time the run is found diverged (later updates are not watched)."""
        if self.diverged is not None:
            return None
        for key, value in self.watched(stats).items():
            size = abs(value)
            if not math.isfinite(size):
                return self._flag(key, value, update, env_steps, "is not finite")
            scale = self.scale.setdefault(key, max(size, FLOOR))
            if size <= FACTOR * scale:
                self.streak.pop(key, None)
            else:
                first, first_steps, length = self.streak.get(key, (update, env_steps, 0))
                if length + 1 >= PATIENCE:
                    why = f"stayed over {FACTOR:g}x its running scale {scale:.3g}"
                    return self._flag(key, value, first, first_steps, why)
                self.streak[key] = (first, first_steps, length + 1)
            self.scale[key] = max(FLOOR, scale * (1 - GROWTH), min(size, scale * (1 + GROWTH)))
        return None

    def _flag(self, key: str, value: float, update: int, env_steps: int, why: str) -> str:
        shown = value if math.isfinite(value) else str(value)  # summary.json stays standard JSON
        self.diverged = {"update": update, "env_steps": env_steps, "statistic": key, "value": shown}
        return (
            f"warning: training diverged at update {update} ({env_steps} env steps): {key}={value:.3g} {why}; "
            "the run goes on, but its results are suspect: lower optim.lr (or the loss's coefficients)"
        )

    def summary(self) -> dict:
        """The ``health`` entry of ``summary.json``: ``{"status": "ok"}``, or ``"diverged"`` and where."""
        return {"status": "ok"} if self.diverged is None else {"status": "diverged", **self.diverged}

    def state(self) -> dict:
        return {"scale": dict(self.scale), "diverged": self.diverged}

    def load_state(self, state: dict) -> None:
        self.scale = dict(state.get("scale", {}))
        self.diverged = state.get("diverged")
