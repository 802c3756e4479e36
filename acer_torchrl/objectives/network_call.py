"""How a loss calls its networks (:class:`NetworkCall`): a chain of them on TensorDicts, or, where every module of
the chain is a plain ``TensorDictModule``, on tensors (:class:`TensorCall`), the same modules on the same tensors
without the TensorDict dispatch around each."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from tensordict.utils import NestedKey


class TensorCall:
    """A chain of plain ``TensorDictModule`` objects (nested in ``TensorDictSequential`` or not) called on tensors:
    each module's ``nn.Module`` on the tensors of its ``in_keys``, its outputs kept under its ``out_keys``. The same
    computation (the same bits) as the TensorDict call, without its key look-ups and a new TensorDict for each
    module's outputs (speed-pieces.md: part of "the update path"). A functional loss's ``params.to_module(network)``
    applies as it does to the TensorDict call: the same ``nn.Module`` objects run."""

    def __init__(self, steps: list[tuple[torch.nn.Module, list[NestedKey], list[NestedKey]]]):
        self.steps = steps
        written: set[NestedKey] = set()
        self.in_keys: list[NestedKey] = []  # what the chain reads that no step of it writes
        for _, in_keys, out_keys in steps:
            self.in_keys += [k for k in in_keys if k not in written and k not in self.in_keys]
            written.update(out_keys)

    @classmethod
    def of(cls, *networks: TensorDictModuleBase) -> TensorCall | None:
        """The chain of ``networks`` on tensors, or None when a module of it is not a plain ``TensorDictModule``
        (an LSTM core, a probabilistic module, one with keyword inputs): that chain takes TensorDicts."""
        steps = []

        def flatten(module: TensorDictModuleBase) -> bool:
            if type(module) is TensorDictSequential and not module.partial_tolerant:
                return all(flatten(m) for m in module.module)
            # tensordict's private _kwargs: not None for a module built with a dict of in_keys (keyword inputs)
            if type(module) is TensorDictModule and getattr(module, "_kwargs", None) is None:
                steps.append((module.module, list(module.in_keys), list(module.out_keys)))
                return True
            return False

        return cls(steps) if all(flatten(n) for n in networks) else None

    def __call__(self, source: TensorDictBase | Mapping[NestedKey, torch.Tensor]) -> dict[NestedKey, torch.Tensor]:
        """Every module's outputs and the chain's inputs (read from ``source``), by key."""
        values = {k: source.get(k) for k in self.in_keys}
        for module, in_keys, out_keys in self.steps:
            out = module(*(values[k] for k in in_keys))
            values.update(zip(out_keys, out if isinstance(out, tuple) else (out,), strict=True))
        return values


class NetworkCall:
    """A network, or a chain of them called one after the other, on the entries of a TensorDict or of a dict of
    tensors; its outputs by key. On tensors through :class:`TensorCall` when the chain allows it (a dict of tensors
    back, inputs included), else as TensorDict calls on a new TensorDict of the networks' ``in_keys`` (with an LSTM
    core's ``("next", state)`` outputs), a dict input as a TensorDict of its first dimension."""

    def __init__(self, *networks: TensorDictModuleBase):
        self.networks = networks
        self.tensors = TensorCall.of(*networks)
        self.in_keys = list(dict.fromkeys(k for network in networks for k in network.in_keys))

    def __call__(self, inputs: TensorDictBase | Mapping[NestedKey, torch.Tensor]) -> Mapping:
        if self.tensors is not None:
            return self.tensors(inputs)
        if not isinstance(inputs, TensorDictBase):
            inputs = TensorDict(dict(inputs), batch_size=next(iter(inputs.values())).shape[:1])
        out = inputs.select(*self.in_keys, strict=False)
        for network in self.networks:
            out = network(out)
        return out
