"""A backward affine recursion over every stored episode of a replay, kept current while the replay is written:
V-RACER's eq. 8 over its stored estimates (Novati & Koumoutsakos 2019, sec. 2, Algorithm 3).

The alive steps are laid out episode after episode, each in time order, as the leaves of an
:class:`~acer_torchrl.estimates.affine_tree.AffineSuffixTree`; an episode's last stored step cuts the recursion
(``a = 0``), so a suffix query never leaves its episode. Two facts of :class:`~acer_torchrl.replay.EpisodeReplay`
keep the layout cheap to maintain as steps are stored:

* episode ids follow the order of the episodes' first steps and the replay evicts whole episodes FIFO (the round
  robin writer reaches an episode's first step before any later episode's), so the evicted episodes are always the
  first ones of the layout: dropped by moving its start;
* a new step belongs to a running episode or to a new one (a larger id than any stored), so it goes into the
  layout's tail, from the first running episode that grew on.

After a stored batch only that tail is laid out again, its maps recomputed (a running episode's former last step
is no longer last) and their ancestors recomposed: O(tail + log n), where sorting and rebuilding the whole replay
after every 64-step batch cost more than the update at 2^18 stored steps. The layout starts afresh (one sort, one
build) when its end reaches the tree's last leaf, or when the replay changed in a way these two facts do not cover
(checked by counting the alive steps).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from acer_torchrl.estimates.affine_tree import AffineSuffixTree
from acer_torchrl.replay import EpisodeLinks

Maps = Callable[[np.ndarray], tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor]]  # slots [k] -> (a, b) there, [k] each


class EpisodeRecursion:
    """``x_t = a_t x_{t+1} + b_t`` within each stored episode (``a = 0`` at its last stored step), for any stored
    step, given the replay's :class:`EpisodeLinks` and ``maps``, which computes ``(a, b)`` at given slots from the
    caller's per-slot values.

    ``rank[slot]`` is the slot's leaf; ``layout[start:end]`` the alive slots in (episode, position) order, ``keys``
    their ``episode * capacity + position``. At each fresh layout the tree gets room for twice the steps stored then
    (not for the replay's capacity: a deeper tree costs every query and write-back more while the replay fills), so
    that the layout moves on through as many new steps as it holds before it is laid out afresh: amortised O(1) a
    stored step, however the replay grows.
    """

    def __init__(self, links: EpisodeLinks, maps: Maps):
        self.capacity = links.alive.shape[0]
        self.rank = np.full(self.capacity, -1, dtype=np.int64)
        self.rebuild(links, maps)

    def _key(self, links: EpisodeLinks, slots: np.ndarray) -> np.ndarray:
        return links.episode.numpy()[slots] * self.capacity + links.position.numpy()[slots]

    def rebuild(self, links: EpisodeLinks, maps: Maps) -> None:
        """Lay every alive step out from leaf 0 and build the tree."""
        alive = np.flatnonzero(links.alive.numpy())
        keys = self._key(links, alive)
        order = np.argsort(keys)  # keys are unique
        n = alive.size
        self.size = 1 << (2 * max(n, 32)).bit_length()  # > 2 n leaves
        self.layout = np.full(self.size, -1, dtype=np.int64)
        self.keys = np.full(self.size, -1, dtype=np.int64)
        self.layout[:n], self.keys[:n] = alive[order], keys[order]
        self.start, self.end = 0, n
        self.rank.fill(-1)
        self.rank[self.layout[:n]] = np.arange(n)
        a, b = maps(self.layout[:n])
        self.tree = AffineSuffixTree(a, b, size=self.size)

    def refresh(self, links: EpisodeLinks, new: torch.Tensor, maps: Maps) -> None:
        """After the replay was written: drop the evicted episodes and lay out ``new`` (the alive slots written since
        the last refresh; their values already where ``maps`` reads them)."""
        self._drop_evicted(links)
        new = new.numpy()
        if new.size:
            new_keys = self._key(links, new)
            # from the step before the first insertion point: a running episode's former last step changes its map
            at = max(self.start, self.start + int(np.searchsorted(self.keys[self.start : self.end], new_keys.min())) - 1)
            slots = np.concatenate([self.layout[at : self.end], new])
            keys = np.concatenate([self.keys[at : self.end], new_keys])
            end = at + slots.size
            if end >= self.size:  # no room left after the layout: start afresh
                return self.rebuild(links, maps)
            order = np.argsort(keys)
            self.layout[at:end], self.keys[at:end] = slots[order], keys[order]
            self.rank[self.layout[at:end]] = np.arange(at, end)
            self.end = end
            self.tree.set_range(at, *maps(self.layout[at:end]))
        if self.end - self.start != int(links.alive.sum()):  # an eviction that was not the oldest episodes
            self.rebuild(links, maps)

    def _drop_evicted(self, links: EpisodeLinks) -> None:
        """Move the start past the laid-out steps no longer stored (evicted, or their slot written again), looking at
        a growing window from the start until a stored one appears."""
        alive = links.alive.numpy()
        window = 64
        while self.start < self.end:
            slots = self.layout[self.start : self.start + window]
            gone = ~alive[slots] | (self._key(links, slots) != self.keys[self.start : self.start + slots.size])
            dropped = slots.size if gone.all() else int(np.argmin(gone))
            self.rank[slots[:dropped]] = -1
            self.start += dropped
            if dropped < slots.size:
                return
            window *= 2

    def suffix_after(self, slots: np.ndarray | torch.Tensor) -> torch.Tensor:
        """``x`` at the step after each of ``slots`` in its episode (float64 ``[k]``; meaningless for an episode's
        last stored step, whose successor is not in the layout)."""
        return self.tree.suffix(self.rank[np.asarray(slots)] + 1)

    def set(self, slots: np.ndarray | torch.Tensor, a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> None:
        """New maps at ``slots`` (stored steps, laid out)."""
        self.tree.set(self.rank[np.asarray(slots)], a, b)
