"""Prioritized sequence replay (Reactor, Gruslys et al. 2018, ICLR version, sec. 3.3): which window start to draw.

Every stored step starts a window (the overlapping sequences of the paper). A window gets a priority of its own
only once it has been drawn and trained on (the mean absolute TD error along it); until then it is *unassigned*
and its priority is estimated from its neighbours' ("lazy initialisation"). With probability ``uniform``
(epsilon) a start is drawn uniformly among the stored steps, else in proportion to the estimated priority
``p_hat``; the importance weight of a draw is PER's ``w = (1 / (N P))^beta`` (Schaul et al. 2016, eq. 2) with
``beta = 1`` as in the paper, divided by the batch's largest weight (PER sec. 3.4).

Deviation from the paper, and why: its contextual priority tree (appendix) is not published in a usable form.
Here the neighbourhood of a slot is its *block*, ``block`` consecutive ring-buffer slots (steps written one after
the other). Inside a block, time is cut into cells, one per assigned slot: an unassigned slot belongs to the cell
of the nearest assigned slot before it (those before the block's first assigned slot to that one), and every
unassigned slot of the block gets ``p_hat = sum_i |I_i| p_i / sum_i |I_i|`` (the paper's cell-length weights
``w_i = |I_i|``, correcting for assigned windows being denser where priorities are high). A block with no assigned
slot uses the same length-weighted mean over all blocks that have one (1 before anything is assigned: uniform).
So fresh experience, written a batch at a time over whole blocks (Reactor's presets: 128 steps, 4 blocks of 32),
starts at that replay-wide mean, not at the priority of the steps written just before it (the paper's cells may
reach across blocks); the neighbours' estimate applies within a block once one of its windows was trained on.

Cost: a draw or an update is ``O(log n_blocks + block)`` per window, vectorised over the batch: a sum tree over
blocks (:class:`SumTree`) with four channels -- the mass of blocks that have an assigned slot, their stored steps
and their cells' priorities times the cells' lengths (the global mean's parts), and the stored steps of blocks
that have none (their mass is that count times the global mean, so a change of the global mean touches no leaf)
-- then a draw inside the chosen block. The tree is a function of the per-slot
state alone (each parent is recomputed as the sum of its children), so a replay rebuilt from a checkpoint draws
exactly as the one saved.
"""

from __future__ import annotations

import math

import torch

MIN_PRIORITY = 1e-6  # PER's small positive constant (Schaul et al. 2016, eq. 1): no window is left undrawable
# the sum tree's channels, per block: its p_hat summed, its stored steps and their cells' length-weighted priorities
# summed (blocks with an assigned slot; else 0), its stored steps (blocks with none; else 0)
MASS, ASSIGNED_STEPS, CELL_MASS, EMPTY_STEPS = 0, 1, 2, 3


