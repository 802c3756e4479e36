"""How a loss calls its networks (:class:`NetworkCall`: a chain of them on TensorDicts)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey


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
