"""The private torch functions' public fallbacks (``acer_torchrl/_torchrl_compat.py``, T1) and the target
updaters' pairs, read from the loss's public attributes."""

import pytest
import torch

from acer_torchrl import _torchrl_compat as compat
from acer_torchrl.config import load_config
from acer_torchrl.envs import env_info
from acer_torchrl.objectives.updaters import parameter_pairs
from acer_torchrl.settings import get_algorithm


def tensors(seed: int) -> list[torch.Tensor]:
    """Gradient-like tensors of a small network's shapes."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for shape in [(64, 5), (64,), (3, 64), (3,), (1,)]]


def lerped() -> list[torch.Tensor]:
    out = tensors(0)
    compat.foreach_lerp_(out, tensors(1), 0.01)
    return out


def copied() -> list[torch.Tensor]:
    out = tensors(0)
    compat.foreach_copy_(out, tensors(1))
    return out


CALLS = {"_foreach_lerp_": lerped, "_foreach_copy_": copied}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_fallback_without_the_private_function_gives_the_same_bits(monkeypatch, name):
    fused = CALLS[name]()
    monkeypatch.delattr(torch, name)
    fallback = CALLS[name]()
    assert len(fused) == len(fallback)
    for a, b in zip(fused, fallback):
        assert torch.equal(a, b)


@pytest.mark.parametrize("algo, overrides", [
    ("acer", ["acer.target_update=0"]),  # the average policy network alone
    ("acer", ["acer.trust_region=false"]),  # the target network alone
    ("laser", ["laser.target_update=10"]),
    ("reactor", ["reactor.behaviour=learned", "network.lstm=true"]),
])
def test_updater_pairs_are_torchrls_own(tmp_path, algo, overrides):
    """The (source, target) pairs taken from the loss's ``<name>_params`` / ``target_<name>_params`` are the very
    tensors TorchRL's ``TargetNetUpdater`` pairs (its private ``_sources`` / ``_targets``, read here only to check),
    in the same order: the updates move the same numbers."""
    cfg = load_config(algo, [f"run_dir={tmp_path}", *overrides])
    agent = get_algorithm(algo).build(cfg, env_info(cfg.env))
    (updater,) = agent.updaters
    keys = [key if isinstance(key, tuple) else (key,) for key in updater._sources.keys(True, True)]
    theirs = [(updater._sources.get(key).data_ptr(), updater._targets.get(("target_" + key[0], *key[1:])).data_ptr())
              for key in keys]
    sources, targets = parameter_pairs(agent.loss)
    assert [(s.data_ptr(), t.data_ptr()) for s, t in zip(sources, targets)] == theirs and theirs
