"""The package's modules form one-way layers: every import of a package module (at module level or inside a
function) goes to a module of its own layer or of a lower one, and no modules import each other in a circle.

The layers, bottom to top (``docs/layout.md`` says the same):

0. foundations, importing nothing of the layers above: ``validation`` (ranges, ``ConfigError``), ``objectives.names``
   (the entry and option names every layer shares; no torch), ``commands``, ``processes``, ``metrics``,
   ``health``, ``atari``, ``_torchrl_compat``, ``provenance``;
1. ``settings``: each algorithm's keys, presets and the torch-free registry (an algorithm's ``build`` named by
   its dotted path), the ``env.*`` keys;
2. what the config checks and what a run stores: ``envs``, ``rundir``, ``checkpoint``, ``frame_store``,
   ``priority_tree`` (a prioritized replay's draw), ``replay`` (which offers the stored estimates their view of it,
   ``EpisodeStore``, and knows no loss), ``optim``;
3. ``config`` (and ``config_reference``, the document made from it);
4. ``objectives``: the losses and their maths (torch, tensordict, torchrl and ``objectives`` only:
   tests/test_plain_torchrl_loop.py);
5. the pieces of a run: ``modules`` (networks, acting policy), ``collectors``, ``evaluation``;
6. what an agent holds: ``agent``, ``estimates`` (V-RACER's per-step estimates over the replay);
7. ``algorithms``: each algorithm's networks and ``build``;
8. ``trainer``;
9. ``cli``;
10. what runs the command line's runs: ``cluster``, ``rollout``;
11. ``shared_replay``: the sweeps of agents over one replay.

Imports under ``if TYPE_CHECKING:`` are type hints, never run: they are left out (``settings`` names ``Config``
in its ``validate(cfg)`` hints so)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "acer_torchrl"
LAYERS = {
    "validation": 0, "objectives.names": 0, "commands": 0, "processes": 0, "metrics": 0, "health": 0, "atari": 0,
    "_torchrl_compat": 0, "provenance": 0,
    "settings": 1,
    "envs": 2, "rundir": 2, "checkpoint": 2, "frame_store": 2, "priority_tree": 2, "replay": 2,
    "optim": 2,
    "config": 3, "config_reference": 3,
    "objectives": 4,
    "modules": 5, "collectors": 5, "evaluation": 5,
    "agent": 6, "estimates": 6,
    "algorithms": 7,
    "trainer": 8,
    "cli": 9,
    "cluster": 10, "rollout": 10,
    "shared_replay": 11,
}


def module_name(path: Path) -> str:
    """``acer_torchrl/objectives/acer.py`` -> ``objectives.acer`` (a package's ``__init__.py``: the package)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if p != PACKAGE / "__init__.py"}


def layer(module: str) -> int:
    """The layer of ``module``: that of the longest entry of :data:`LAYERS` that is it or a package above it."""
    entries = [name for name in LAYERS if module == name or module.startswith(name + ".")]
    assert entries, f"acer_torchrl.{module} has no layer: add it to LAYERS (and docs/layout.md)"
    return LAYERS[max(entries, key=len)]


def run_time_nodes(tree: ast.AST):
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            yield from (n for child in node.orelse for n in (child, *run_time_nodes(child)))
            continue
        yield node
        yield from run_time_nodes(node)


def imported_modules(path: Path) -> set[str]:
    """The package modules ``path`` imports (``from acer_torchrl import cli``: ``cli``), as :func:`module_name`s."""
    found = set()
    for node in run_time_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            if name.startswith("acer_torchrl."):
                module = name.removeprefix("acer_torchrl.")
                found.add(module if module in MODULES else module.rpartition(".")[0] or module)
    return {m for m in found if m in MODULES}


IMPORTS = {module: imported_modules(path) for module, path in MODULES.items()}


def test_every_import_goes_to_the_same_layer_or_down():
    upward = [f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
              for m, deps in IMPORTS.items() for d in sorted(deps) if layer(d) > layer(m)]
    assert upward == []


def test_no_modules_import_each_other_in_a_circle():
    circles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(IMPORTS[module]):
            if state.get(dep) == 1:
                circles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = 2

    for module in MODULES:
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_the_settings_import_only_validation_and_the_names():
    """``--help`` lists the keys at once: the settings and the registry import no torch (nor what does)."""
    allowed = {"validation", "objectives.names"}
    for module, deps in IMPORTS.items():
        if layer(module) == LAYERS["settings"]:
            assert {d for d in deps if not d.startswith("settings")} <= allowed, module


def third_party_imports(path: Path) -> set[str]:
    """The top-level names of what ``path`` imports at run time from outside the standard library and the package
    (``from tensordict.nn import X``: ``tensordict``)."""
    found = set()
    for node in run_time_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"__future__", "acer_torchrl"}


def test_the_losses_and_their_maths_import_only_torch_tensordict_torchrl_and_objectives():
    """Issue 58: a loss and ``functional`` can be read and used with torch, tensordict and torchrl alone (NumPy
    only in type hints); of the package they import ``objectives`` and nothing else (``objectives.updaters``, the
    target and average networks' updaters, also reads TorchRL through ``_torchrl_compat``)."""
    losses = [m for m in MODULES if m.startswith("objectives.") and m != "objectives.updaters"]
    assert {"objectives.acer", "objectives.reactor", "objectives.vracer", "objectives.laser",
            "objectives.functional"} <= set(losses)
    outside = {m: sorted(third_party_imports(MODULES[m]) - {"torch", "tensordict", "torchrl"}) for m in losses}
    assert {m: names for m, names in outside.items() if names} == {}
    assert {m: sorted(d for d in IMPORTS[m] if not d.startswith("objectives")) for m in losses
            if any(not d.startswith("objectives") for d in IMPORTS[m])} == {}


def test_a_loss_importing_numpy_is_found(tmp_path):
    """The check above can fail: a module that imports NumPy at run time (not under ``if TYPE_CHECKING:``)."""
    module = tmp_path / "loss.py"
    module.write_text("from typing import TYPE_CHECKING\nimport torch\nif TYPE_CHECKING:\n    import pandas\n"
                      "def f():\n    import numpy as np\n")
    assert third_party_imports(module) == {"torch", "numpy"}
