"""Target and average networks of the losses, updated with one fused ``torch._foreach_*`` call a step.

TorchRL's ``SoftUpdate`` / ``HardUpdate`` find a loss's ``target_*_params`` and pair them with their sources
(kept here), all of them: these subclasses can take the pairs of some networks only (``networks``: ACER's average
policy network beside its target critic, each on its own schedule). They take the tensors out of the loss's public
``<name>_params`` and ``target_<name>_params`` once, at their first step (after the trainer moved the loss to its
device), and update them together (``_torchrl_compat.py``, T1: a public fallback where torch lacks the fused
call) where TorchRL walks both TensorDicts key by key at every step (what that buys, little:
``benchmarks/results/speed-pieces.md``).
"""

from __future__ import annotations

import torch
from torchrl.objectives import HardUpdate, LossModule, SoftUpdate

from acer_torchrl._torchrl_compat import foreach_copy_, foreach_lerp_


def parameter_pairs(
    loss: LossModule, networks: tuple[str, ...] | None = None, buffers: bool = False
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(sources, targets)``: the tensors of ``loss``'s ``<name>_params`` that have a target in its
    ``target_<name>_params`` (for the ``<name>`` in ``networks``; all when None), and those targets, in matching
    order. As TorchRL's ``TargetNetUpdater.init_`` pairs them: a source that requires a gradient (not a buffer;
    with ``buffers``, the buffers instead) and whose target is another tensor."""
    sources, targets = [], []
    for name, _ in loss.named_children():
        network = name[len("target_") : -len("_params")]
        if name.startswith("target_") and name.endswith("_params") and (networks is None or network in networks):
            target_params, params = getattr(loss, name), getattr(loss, name[len("target_"):])
            for key, source in params.items(True, True):
                target = target_params.get(key)
                if source.requires_grad != buffers and not target.is_set_to(source.data):
                    sources.append(source.data)
                    targets.append(target.data)
    return sources, targets


@torch.no_grad()
def copy_buffers_to_targets(loss: LossModule) -> None:
    """Copies the buffers of ``loss``'s networks into their average / target copies (the updaters below move
    trained parameters only): statistics set once, such as a fitted state standardisation, must be the same in both."""
    sources, targets = parameter_pairs(loss, buffers=True)
    if sources:
        foreach_copy_(targets, sources)


class _FusedPairs:
    """The (source, target) tensor lists of a TorchRL target updater's loss, in matching order, taken once: of
    the networks in ``networks`` (all the loss's target pairs when None, TorchRL's own pairing)."""

    networks: tuple[str, ...] | None = None

    def _pairs(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        pairs = self.__dict__.get("_pairs_val")
        if pairs is None:
            pairs = self.__dict__["_pairs_val"] = parameter_pairs(self.loss_module, self.networks)
        return pairs


class FusedSoftUpdate(_FusedPairs, SoftUpdate):
    """``theta_target <- eps theta_target + (1 - eps) theta`` for all parameters in one ``_foreach_lerp_``
    (ACER's average policy network, Wang et al. 2017 sec. 3.3, with ``eps = alpha``)."""

    @torch.no_grad()
    def step(self) -> None:
        sources, targets = self._pairs()
        foreach_lerp_(targets, sources, 1.0 - self.eps)


class FusedHardUpdate(_FusedPairs, HardUpdate):
    """TorchRL's ``HardUpdate`` schedule (a copy on every ``(value_network_update_interval + 1)``-th step,
    ``counter`` kept for checkpoints), the copy in one ``_foreach_copy_``."""

    @torch.no_grad()
    def step(self) -> None:
        if self.counter == self.value_network_update_interval:
            sources, targets = self._pairs()
            foreach_copy_(targets, sources)
            self.counter = 0
        else:
            self.counter += 1


def target_updater(loss, period: int, networks: tuple[str, ...] | None = None) -> FusedHardUpdate:
    """Copies ``loss``'s current parameters into its target ones every ``period`` learner steps (Reactor's
    target network, sec. 3.4; LASER's and ACER's optional ones), those of ``networks`` only when given. TorchRL's
    ``HardUpdate`` copies on the ``(interval + 1)``-th call of ``step()``, hence ``period - 1``."""
    updater = FusedHardUpdate(loss, value_network_update_interval=period - 1)
    updater.networks = networks
    return updater


def average_updater(loss, alpha: float, networks: tuple[str, ...] | None = None) -> FusedSoftUpdate:
    """``theta_a <- alpha theta_a + (1 - alpha) theta`` after every learner step (ACER's average policy network,
    sec. 3.3), for the target parameters of ``networks`` only when given."""
    updater = FusedSoftUpdate(loss, eps=alpha)
    updater.networks = networks
    return updater
