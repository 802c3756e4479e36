"""Declared ranges of config values, checked with one-line errors.

Each config dataclass states, right above its fields, which values they accept::

    @allowed(lr="(0, inf)", weight_decay="[0, inf)", activation=("relu", "tanh"))
    @dataclass
    class OptimConfig: ...

An interval (``"[1, inf)"``, ``"(0, 1]"``; ``inf`` may be a closed end) bounds a number, a tuple lists the
accepted strings; a list field has each of its entries checked, and ``None`` always passes (an optional
field's "unset"). :func:`check_allowed` checks an instance and raises :class:`ConfigError` naming the key,
the range and a valid value (the field's default). Checks that involve several fields stay in the
dataclass's ``validate`` method.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

INT64 = (-(2**63), 2**63 - 1)
# the largest layer width accepted: a mistyped width (e.g. 1e6) would otherwise try to allocate terabytes
MAX_WIDTH = "[1, 8192]"


class ConfigError(ValueError):
    """A user mistake in the configuration; the CLI prints its message as one line."""


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    low_closed: bool
    high_closed: bool

    @classmethod
    def parse(cls, text: str) -> Interval:
        text = text.strip()
        if text[0] not in "[(" or text[-1] not in "])" or text.count(",") != 1:
            raise TypeError(f"an interval looks like '[0, 1)', got {text!r}")
        low, high = (float(end) for end in text[1:-1].split(","))
        return cls(low, high, text[0] == "[", text[-1] == "]")

    def __contains__(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            return False
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return above and below

    def __str__(self) -> str:
        low, high = _number(self.low), _number(self.high)
        if math.isinf(self.high):
            return f"{'>=' if self.low_closed else '>'} {low}{' or inf' if self.high_closed else ''}"
        return f"in {'[' if self.low_closed else '('}{low}, {high}{']' if self.high_closed else ')'}"


@dataclass(frozen=True)
class Choices:
    names: tuple[str, ...]

    def __contains__(self, value: Any) -> bool:
        return value in self.names

    def __str__(self) -> str:
        return f"one of {', '.join(self.names)}"


def _number(x: float) -> str:
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else str(x)


def allowed(**specs: str | tuple[str, ...]) -> Callable[[type], type]:
    """Class decorator (above ``@dataclass``): ``field=interval`` or ``field=(choice, ...)`` per field."""

    def decorate(cls: type) -> type:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(specs) - names
        if unknown:
            raise TypeError(f"@allowed on {cls.__name__}: no field {', '.join(sorted(unknown))}")
        rules = {name: Interval.parse(s) if isinstance(s, str) else Choices(tuple(s)) for name, s in specs.items()}
        cls.__allowed__ = {**getattr(cls, "__allowed__", {}), **rules}
        return cls

    return decorate


def check_allowed(obj: Any, prefix: str = "", preset: tuple[str, dict[str, Any]] | None = None) -> None:
    """Raise :class:`ConfigError` for the first field of ``obj`` outside its declared range. The valid value it
    suggests is the preset's (``preset``: its name and its ``key: value`` dict) where the preset sets the key,
    else the field's default."""
    for name, rule in getattr(type(obj), "__allowed__", {}).items():
        value = getattr(obj, name)
        entries = value if isinstance(value, list) else [value]
        if all(v is None or v in rule for v in entries):
            continue
        key, default = prefix + name, _default(obj, name)
        what = f"{key} entries" if isinstance(value, list) else key
        unset = " or none" if default is None else ""
        infinite = any(isinstance(v, float) and math.isinf(v) for v in entries) and isinstance(rule, Interval)
        if preset is not None and key in preset[1]:
            example = f"e.g. {key}={_show(preset[1][key])} (preset={preset[0]}'s value)"
        else:
            example = f"e.g. {key}={_show(default)} (the default)"
        raise ConfigError(f"{what} must be {'finite and ' if infinite else ''}{rule}{unset}, got {_show(value)}; {example}")


def _default(obj: Any, name: str) -> Any:
    spec = next(f for f in dataclasses.fields(obj) if f.name == name)
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default


def _show(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(_show(v) for v in value) or "(empty)"
    if value is None:
        return "none"
    return str(value)
