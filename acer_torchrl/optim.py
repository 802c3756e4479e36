"""The learner's Adam step: the fused kernel of ``torch.optim.Adam(fused=True)``, without the Python around it."""

from __future__ import annotations

import torch

from acer_torchrl._torchrl_compat import has_fused_adam


def adam_settings(optim) -> dict[str, float]:
    """The learner's Adam hyper-parameters that ``optim.*`` sets (an :class:`~acer_torchrl.config.OptimConfig`), as
    ``torch.optim.Adam`` takes them and keeps them in each parameter group: what a new optimiser is built with and
    what a resumed run sets on the one its checkpoint restored (which holds the saved run's values). ``lr`` is the
    base value; the trainer scales it by its schedule at each update."""
    return {"lr": optim.lr, "eps": optim.eps, "weight_decay": optim.weight_decay}


class AdamStep:
    """``optimizer.step()`` for the learner's fused Adam: the same kernel (``torch._fused_adam_``) with the same
    arguments, hence the same bits, without the Python ``Optimizer.step`` runs around it at every call (its profiling
    and step hooks, the dynamo and differentiable-mode guards, the state look-up and the grouping of every tensor by
    device and dtype): a measurable share of a V-RACER update on one core, measured in the learner's loop. The kernel
    is a private torch op: ``tests/test_optim.py`` compares the two steps bit for bit over several steps, learning
    rates and a loaded state, and fails if its arguments or arithmetic change with a torch release; a torch without
    it takes ``optimizer.step()`` (``acer_torchrl/_torchrl_compat.py``, T1).

    Taken for a fused Adam with one parameter group whose parameters share a device and a dtype (the learner's),
    without AMSGrad, ``maximize``, capturable or differentiable mode and with a float learning rate, once every
    parameter has its state (after the first ``optimizer.step()``) and a gradient; otherwise, and for any other
    optimiser, ``optimizer.step()`` itself. The learning rate and the other settings are read at every call.
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        groups = optimizer.param_groups
        group = groups[0]
        self.direct = (
            has_fused_adam()
            and type(optimizer) is torch.optim.Adam
            and len(groups) == 1
            and group["fused"]
            and not any(group[k] for k in ("amsgrad", "maximize", "capturable", "differentiable"))
            and not group.get("decoupled_weight_decay", False)
            and len({(p.device, p.dtype) for p in group["params"]}) == 1
        )

    def __call__(self) -> None:
        optimizer = self.optimizer
        if not self.direct:
            optimizer.step()
            return
        group = optimizer.param_groups[0]
        params = group["params"]
        states = [optimizer.state.get(p) for p in params]
        if not all(states) or any(p.grad is None for p in params) or torch.is_tensor(group["lr"]):
            optimizer.step()  # the first step creates the state
            return
        steps = [state["step"] for state in states]
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        torch._fused_adam_(
            params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
            steps, amsgrad=False, lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
            eps=group["eps"], maximize=False, grad_scale=None, found_inf=None,
        )
