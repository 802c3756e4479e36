"""ReF-ER's far-policy share of a whole replay (Novati & Koumoutsakos 2019, eq. 12), counted as the replay's stored
weights change rather than afresh after every update: what V-RACER's
:class:`~acer_torchrl.estimates.vracer.VRACEREstimates` hands to :meth:`ReFER.step_beta
<acer_torchrl.objectives.refer.ReFER.step_beta>`.
"""

from __future__ import annotations

import numpy as np

from acer_torchrl.objectives.refer import far_policy


class FarPolicyCount:
    """``n_far`` and ``N`` of eq. 12 over a replay's stored weights, kept between ``beta`` updates.

    Counting far-policy weights over the whole replay after every update is a pass over 2^18 stored steps, yet
    between two counts the classification changes only where weights were written back: ``c_max`` (eq. 13)
    moves with the env steps, i.e. once per collected batch, not per update. So the count is taken afresh when
    ``c_max`` or the stored column's version changed (:meth:`share`), and otherwise corrected at the rewritten
    slots only (:meth:`rewritten`). The same numbers as
    :meth:`~acer_torchrl.objectives.refer.ReFER.far_share` over the column.
    """

    def __init__(self):
        self.far = np.zeros(0, dtype=bool)  # per slot: holds a step whose weight is far-policy at the key's c_max
        self.n_far = self.n = 0
        self.key: tuple[float, int] | None = None  # (c_max, version of the column) the count is for

    def share(self, rho: np.ndarray, alive: np.ndarray, c_max: float, version: int) -> float:
        """``n_far / N`` among the ``alive`` weights ``rho`` (one per slot) at cut-off ``c_max``; ``version`` changes
        whenever ``rho`` or ``alive`` change other than through :meth:`rewritten`."""
        if self.key != (c_max, version):
            self.far = far_policy(rho, c_max) & alive
            self.n_far, self.n = int(np.count_nonzero(self.far)), int(np.count_nonzero(alive))
            self.key = (c_max, version)
        return self.n_far / self.n if self.n else 0.0

    def rewritten(self, slots: np.ndarray, rho: np.ndarray, before: int, after: int) -> None:
        """The weights at ``slots`` (stored steps; repeats allowed) were rewritten in ``rho``, taking the column from
        version ``before`` to ``after`` and changing nothing else; a count not of ``before`` is left to be retaken."""
        if self.key is None or self.key[1] != before:
            return
        slots = np.unique(slots)
        now = far_policy(rho[slots], self.key[0])
        self.n_far += int(np.count_nonzero(now)) - int(np.count_nonzero(self.far[slots]))
        self.far[slots] = now
        self.key = (self.key[0], after)