class SumTree:
    """A binary sum tree over ``n`` leaves of ``channels`` float64 values each, vectorised over the leaves set and
    the values looked up (a loop over its ``log2 n`` levels only)."""

    def __init__(self, n: int, channels: int):
        self.size = 1 << max(math.ceil(math.log2(max(n, 1))), 0)
        self.depth = int(math.log2(self.size))
        self.nodes = torch.zeros(2 * self.size, channels, dtype=torch.float64)

    @property
    def total(self) -> torch.Tensor:
        """The sum over all leaves, per channel."""
        return self.nodes[1]

    def leaf(self, idx: torch.Tensor) -> torch.Tensor:
        return self.nodes[self.size + idx]

    def set(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        """Leaves ``idx`` (``[k]``, distinct) to ``values`` (``[k, channels]``); every parent on their paths is
        recomputed from its children."""
        node = self.size + idx
        self.nodes[node] = values
        for _ in range(self.depth):
            node = torch.unique(node // 2)
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1]

    def find(self, channel: int, mass: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For each of ``mass`` (``[n]``, in ``[0, total)``), the leaf where the running sum of ``channel`` over the
        leaves passes it, and what is left of it inside that leaf. A step never goes to a subtree of zero mass."""
        node = torch.ones_like(mass, dtype=torch.long)
        for _ in range(self.depth):
            left = self.nodes[2 * node, channel]
            right = self.nodes[2 * node + 1, channel]
            go_right = (mass >= left) & (right > 0)
            mass = torch.where(go_right, mass - left, mass)
            node = 2 * node + go_right
        return node - self.size, mass


class SequencePriorities:
    """The priorities of a replay's window starts (one per slot) and the draw from them; see the module docstring.

    Args:
        capacity: the replay's slots.
        block: slots per neighbourhood (lazy initialisation, and the granularity of the sum tree).
        uniform: the share epsilon of uniform draws.
    """

    def __init__(self, capacity: int, block: int, uniform: float):
        self.capacity, self.block, self.uniform = capacity, block, uniform
        self.blocks = -(-capacity // block)
        self.priority = torch.zeros(capacity, dtype=torch.float64)  # the assigned priority of each slot
        self.assigned = torch.zeros(capacity, dtype=torch.bool)
        self.block_mean = torch.zeros(self.blocks, dtype=torch.float64)  # p_hat of a block's unassigned slots
        self.tree = SumTree(self.blocks, 4)

    # ------------------------------------------------------------------ writing
    def assign(self, slots: torch.Tensor, priorities: torch.Tensor, alive: torch.Tensor) -> None:
        """Give the windows starting at ``slots`` (still stored: ``alive``) their priorities (at least
        :data:`MIN_PRIORITY`)."""
        self.priority[slots] = priorities.to(torch.float64).clamp_min(MIN_PRIORITY)
        self.assigned[slots] = True
        self.refresh(slots, alive)

    def forget(self, slots: torch.Tensor, alive: torch.Tensor) -> None:
        """Slots written again or evicted: their windows lose their priority (and their mass when no longer
        ``alive``)."""
        self.assigned[slots] = False
        self.refresh(slots, alive)

    def refresh(self, slots: torch.Tensor, alive: torch.Tensor) -> None:
        """Recompute the blocks holding ``slots`` from the per-slot state and ``alive``."""
        if slots.numel():
            self._set_blocks(torch.unique(slots // self.block), alive)

    def rebuild(self, alive: torch.Tensor) -> None:
        """Every block from the per-slot state (after a checkpoint is loaded)."""
        self.assigned &= alive
        self._set_blocks(torch.arange(self.blocks), alive)

    def _block_slots(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[len(blocks), block]`` slot numbers (clamped at the last slot) and which of them exist."""
        idx = blocks.unsqueeze(-1) * self.block + torch.arange(self.block)
        return idx.clamp(max=self.capacity - 1), idx < self.capacity

    def _set_blocks(self, blocks: torch.Tensor, alive: torch.Tensor) -> None:
        """The cell-weighted mean of each block's assigned priorities and its leaf in the tree."""
        idx, exists = self._block_slots(blocks)
        stored = alive[idx] & exists
        assigned = self.assigned[idx] & stored
        priority = self.priority[idx]
        # each stored slot's cell: the last assigned slot at or before it, else the block's first assigned one
        position = torch.arange(self.block).expand_as(idx)
        last = torch.where(assigned, position, -1).cummax(-1).values
        owner = torch.where(last >= 0, last, assigned.long().argmax(-1, keepdim=True))
        steps = stored.sum(-1).to(torch.float64)
        n_assigned = assigned.sum(-1).to(torch.float64)
        mean = (priority.gather(-1, owner) * stored).sum(-1) / steps.clamp_min(1.0)
        has = n_assigned > 0
        mass = (priority * assigned).sum(-1) + (steps - n_assigned) * mean
        self.block_mean[blocks] = mean
        zero = torch.zeros_like(mass)
        leaves = torch.stack([torch.where(has, mass, zero), torch.where(has, steps, zero),
                              torch.where(has, mean * steps, zero), torch.where(has, zero, steps)], -1)
        self.tree.set(blocks, leaves)

    # ------------------------------------------------------------------ reading
    def global_mean(self) -> torch.Tensor:
        """``p_hat`` of the slots of blocks with no assigned slot: the cell-weighted mean over the blocks that have
        one (1 before any window has a priority)."""
        total = self.tree.total
        if total[ASSIGNED_STEPS] > 0:
            return total[CELL_MASS] / total[ASSIGNED_STEPS]
        return torch.ones((), dtype=torch.float64)

    def estimate(self, slots: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
        """``p_hat`` of the windows starting at ``slots``: their own priority, or their neighbourhood's estimate."""
        blocks = slots // self.block
        has = self.tree.leaf(blocks)[:, ASSIGNED_STEPS] > 0
        lazy = torch.where(has, self.block_mean[blocks], self.global_mean())
        return torch.where(self.assigned[slots], self.priority[slots], torch.where(alive[slots], lazy, 0.0))

    def probability(self, slots: torch.Tensor, alive: torch.Tensor, stored: int) -> torch.Tensor:
        """The probability that one draw starts at each of ``slots`` (``stored`` steps in the replay)."""
        total = self.tree.total[MASS] + self.tree.total[EMPTY_STEPS] * self.global_mean()
        return self.uniform / stored + (1.0 - self.uniform) * self.estimate(slots, alive) / total

    def importance_weights(self, slots: torch.Tensor, alive: torch.Tensor, stored: int) -> torch.Tensor:
        """PER's ``w = 1 / (N P)`` (eq. 2, beta = 1) of each drawn start, divided by the batch's largest."""
        weight = 1.0 / (stored * self.probability(slots, alive, stored))
        return (weight / weight.max()).to(torch.float32)

    def sample(
        self, n: int, alive_slots: torch.Tensor, alive: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """``n`` window starts: uniform among ``alive_slots`` with probability ``uniform``, else in proportion to
        ``p_hat``. Draws the same random numbers whichever way each start goes."""
        uniform = alive_slots[torch.randint(alive_slots.numel(), (n,), generator=generator)]
        pick_uniform = torch.rand(n, generator=generator, dtype=torch.float64) < self.uniform
        g = self.global_mean()
        mass, empty = self.tree.total[MASS], self.tree.total[EMPTY_STEPS] * g
        u = torch.rand(n, generator=generator, dtype=torch.float64) * (mass + empty)
        in_empty = (u >= mass) & (empty > 0) | (mass <= 0)
        block_m, rest_m = self.tree.find(MASS, u)
        block_e, rest_e = self.tree.find(EMPTY_STEPS, ((u - mass) / g).clamp_min(0.0))
        blocks = torch.where(in_empty, block_e, block_m)
        rest = torch.where(in_empty, rest_e * g, rest_m)
        idx, exists = self._block_slots(blocks)
        cumulative = (self.estimate(idx.reshape(-1), alive).reshape(idx.shape) * exists).cumsum(-1)
        rest = torch.minimum(rest, torch.nextafter(cumulative[:, -1], torch.zeros(())))
        column = torch.searchsorted(cumulative, rest.unsqueeze(-1), right=True).clamp(max=self.block - 1)
        prioritized = idx.gather(-1, column).squeeze(-1)
        return torch.where(pick_uniform, uniform, prioritized)

    # ------------------------------------------------------------------ persistence
    def state(self) -> dict[str, torch.Tensor]:
        return {"priority": self.priority, "assigned": self.assigned}

    def load_state(self, state: dict[str, torch.Tensor], alive: torch.Tensor) -> None:
        self.priority.copy_(state["priority"])
        self.assigned.copy_(state["assigned"])
        self.rebuild(alive)
