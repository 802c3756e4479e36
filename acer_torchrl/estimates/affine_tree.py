"""Suffix solutions of a backward affine recursion with point updates, in O(log n) per step.

The recursion ``x_i = a_i x_{i+1} + b_i`` (``x_n = 0``) is the shape of every backward estimator here; V-RACER's
stored-estimate recursion (Novati & Koumoutsakos 2019, eq. 8) is one. Each step is the affine map
``f_i(x) = a_i x + b_i`` and ``x_i = (f_i o f_{i+1} o ... o f_{n-1})(0)``; composition is associative,
``(a, b) o (a', b') = (a a', a b' + b)``, so a segment tree over the maps gives any ``x_i`` by composing
``log2 n`` node maps, and a changed ``(a_i, b_i)`` is folded in by recomposing its ``log2 n`` ancestors.
A map with ``a_i = 0`` cuts the recursion: nothing after it reaches ``x_j``, ``j <= i`` (an episode's last
stored step, when episodes lie end to end).

Everything is vectorised over the queried or updated positions; only an update loops over the tree's levels. The
tree lives in NumPy arrays: its operations touch a few hundred entries per level, where a NumPy call costs
a fraction of a torch call (a build, a point update and a query each faster than the same code in torch,
``benchmarks/results/learner.md``); a full level is composed through
strided slices, without gathers.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from acer_torchrl.estimates.slots import as_array


class AffineSuffixTree:
    """A segment tree over the maps ``(a_i, b_i)``, ``i < n``; positions ``n`` and beyond are the identity.

    Node ``k`` holds the composition of its two children ``2k`` (earlier positions) and ``2k + 1``; leaf
    ``i`` is node ``size + i`` (``size``: a power of two above ``n``, larger to leave room for :meth:`set_range`
    to add maps after the ``n`` given). Kept in float64: the composed coefficients are products of up to ``n``
    factors, and ones at or below ``sqrt(tiny)`` are set to 0 (as in ``functional._affine_scan``), so that
    no product of two is a denormal; that changes ``x`` by at most ``sqrt(tiny) max|x|``. The ``a_i`` are
    non-negative (discount times truncated importance weight).
    """

    def __init__(self, a: Tensor, b: Tensor, size: int | None = None):
        n = a.shape[0]
        self.size = size or 1 << max(n, 1).bit_length()  # > n: position n is an identity leaf, x_n = 0
        if self.size <= n or self.size & (self.size - 1):
            raise ValueError(f"AffineSuffixTree: size={self.size} must be a power of two above the {n} maps")
        self.depth = self.size.bit_length() - 1
        self._tiny = np.finfo(np.float64).tiny ** 0.5
        self.a = np.ones(2 * self.size)  # every node the identity, so the nodes above identity leaves are composed
        self.b = np.zeros(2 * self.size)
        self.n = 0
        self.set_range(0, a, b)  # O(n), however much room the tree leaves after the maps

    def _recompose(self, lo: int, hi: int) -> None:
        """Recompose every ancestor of leaves ``[lo, hi)``, level by level: at each level the parents of a run of
        nodes are a run, their left children ``2k`` and right ones ``2k + 1`` strided slices (no gathers)."""
        lo, hi = lo + self.size, hi + self.size
        while lo > 1:
            lo, hi = lo >> 1, (hi + 1) >> 1
            self._compose(slice(lo, hi), slice(2 * lo, 2 * hi, 2), slice(2 * lo + 1, 2 * hi, 2))

    def _compose(self, nodes, left, right) -> None:
        """``node = left o right`` for index arrays or slices of equal length."""
        a_left = self.a[left]
        self.b[nodes] = self.b[left] + a_left * self.b[right]
        self.a[nodes] = self._cut(a_left * self.a[right])

    def _cut(self, a: np.ndarray) -> np.ndarray:
        a[a <= self._tiny] = 0.0
        return a

    def set(self, positions: Tensor | np.ndarray, a: Tensor | np.ndarray, b: Tensor | np.ndarray) -> None:
        """Replace the maps at ``positions`` (``[k]``; repeated positions must carry equal maps)."""
        leaves = _numpy(positions) + self.size
        self.a[leaves] = _numpy(a)
        self.b[leaves] = _numpy(b)
        ancestors = leaves[None, :] >> np.arange(1, self.depth + 1)[:, None]  # [depth, k], from the leaves up
        left = ancestors << 1
        for nodes, left_children, right_children in zip(ancestors, left, left | 1):
            self._compose(nodes, left_children, right_children)

    def set_range(self, lo: int, a: Tensor | np.ndarray, b: Tensor | np.ndarray) -> None:
        """Replace the maps at positions ``lo, lo + 1, ..., lo + k - 1`` (``a``, ``b``: ``[k]``); O(k + log n)."""
        hi = lo + a.shape[0]
        if hi >= self.size:  # position size - 1 stays free: a query one past the last map reads it
            raise IndexError(f"AffineSuffixTree.set_range: positions up to {hi - 1} in a tree of {self.size} leaves")
        self.a[self.size + lo : self.size + hi] = _numpy(a)
        self.b[self.size + lo : self.size + hi] = _numpy(b)
        self.n = max(self.n, hi)
        self._recompose(lo, hi)

    def suffix(self, positions: Tensor | np.ndarray) -> Tensor:
        """``x_i`` at ``positions`` (``[k]``, each in ``[0, n]``), float64.

        Walking up from leaf ``i``, the map composed so far covers ``i`` to the end of the current node's
        range; a left child's right sibling covers the range just after it, so it is composed on. The walk is
        one array op per step for all levels at once: with ``(A_l, B_l)`` the sibling composed at level ``l``
        (the identity where the node is a right child), ``x_i = b_i + sum_l a_i A_0 ... A_{l-1} B_l``, the
        products a cumulative product over the levels (cut at ``sqrt(tiny)`` as a composition is)."""
        leaves = _numpy(positions) + self.size
        nodes = leaves[None, :] >> np.arange(self.depth)[:, None]  # [depth, k]: each leaf's ancestors below the root
        left = (nodes & 1) == 0
        siblings = nodes | 1
        sibling_a = np.where(left, self.a[siblings], 1.0)
        sibling_b = np.where(left, self.b[siblings], 0.0)
        reach = np.empty_like(sibling_a)  # a_i A_0 ... A_{l-1}: the map composed before level l
        reach[0] = self.a[leaves]
        reach[1:] = self._cut(reach[0] * np.cumprod(sibling_a[:-1], axis=0))
        return torch.from_numpy(self.b[leaves] + (reach * sibling_b).sum(0))


def _numpy(x: Tensor | np.ndarray) -> np.ndarray:
    """A tensor or array as a NumPy array (positions int64, maps float64)."""
    x = as_array(x)
    return x.astype(np.float64, copy=False) if x.dtype.kind == "f" else x
