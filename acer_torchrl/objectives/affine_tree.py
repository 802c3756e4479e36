"""Suffix solutions of a backward affine recursion with point updates, in O(log n) per step.

The recursion ``x_i = a_i x_{i+1} + b_i`` (``x_n = 0``) is the shape of every backward estimator here; V-RACER's
stored-estimate recursion (Novati & Koumoutsakos 2019, eq. 8) is one. Each step is the affine map
``f_i(x) = a_i x + b_i`` and ``x_i = (f_i o f_{i+1} o ... o f_{n-1})(0)``; composition is associative,
``(a, b) o (a', b') = (a a', a b' + b)``, so a segment tree over the maps gives any ``x_i`` by composing
``log2 n`` node maps, and a changed ``(a_i, b_i)`` is folded in by recomposing its ``log2 n`` ancestors.
A map with ``a_i = 0`` cuts the recursion: nothing after it reaches ``x_j``, ``j <= i`` (an episode's last
stored step, when episodes lie end to end).

Everything is vectorised over the queried or updated positions; only the tree's levels are looped over.
"""

from __future__ import annotations

import torch
from torch import Tensor


class AffineSuffixTree:
    """A segment tree over the maps ``(a_i, b_i)``, ``i < n``; positions ``n`` and beyond are the identity.

    Node ``k`` holds the composition of its two children ``2k`` (earlier positions) and ``2k + 1``; leaf
    ``i`` is node ``size + i``. Kept in float64: the composed coefficients are products of up to ``n``
    factors, and ones below ``sqrt(tiny)`` are set to 0 (as in ``functional._affine_scan``), so that no
    product of two is a denormal; that changes ``x`` by at most ``sqrt(tiny) max|x|``.
    """

    def __init__(self, a: Tensor, b: Tensor):
        n = a.shape[0]
        self.n = n
        self.size = 1 << max(n, 1).bit_length()  # > n: position n is an identity leaf, x_n = 0
        self.depth = self.size.bit_length() - 1
        self._tiny = torch.finfo(torch.float64).tiny ** 0.5
        self.a = torch.ones(2 * self.size, dtype=torch.float64)
        self.b = torch.zeros(2 * self.size, dtype=torch.float64)
        self.a[self.size : self.size + n] = a.to(torch.float64)
        self.b[self.size : self.size + n] = b.to(torch.float64)
        lo = self.size
        while lo > 1:  # level by level, all nodes of a level at once
            parents = torch.arange(lo // 2, lo)
            self._recompose(parents)
            lo //= 2

    def _recompose(self, nodes: Tensor) -> None:
        left, right = 2 * nodes, 2 * nodes + 1
        a_left = self.a[left]
        self.b[nodes] = torch.addcmul(self.b[left], a_left, self.b[right])
        self.a[nodes] = torch.threshold(a_left * self.a[right], self._tiny, 0.0)

    def set(self, positions: Tensor, a: Tensor, b: Tensor) -> None:
        """Replace the maps at ``positions`` (``[k]``; repeated positions must carry equal maps)."""
        nodes = positions + self.size
        self.a[nodes] = a.to(torch.float64)
        self.b[nodes] = b.to(torch.float64)
        for _ in range(self.depth):
            nodes = nodes // 2
            self._recompose(nodes)

    def suffix(self, positions: Tensor) -> Tensor:
        """``x_i`` at ``positions`` (``[k]``, each in ``[0, n]``), float64.

        Walking up from leaf ``i``, the map composed so far covers ``i`` to the end of the current node's
        range; a left child's right sibling covers the range just after it, so it is composed on."""
        node = positions + self.size
        acc_a, acc_b = self.a[node], self.b[node]
        for _ in range(self.depth):
            is_left = node % 2 == 0
            sibling = torch.where(is_left, node + 1, node)
            acc_b = torch.where(is_left, torch.addcmul(acc_b, acc_a, self.b[sibling]), acc_b)
            acc_a = torch.where(is_left, torch.threshold(acc_a * self.a[sibling], self._tiny, 0.0), acc_a)
            node = node // 2
        return acc_b
