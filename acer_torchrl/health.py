"""Divergence watch: flags a run whose loss, gradient norm or value estimates blow up, never stops it.

Two watches, each reporting the first place it finds (one warning line; ``summary.json``'s ``health`` gets the
update, its env steps, the statistic and its value there):

* **Each update** (:meth:`Health.observe`): the trainer hands it the statistics it already converted to floats
  (no extra device syncs): the ``loss_*`` terms, ``grad_norm`` (before clipping) and the loss's value estimates
  (:attr:`~acer_torchrl.objectives.common.ReplayLoss.value_keys`). Each has a running scale that follows it by at
  most ``GROWTH`` per update (up or down) and never drops below ``FLOOR``; the critic loss's scale never drops below
  that of a TD error of ``ERROR_SHARE`` of the largest return ``max|r| / (1 - gamma)`` either (a critic that has
  settled near zero error and then replays a failure it had forgotten has not blown up). A statistic that is
  non-finite, or over ``FACTOR`` times its scale for ``PATIENCE`` updates in a row, marks the run diverged. It sees
  a sudden blow-up; a runaway slower than ``GROWTH`` per update it follows without flagging.
* **Each metrics row** (:meth:`Health.observe_row`): the means of the updates since the last row, as
  ``metrics.csv`` records them, against absolute limits that no running scale can follow. A run is diverged when,
  for ``ROW_PATIENCE`` rows in a row, (a) a value estimate's ``|mean|`` is over ``BOUND_FACTOR`` times the largest
  discounted return the rewards allow, ``max|r| / (1 - gamma)`` (``max|r|`` learnt from every collected step:
  the row's ``reward_abs_max``; in V-RACER's scaled units where the row has a ``reward_scale``), (b) a discrete
  policy's entropy is under ``ENTROPY_SHARE`` of the uniform policy's ``log(n)``, or (c) the critic loss is over
  ``LOSS_FACTOR`` times its level at the start of learning (the largest of its first ``START_ROWS`` rows, and at
  least ``max|r|^2``). Replaying a run's ``metrics.csv`` through it gives the decision the run made.

A greedy evaluation whose mean return is not finite (a game's reward was NaN or infinite) sets the status to
``evaluation_not_finite`` unless the run diverged (:meth:`Health.observe_evaluation`; one warning line): the final
score over it is not a number, and the run goes on.

A noisy run, whose spikes last a few updates or stay within these limits, stays ``ok``. A critic loss that grows
slowly past ``NOTE_FACTOR`` times its start level without reaching the diverged limit is noted (one line, and
``health``'s ``critic_loss_growth``: its largest factor and where): ACER CartPole's critic grew ~300x over 300k steps
on two seeds while every evaluation stayed at 500 (``benchmarks/results/cartpole-stability.md``), a growth that
came before a fall on another seed.

Two failures that no loss shows are noted the same way (one line each, the first time a metrics row's statistic
stays past its limit for ``ROW_PATIENCE`` rows; the run stays ``ok``), from statistics each row records:

* ``dead_unit_share``: the largest share of a ReLU layer's units (a conv layer's channels) of the acting policy's
  network that were off on every state of the row's last batch of updates (:class:`ReLUActivity`), noted from
  ``DEAD_SHARE`` on (``health.dead_units``). Such a network outputs nearly the same policy in every state: ACER's
  Pong run of 2.63M steps ended with conv1 31/32 and conv2 64/64 off (2/32 and 0/64 at initialisation), greedy -21
  throughout, health ``ok`` (``benchmarks/results/gpu.md``, 2026-11-28).
* ``mean_outside_bounds``: the share of a Gaussian policy's mean entries, as it acted in the row's batch, outside
  the action bounds, noted from ``OUTSIDE_SHARE`` on (``health.mean_outside_bounds``). The env clips actions
  to the bounds, so out there every mean plays the same and only the critic's extrapolation moves it: ACER's
  HalfCheetah (``mujoco`` preset, seed 0, no ``acer.bound_mean``) fell from 3 256 to -665 with 95 % of its mean's
  entries outside (``benchmarks/results/learning.md``, sixteenth session).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator

import torch
from torch import nn

FACTOR = 100.0  # how far above its running scale a statistic may go
PATIENCE = 5  # updates in a row it must stay there (a short spike is noise)
GROWTH = 0.01  # the running scale follows a statistic by at most 1 % per update
FLOOR = 1.0  # statistics below this magnitude never count as blown up
ERROR_SHARE = 0.05  # the critic loss's floor: 1/2 (ERROR_SHARE max|r| / (1 - gamma))^2, a TD error of 5 % of the bound

BOUND_FACTOR = 2.0  # a value estimate may reach twice the largest discounted return max|r| / (1 - gamma)
ENTROPY_SHARE = 0.01  # a discrete policy under 1 % of the uniform policy's entropy log(n) has collapsed
LOSS_FACTOR = 1000.0  # the critic loss may grow three orders of magnitude over its level at the start of learning
NOTE_FACTOR = 100.0  # a critic loss this far over that level is noted in the summary (not a divergence)
START_ROWS = 3  # that level: the largest critic loss of the first rows with updates
ROW_PATIENCE = 2  # metrics rows in a row a statistic must stay past its limit
DEAD_SHARE = 0.9  # a ReLU layer with this share of its units off on every state of a row's updates is noted
OUTSIDE_SHARE = 0.5  # a Gaussian mean with this share of its entries outside the action bounds is noted


class Health:
    """The divergence watch of one run; :meth:`state` / :meth:`load_state` carry it across a resume.

    Args:
        value_keys: the update's entries that are value estimates.
        gamma: the run's discount (the value bound ``max|r| / (1 - gamma)``; none with ``gamma = 1``).
        num_actions: a discrete policy's number of actions (its entropy is watched); None for continuous actions.
    """

    def __init__(self, value_keys: tuple[str, ...] = (), gamma: float = 1.0, num_actions: int | None = None):
        self.value_keys = tuple(value_keys)
        self.gamma = gamma
        self.num_actions = num_actions
        self.scale: dict[str, float] = {}
        self.streak: dict[str, tuple[int, int, float, int]] = {}  # key -> (first update, its env steps, value, length)
        self.row_streak: dict[str, tuple[int, int, float, int]] = {}  # the same, counted in metrics rows
        self.reward_max = 0.0  # the largest |reward| of the steps collected so far
        self.critic_start: list[float] = []  # the critic loss of the first START_ROWS rows with updates
        self.diverged: dict | None = None  # the first update where it went wrong
        self.critic_growth: dict | None = None  # the critic loss's largest factor over its start, once >= NOTE_FACTOR
        self.liveness: dict[str, dict] = {}  # dead_units / mean_outside_bounds: where each was first noted
        self.evaluation_not_finite: dict | None = None  # the first greedy evaluation whose mean return is not a number

    def watched(self, stats: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in stats.items() if k.startswith("loss_") or k == "grad_norm" or k in self.value_keys}

    def see_rewards(self, largest: float) -> None:
        """The largest ``|reward|`` of a collected batch (the value bound is learnt from the data seen)."""
        self.reward_max = max(self.reward_max, largest)

    def observe(self, stats: dict[str, float], update: int, env_steps: int) -> str | None:
        """Record the statistics of update number ``update`` (1 for the first), taken at ``env_steps``;
        returns a warning line the first time the run is found diverged (later updates are not watched)."""
        if self.diverged is not None:
            return None
        for key, value in self.watched(stats).items():
            size = abs(value)
            if not math.isfinite(size):
                return self._flag(key, value, update, env_steps, "is not finite")
            floor = self.floor(key)
            scale = max(self.scale.setdefault(key, size), floor)
            first = persisting(self.streak, key, size > FACTOR * scale, (update, env_steps, value), PATIENCE)
            if first is not None:
                return self._flag(key, first[2], first[0], first[1],
                                  f"stayed over {FACTOR:g}x its running scale {scale:.3g} for {PATIENCE} updates")
            self.scale[key] = max(floor, scale * (1 - GROWTH), min(size, scale * (1 + GROWTH)))
        return None

    def floor(self, key: str) -> float:
        """The lowest running scale of ``key``: ``FLOOR``, for the critic loss at least half the square of a TD
        error of ``ERROR_SHARE`` of the largest return the rewards seen so far allow (none with ``gamma = 1``)."""
        if key != "loss_critic" or self.gamma >= 1.0:
            return FLOOR
        return max(FLOOR, 0.5 * (ERROR_SHARE * self.reward_max / (1.0 - self.gamma)) ** 2)

    def observe_row(self, row: dict[str, float], update: int, env_steps: int, dead_layer: str | None = None) -> str | None:
        """Check a metrics row (the means of the updates since the last row, ``reward_abs_max``, ``reward_scale``
        where the loss scales rewards, the liveness statistics) taken after update ``update`` at ``env_steps``;
        returns a warning line the first time the run is found diverged, else its notes (one line each), if any.
        ``dead_layer`` names the layer behind the row's ``dead_unit_share`` (``"name: off/units"``). Rows without
        updates (before learning starts) are skipped."""
        if self.diverged is not None or "loss_critic" not in row:
            return None
        if len(self.critic_start) < START_ROWS:
            self.critic_start.append(abs(row["loss_critic"]))
        for key, value, limit, why in self.row_limits(row):
            past = value < limit if key == "entropy" else abs(value) > limit
            first = persisting(self.row_streak, key, past, (update, env_steps, value), ROW_PATIENCE)
            if first is not None:
                return self._flag(key, first[2], first[0], first[1], f"{why} for {ROW_PATIENCE} metrics rows")
        notes = [self._note_critic_growth(row, update, env_steps), *self._note_liveness(row, update, env_steps, dead_layer)]
        return "\n".join(n for n in notes if n) or None

    def _note_liveness(self, row: dict[str, float], update: int, env_steps: int, dead_layer: str | None) -> list[str]:
        """The notes of a dead network and of a mean outside the action bounds, each the first time its statistic
        stays at or past its limit for ``ROW_PATIENCE`` rows (kept in :attr:`liveness` from where that began)."""
        notes = []
        for key, entry, limit in (("dead_unit_share", "dead_units", DEAD_SHARE),
                                  ("mean_outside_bounds", "mean_outside_bounds", OUTSIDE_SHARE)):
            if key not in row or entry in self.liveness:
                continue
            here = (update, env_steps, row[key])
            first = persisting(self.row_streak, key, row[key] >= limit, here, ROW_PATIENCE)
            if first is None:
                continue
            self.liveness[entry] = {"share": round(first[2], 3), "update": first[0], "env_steps": first[1]}
            if key == "dead_unit_share":
                self.liveness[entry]["layer"] = dead_layer
                notes.append(f"note: {first[2]:.0%} of a ReLU layer's units ({dead_layer or 'its largest share'}) were "
                             f"off on every state of the updates from update {first[0]} ({first[1]} env steps) for "
                             f"{ROW_PATIENCE} metrics rows: a dead network outputs nearly the same policy in every "
                             "state; the run goes on: watch its evaluations (summary.json: health.dead_units)")
            else:
                notes.append(f"note: {first[2]:.0%} of the policy mean's entries were outside the action bounds from "
                             f"update {first[0]} ({first[1]} env steps) for {ROW_PATIENCE} metrics rows: the env "
                             "clips actions there, and only the critic's extrapolation moves the mean (ACER: "
                             "acer.bound_mean=true keeps it inside); the run goes on (summary.json: "
                             "health.mean_outside_bounds)")
        return notes

    def _note_critic_growth(self, row: dict[str, float], update: int, env_steps: int) -> str | None:
        """Keeps the critic loss's largest factor over its start level once it reaches ``NOTE_FACTOR``; returns a note
        line the first time."""
        start = self.critic_level(row)
        factor = abs(row["loss_critic"]) / start if start > 0 else 0.0
        if factor < NOTE_FACTOR or (self.critic_growth is not None and factor <= self.critic_growth["factor"]):
            return None
        first = self.critic_growth is None
        self.critic_growth = {"factor": round(factor, 1), "update": update, "env_steps": env_steps}
        if not first:
            return None
        return (f"note: loss_critic={row['loss_critic']:.3g} at update {update} ({env_steps} env steps) is {factor:.0f}x "
                f"its level at the start of learning {start:.3g} (diverged: {LOSS_FACTOR:g}x); the run goes on: watch "
                "its evaluations (summary.json: health.critic_loss_growth)")

    def row_reward(self, row: dict[str, float]) -> float:
        """``max|r|`` as the row's values see it: over V-RACER's ``sigma_r`` (its values are in units of r / sigma_r)."""
        scale = row.get("reward_scale", 1.0)
        return row.get("reward_abs_max", self.reward_max) / scale if scale > 0 else 0.0

    def critic_level(self, row: dict[str, float]) -> float:
        """The critic loss's level at the start of learning: the largest of its first rows, at least ``max|r|^2``."""
        return max(max(self.critic_start), self.row_reward(row) ** 2)

    def row_limits(self, row: dict[str, float]) -> list[tuple[str, float, float, str]]:
        """``(statistic, its value, its limit, why)`` of the row's checked statistics (entropy: a lower limit)."""
        reward = self.row_reward(row)
        limits = []
        if self.gamma < 1.0 and reward > 0.0:
            bound = reward / (1.0 - self.gamma)
            why = f"stayed over {BOUND_FACTOR:g}x the largest return max|r|/(1-gamma) = {bound:.3g}"
            limits += [(k, row[k], BOUND_FACTOR * bound, why) for k in self.value_keys if k in row]
        if self.num_actions is not None and "entropy" in row:
            uniform = math.log(self.num_actions)
            why = f"stayed under {ENTROPY_SHARE:g}x the uniform policy's entropy log({self.num_actions})={uniform:.3g}"
            limits.append(("entropy", row["entropy"], ENTROPY_SHARE * uniform, why))
        start = self.critic_level(row)
        why = f"stayed over {LOSS_FACTOR:g}x its level at the start of learning {start:.3g}"
        limits.append(("loss_critic", row["loss_critic"], LOSS_FACTOR * start, why))
        return limits

    def observe_evaluation(self, mean: float, env_steps: int) -> str | None:
        """A greedy evaluation's mean return at ``env_steps``; returns a warning line the first time one is not finite
        (a game's reward was NaN or infinite: the final score over it is not a number either)."""
        if math.isfinite(mean) or self.evaluation_not_finite is not None:
            return None
        self.evaluation_not_finite = {"env_steps": env_steps, "value": str(mean)}
        return (f"warning: the greedy evaluation at {env_steps} env steps has a mean return of {mean} (a game's reward "
                "was not finite); a final score over it is not a number either (summary.json: health.status "
                "evaluation_not_finite); the run goes on")

    def _flag(self, key: str, value: float, update: int, env_steps: int, why: str) -> str:
        shown = value if math.isfinite(value) else str(value)  # summary.json stays standard JSON
        self.diverged = {"update": update, "env_steps": env_steps, "statistic": key, "value": shown}
        return (
            f"warning: training diverged at update {update} ({env_steps} env steps): {key}={value:.3g} {why}; "
            "the run goes on, but its results are suspect: lower optim.lr (or the loss's coefficients)"
        )

    def summary(self) -> dict:
        """The ``health`` entry of ``summary.json``: ``{"status": "ok"}``, or ``"diverged"`` and where, or
        ``"evaluation_not_finite"`` and the first such evaluation (``evaluation``); with ``critic_loss_growth`` once the
        critic loss reached ``NOTE_FACTOR`` times its start level, and ``dead_units`` / ``mean_outside_bounds`` once
        noted."""
        if self.diverged is not None:
            status = {"status": "diverged", **self.diverged}
        elif self.evaluation_not_finite is not None:
            status = {"status": "evaluation_not_finite", "evaluation": dict(self.evaluation_not_finite)}
        else:
            status = {"status": "ok"}
        if self.critic_growth is not None:
            status["critic_loss_growth"] = dict(self.critic_growth)
        return {**status, **{k: dict(v) for k, v in self.liveness.items()}}

    def state(self) -> dict:
        return {"scale": dict(self.scale), "diverged": self.diverged, "critic_growth": self.critic_growth,
                "reward_max": self.reward_max, "liveness": {k: dict(v) for k, v in self.liveness.items()},
                "critic_start": list(self.critic_start), "row_streak": {k: list(v) for k, v in self.row_streak.items()},
                "streak": {k: list(v) for k, v in self.streak.items()},
                "evaluation_not_finite": self.evaluation_not_finite}

    def load_state(self, state: dict) -> None:
        self.scale = dict(state.get("scale", {}))
        self.diverged = state.get("diverged")
        self.critic_growth = state.get("critic_growth")
        self.liveness = {k: dict(v) for k, v in state.get("liveness", {}).items()}
        self.reward_max = state.get("reward_max", 0.0)
        self.critic_start = list(state.get("critic_start", []))
        self.row_streak = {k: tuple(v) for k, v in state.get("row_streak", {}).items()}
        self.streak = {k: tuple(v) for k, v in state.get("streak", {}).items()}
        self.evaluation_not_finite = state.get("evaluation_not_finite")


