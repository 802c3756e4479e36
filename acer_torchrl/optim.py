"""The learner's Adam settings."""

from __future__ import annotations


def adam_settings(optim) -> dict[str, float]:
    """The learner's Adam hyper-parameters that ``optim.*`` sets (an :class:`~acer_torchrl.config.OptimConfig`), as
    ``torch.optim.Adam`` takes them and keeps them in each parameter group: what a new optimiser is built with and
    what a resumed run sets on the one its checkpoint restored (which holds the saved run's values). ``lr`` is the
    base value; the trainer scales it by its schedule at each update."""
    return {"lr": optim.lr, "eps": optim.eps, "weight_decay": optim.weight_decay}
