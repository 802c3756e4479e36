"""A state standardisation fitted once, for an agent without stored estimates (ACER's ``acer.standardize``).

V-RACER standardises states with the mean and std of the observations stored once there are ``N_start`` (Novati &
Koumoutsakos 2019, App. B, eq. 14-15), fitted by its :class:`~acer_torchrl.estimates.vracer.VRACEREstimates`.
:class:`FittedStandardization` does the same for any other loss: it fits the network's
:class:`~acer_torchrl.modules.Standardize` layer when the replay first holds ``n_start`` steps (the trainer's
first update comes after that batch is stored) and copies the statistics into the loss's average / target copies
of the network. Not in ACER (Wang et al. 2017), which reads raw states.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from acer_torchrl.modules import Standardize
from acer_torchrl.objectives.updaters import copy_buffers_to_targets
from acer_torchrl.replay import EpisodeReplay


class FittedStandardization:
    """The :class:`~acer_torchrl.agent.Agent`'s ``estimates`` hook that fits ``normalizer`` (a layer inside
    ``loss``'s network) once, on the observations stored when ``n_start`` have been written; ``fitted`` goes into the checkpoint (the
    statistics themselves are the network's buffers, checkpointed and pushed to the workers with its weights)."""

    out_keys = ()  # adds nothing to an update's output
    value_keys = ()

    def __init__(self, loss, normalizer: Standardize, n_start: int, observation_key: str = "observation"):
        self.loss = loss
        self.normalizer = normalizer
        self.n_start = n_start
        self.observation_key = observation_key
        self.fitted = torch.tensor(False)

    def state_dict(self) -> dict:
        return {"fitted": self.fitted}

    def load_state_dict(self, state: dict) -> None:
        self.fitted.copy_(state["fitted"])

    def after_extend(self, replay: EpisodeReplay) -> None:
        """Fits the statistics (eq. 14-15) once ``n_start`` steps have been written, on every step then stored."""
        if bool(self.fitted) or replay.steps_written < self.n_start:
            return
        self.normalizer.fit(replay.column(self.observation_key).flatten(1).float())
        copy_buffers_to_targets(self.loss)
        self.fitted.fill_(True)

    def before_update(self, sample: TensorDictBase, replay: EpisodeReplay) -> TensorDictBase:
        return sample

    def after_update(self, sample: TensorDictBase, output: TensorDictBase, replay: EpisodeReplay) -> None:
        pass
