"""The learner's optimiser (Adam or RMSProp) and its settings, and its gradient clipping and Adam step with their
kernels called directly."""

from __future__ import annotations

import torch

from acer_torchrl._torchrl_compat import has_update_kernels


def optimiser_settings(optim) -> dict[str, float]:
    """The learner's optimiser hyper-parameters that ``optim.*`` sets (an :class:`~acer_torchrl.config.OptimConfig`),
    as ``torch.optim.Adam`` / ``RMSprop`` take them and keep them in each parameter group: what a new optimiser is
    built with and what a resumed run sets on the one its checkpoint restored (which holds the saved run's values).
    ``lr`` is the base value; the trainer scales it by its schedule at each update."""
    settings = {"lr": optim.lr, "eps": optim.eps, "weight_decay": optim.weight_decay}
    return {**settings, "alpha": optim.alpha} if optim.name == "rmsprop" else settings


def optimiser_name(param_group: dict) -> str:
    """Which of ``optim.name``'s optimisers a saved parameter group is from (RMSprop's groups hold ``alpha``)."""
    return "rmsprop" if "alpha" in param_group else "adam"


def make_optimiser(params: list[torch.nn.Parameter], optim) -> torch.optim.Optimizer:
    """``optim.name``'s optimiser over ``params``: Adam fused (one kernel for all parameters), or RMSProp without
    momentum or centring, as A3C's (Mnih et al. 2016) less its sharing across threads."""
    if optim.name == "rmsprop":
        return torch.optim.RMSprop(params, **optimiser_settings(optim), foreach=True)
    return torch.optim.Adam(params, **optimiser_settings(optim), fused=True)


def takes_direct_kernels(optimizer: torch.optim.Optimizer) -> bool:
    """Whether :class:`DirectStep` may call ``optimizer``'s kernels itself: a fused ``torch.optim.Adam`` with one
    parameter group on one device and dtype (the learner's), without AMSGrad, ``maximize``, capturable or
    differentiable mode, on a torch that has the kernels (``_torchrl_compat.py``, T2)."""
    group = optimizer.param_groups[0]
    return (
        has_update_kernels()
        and type(optimizer) is torch.optim.Adam
        and len(optimizer.param_groups) == 1
        and group["fused"]
        and not any(group[k] for k in ("amsgrad", "maximize", "capturable", "differentiable"))
        and not group.get("decoupled_weight_decay", False)
        and len({(p.device, p.dtype) for p in group["params"]}) == 1
    )


class DirectStep:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)`` and ``optimizer.step()`` for the learner's fused Adam:
    the same kernels with the same arguments, hence the same bits, without the Python both run around them at every
    call (grouping every tensor by device and dtype, the step's hooks, profiling and guards, the state look-up),
    which on the presets' small networks is a share of the update (``benchmarks/results/speed-pieces.md``: "the
    update path"). The kernels are private torch functions: ``tests/test_optim.py`` compares both calls with
    torch's bit for bit, so a torch release that changes their arguments or arithmetic fails there; a torch without
    them, another optimiser or other Adam settings take torch's own calls (:func:`takes_direct_kernels`, decided
    once: a loaded state dict keeps the group's settings).
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.direct = takes_direct_kernels(optimizer)

    @torch.no_grad()
    def clip(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients by ``min(1, max_norm / (norm + 1e-6))`` (``inf``: by 1); their global 2-norm before."""
        params = self.optimizer.param_groups[0]["params"]
        if not self.direct:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)))
        torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    def step(self) -> None:
        """Adam's step at the group's current settings (the trainer sets ``lr`` before every step); the first step,
        which makes the state, and a step with a parameter left without gradient are torch's own."""
        optimizer = self.optimizer
        group = optimizer.param_groups[0]
        params = group["params"]
        states = [optimizer.state.get(p) for p in params]
        if not self.direct or not all(states) or any(p.grad is None for p in params) or torch.is_tensor(group["lr"]):
            optimizer.step()
            return
        steps = [state["step"] for state in states]
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        torch._fused_adam_(
            params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
            steps, amsgrad=False, lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
            eps=group["eps"], maximize=False, grad_scale=None, found_inf=None,
        )