def persisting(streaks: dict, key: str, past: bool, here: tuple[int, int, float], patience: int) -> tuple | None:
    """Count ``key``'s run of observations past its limit in ``streaks`` (``past``: this one is; ``here``: its
    update, env steps and value); returns where the run began, ``(update, env steps, value)``, once it is
    ``patience`` long, else None."""
    if not past:
        streaks.pop(key, None)
        return None
    *first, length = streaks.get(key, (*here, 0))
    if length + 1 >= patience:
        return tuple(first)
    streaks[key] = (*first, length + 1)
    return None


class ReLUActivity:
    """Which units of a network's ReLU layers (a conv layer's channels) were on for some state, over the forward
    passes made inside :meth:`watching`: forward hooks on the network's ``nn.ReLU`` modules, no pass of their own.
    The learner's updates call the acting policy's modules (shared with the loss), so the states are those of the
    replayed batches."""

    def __init__(self, network: nn.Module):
        self.layers = [(name, module) for name, module in network.named_modules() if isinstance(module, nn.ReLU)]

    @contextlib.contextmanager
    def watching(self) -> Iterator[dict[str, torch.Tensor]]:
        """Yields ``{layer name: [units] bool tensor, a unit on for some state}``, filled as the block's passes run."""
        on: dict[str, torch.Tensor] = {}

        def record(name: str, _module, _inputs, out: torch.Tensor) -> None:
            seen = (out > 0).flatten(-2).any(-1) if out.ndim >= 4 else out > 0  # [..., C, H, W]: a channel anywhere
            seen = seen.reshape(-1, seen.shape[-1]).any(0)
            on[name] = on[name] | seen if name in on else seen

        hooks = [module.register_forward_hook(functools.partial(record, name)) for name, module in self.layers]
        try:
            yield on
        finally:
            for hook in hooks:
                hook.remove()


def most_dead_layer(on: dict[str, torch.Tensor]) -> tuple[str, int, int] | None:
    """Of :meth:`ReLUActivity.watching`'s record: the layer with the largest share of units never on, as
    ``(name, units off, units)``; None when no ReLU ran."""
    counts = [(name, int((~seen).sum()), seen.numel()) for name, seen in on.items()]
    return max(counts, key=lambda c: c[1] / c[2], default=None)
