"""How the acting policy calls its modules (:class:`TensorCall`: on tensors where every module allows it, the
TensorDict dispatch left out: :class:`~acer_torchrl.modules.ActingPolicy`), and how a loss calls its networks
(:class:`NetworkCall`: on TensorDicts)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from tensordict.utils import NestedKey


class TensorCall:
    """A network of plain ``TensorDictModule`` objects (in a ``TensorDictSequential``, nested or not) called on tensors:
    each module's ``nn.Module`` on the tensors of its ``in_keys``, its outputs kept under its ``out_keys``, the
    same computation as the TensorDict call without its dispatch (key look-ups, a TensorDict for every module's
    outputs: a large share of a 2x128 MLP's forward at batch 256 on one core, ``benchmarks/results/learner.md``).

    :meth:`of` returns None for any other network (an LSTM core, a probabilistic module, a module with keyword
    inputs): call that one with a TensorDict. A functional loss's ``params.to_module(network)`` applies as to the
    TensorDict call: the same ``nn.Module`` objects run.
    """

    def __init__(self, steps: list[tuple[torch.nn.Module, list[NestedKey], list[NestedKey]]]):
        self.steps = steps
        written: set[NestedKey] = set()
        self.in_keys: list[NestedKey] = []  # what the chain reads that no step of it writes
        for _, in_keys, out_keys in steps:
            self.in_keys += [k for k in in_keys if k not in written and k not in self.in_keys]
            written.update(out_keys)

    @classmethod
    def of(cls, *networks: torch.nn.Module) -> TensorCall | None:
        """The chain of ``networks``, called one after the other, or None when one of them is not plain."""
        steps = []

        def flatten(module) -> bool:
            if type(module) is TensorDictSequential and not module.partial_tolerant:
                return all(flatten(m) for m in module.module)
            # tensordict's private _kwargs: not None for a module built with a dict of in_keys (keyword inputs)
            if type(module) is TensorDictModule and getattr(module, "_kwargs", None) is None:
                steps.append((module.module, list(module.in_keys), list(module.out_keys)))
                return True
            return False

        return cls(steps) if all(flatten(n) for n in networks) else None

    def __call__(self, inputs: Mapping[NestedKey, torch.Tensor]) -> dict[NestedKey, torch.Tensor]:
        """The outputs of every module (and the inputs), by key."""
        values = dict(inputs)
        for module, in_keys, out_keys in self.steps:
            out = module(*(values[k] for k in in_keys))
            values.update(zip(out_keys, out if isinstance(out, tuple) else (out,), strict=True))
        return values

    def on(self, source: TensorDictBase | Mapping[NestedKey, torch.Tensor]) -> dict[NestedKey, torch.Tensor]:
        """The chain on the :attr:`in_keys` entries of ``source`` (a TensorDict or tensors by key)."""
        return self({k: source.get(k) for k in self.in_keys})


class NetworkCall:
    """A network, or a chain of them called one after the other, on a new TensorDict of the networks' ``in_keys``
    taken from a TensorDict or from a dict of tensors (that one as a TensorDict of its first dimension): the
    TensorDict of their outputs (with an LSTM core's ``("next", state)`` outputs)."""

    def __init__(self, *networks: TensorDictModuleBase):
        self.networks = networks
        self.in_keys = list(dict.fromkeys(k for network in networks for k in network.in_keys))

    def __call__(self, inputs: TensorDictBase | Mapping[NestedKey, torch.Tensor]) -> TensorDictBase:
        if not isinstance(inputs, TensorDictBase):
            inputs = TensorDict(dict(inputs), batch_size=next(iter(inputs.values())).shape[:1])
        out = inputs.select(*self.in_keys, strict=False)
        for network in self.networks:
            out = network(out)
        return out
