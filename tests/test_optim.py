"""The learner's gradient clipping and Adam step (``acer_torchrl.optim.DirectStep``) against torch's
``clip_grad_norm_`` and ``torch.optim.Adam.step``: the same bits; RMSProp against its update written out."""

import copy

import pytest
import torch
from torch import nn

from acer_torchrl.optim import DirectStep


def twins(**options):
    """Two copies of one small network, each with its own Adam of ``options``."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    twin = copy.deepcopy(net)
    return (net, twin), [torch.optim.Adam(m.parameters(), **options) for m in (net, twin)]


def train(nets, optimizers, step: DirectStep, updates: int, max_norm: float, first: int = 0) -> None:
    """``updates`` steps of both networks on the same batches: the first through ``step``, the second through
    ``clip_grad_norm_`` and ``optimizer.step()``; the norms each returns equal to the bit."""
    for i in range(first, first + updates):
        x = torch.randn(16, 5, generator=torch.Generator().manual_seed(i))
        for net, optimizer in zip(nets, optimizers):
            for group in optimizer.param_groups:
                group["lr"] = 1e-2 / (1 + i)  # the trainer sets it before every step (schedule x annealing)
            net.zero_grad(set_to_none=True)
            (100 * net(x)).square().mean().backward()  # gradients large enough to be clipped at max_norm 1
        ours = step.clip(max_norm)
        theirs = torch.nn.utils.clip_grad_norm_(nets[1].parameters(), max_norm)
        assert torch.equal(ours, theirs)
        step.step()
        optimizers[1].step()


def assert_same_bits(nets, optimizers) -> None:
    for a, b in zip(*(net.parameters() for net in nets)):
        assert torch.equal(a, b)
    ours, theirs = (opt.state_dict()["state"] for opt in optimizers)
    for index, state in ours.items():
        for key, value in state.items():
            assert torch.equal(value, theirs[index][key]), (index, key)


@pytest.mark.parametrize("max_norm", [1.0, float("inf")])
@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_direct_step_is_torchs_clipping_and_step_to_the_bit(weight_decay, max_norm):
    """Parameters, optimiser state and the returned norms equal bit for bit over steps with a changing learning rate
    and clipping that bites (max_norm 1) or none (inf), also after the optimiser's state was loaded from a
    checkpoint (new state tensors)."""
    nets, optimizers = twins(lr=1e-2, weight_decay=weight_decay, fused=True)
    step = DirectStep(optimizers[0])
    assert step.direct
    train(nets, optimizers, step, 4, max_norm)
    optimizers[0].load_state_dict(copy.deepcopy(optimizers[1].state_dict()))
    train(nets, optimizers, step, 4, max_norm, first=4)
    assert_same_bits(nets, optimizers)
    assert int(optimizers[0].state_dict()["state"][0]["step"]) == 8


@pytest.mark.parametrize("missing", ["_fused_adam_", "_foreach_add_", "_foreach_norm", "_foreach_mul_"])
def test_a_torch_without_the_kernels_takes_its_own_calls(monkeypatch, missing):
    """``DirectStep`` calls private torch functions (``acer_torchrl/_torchrl_compat.py``, T2); without any of them it
    takes ``clip_grad_norm_`` and ``optimizer.step()``, with the same bits."""
    nets, optimizers = twins(lr=1e-2, fused=True)
    monkeypatch.delattr(torch, missing)
    step = DirectStep(optimizers[0])
    monkeypatch.undo()  # torch's own calls use them too
    assert not step.direct
    train(nets, optimizers, step, 3, 1.0)
    assert_same_bits(nets, optimizers)


@pytest.mark.parametrize("options", [{"fused": False}, {"fused": True, "amsgrad": True},
                                     {"fused": True, "maximize": True}])
def test_other_adam_settings_take_torchs_own_step(options):
    nets, optimizers = twins(lr=1e-2, **options)
    step = DirectStep(optimizers[0])
    assert not step.direct
    train(nets, optimizers, step, 3, 1.0)
    assert_same_bits(nets, optimizers)


def test_rmsprop_is_a3cs_update_written_out():
    """``optim.name=rmsprop``: per parameter ``g <- alpha g + (1 - alpha) grad^2``,
    ``theta <- theta - lr grad / (sqrt(g) + eps)`` (Mnih et al. 2016, App. "Optimization", unshared; eps outside the
    root as torch has it), checked over steps against that loop; the learner's clipping still applies first."""
    from acer_torchrl.config import OptimConfig
    from acer_torchrl.optim import make_optimiser

    cfg = OptimConfig(name="rmsprop", lr=1e-2, eps=1e-3, alpha=0.9)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = make_optimiser(list(net.parameters()), cfg)
    step = DirectStep(optimizer)
    assert type(optimizer) is torch.optim.RMSprop and not step.direct
    theta = [p.detach().clone() for p in net.parameters()]
    square = [torch.zeros_like(p) for p in theta]
    for i in range(4):
        x = torch.randn(16, 5, generator=torch.Generator().manual_seed(i))
        net.zero_grad(set_to_none=True)
        (100 * net(x)).square().mean().backward()
        step.clip(1.0)
        grads = [p.grad.clone() for p in net.parameters()]
        step.step()
        for k, grad in enumerate(grads):
            square[k] = cfg.alpha * square[k] + (1 - cfg.alpha) * grad**2
            theta[k] = theta[k] - cfg.lr * grad / (square[k].sqrt() + cfg.eps)
    for ours, written in zip(net.parameters(), theta):
        torch.testing.assert_close(ours, written, rtol=1e-5, atol=1e-7)


def test_a_trainer_takes_the_optimiser_its_config_names(tmp_path):
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer

    trainer = Trainer(load_config("acer", ["preset=cartpole", f"run_dir={tmp_path}", "optim.name=rmsprop",
                                           "optim.alpha=0.95", "optim.eps=1e-4"]))
    try:
        (group,) = trainer.optimizer.param_groups
        assert type(trainer.optimizer) is torch.optim.RMSprop and (group["alpha"], group["eps"]) == (0.95, 1e-4)
        assert group["momentum"] == 0 and not group["centered"]
    finally:
        trainer.close()
