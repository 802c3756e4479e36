"""The learner's Adam step (``acer_torchrl.optim.AdamStep``) against ``torch.optim.Adam.step``."""

import copy

import pytest
import torch
from torch import nn

from acer_torchrl.optim import AdamStep


def twins(**options):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    twin = copy.deepcopy(net)
    return (net, twin), [torch.optim.Adam(m.parameters(), **options) for m in (net, twin)]


def train(nets, optimizers, step, updates, first=0):
    for i in range(first, first + updates):
        x = torch.randn(16, 5, generator=torch.Generator().manual_seed(i))
        for net, optimizer in zip(nets, optimizers):
            for group in optimizer.param_groups:
                group["lr"] = 1e-2 / (1 + i)  # the trainer sets it before every step (schedule x annealing)
            net.zero_grad(set_to_none=True)
            net(x).square().mean().backward()
        step()
        optimizers[1].step()


@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_adam_step_is_the_optimizers_step_to_the_bit(weight_decay):
    """Parameters and optimiser state equal bit for bit over steps with a changing learning rate, also after the
    optimiser's state was loaded from a checkpoint (new state tensors)."""
    nets, optimizers = twins(lr=1e-2, weight_decay=weight_decay, fused=True)
    step = AdamStep(optimizers[0])
    assert step.direct
    train(nets, optimizers, step, 4)
    optimizers[0].load_state_dict(copy.deepcopy(optimizers[1].state_dict()))
    train(nets, optimizers, step, 4, first=4)
    for a, b in zip(*(net.parameters() for net in nets)):
        assert torch.equal(a, b)
    ours, theirs = (opt.state_dict()["state"] for opt in optimizers)
    for index, state in ours.items():
        for key, value in state.items():
            assert torch.equal(value, theirs[index][key]), (index, key)
    assert int(ours[0]["step"]) == 8


@pytest.mark.parametrize("missing", ["_fused_adam_", "_foreach_add_"])
def test_a_torch_without_the_fused_kernel_takes_the_optimizers_own_step(monkeypatch, missing):
    """``AdamStep`` calls private torch functions (``acer_torchrl/_torchrl_compat.py``, T1); without either it takes
    ``optimizer.step()``, with the same bits."""
    nets, optimizers = twins(lr=1e-2, fused=True)
    monkeypatch.delattr(torch, missing)
    step = AdamStep(optimizers[0])
    monkeypatch.undo()  # torch.optim's own fused step calls them too
    assert not step.direct
    train(nets, optimizers, step, 3)
    for a, b in zip(*(net.parameters() for net in nets)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("options", [{"fused": False}, {"fused": True, "amsgrad": True},
                                     {"fused": True, "maximize": True}])
def test_other_adam_settings_take_the_optimizers_own_step(options):
    nets, optimizers = twins(lr=1e-2, **options)
    step = AdamStep(optimizers[0])
    assert not step.direct
    train(nets, optimizers, step, 3)
    for a, b in zip(*(net.parameters() for net in nets)):
        assert torch.equal(a, b)
