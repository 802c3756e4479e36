"""The benchmarks' statistics (benchmarks/learning.py): rliable's stratified-bootstrap CI of the IQM is the same
bits for the same scores, whatever else drew from numpy's global generator, and [min, max] for 3 seeds."""

import numpy as np
import pytest


def test_the_iqm_ci_is_reproducible_bit_for_bit(learning):
    scores = [412.5, 500.0, 96.1, 238.0, 477.3, 310.9, 55.2, 499.1]
    np.random.seed(1)
    first = learning.iqm_with_ci(scores, reps=500)
    np.random.seed(2)  # another state of the global generator, as another computation before it would leave
    before = np.random.get_state()
    assert learning.iqm_with_ci(scores, reps=500) == first
    after = np.random.get_state()
    assert after[0] == before[0] and (after[1] == before[1]).all() and after[2:] == before[2:], "left as it was"
    assert learning.iqm_with_ci(scores, reps=500, seed=1) != first, "the seed picks the resamples"


def test_three_seeds_give_their_mean_within_min_max(learning):
    """A resample of 3 is all one seed with probability 1/27 > 2.5 %: the 95 % CI is [min, max] (up to the
    percentile's rounding), and the IQM of 3 values trims none of them."""
    assert learning.iqm_with_ci([57.9, 50.2, 55.9], reps=5_000) == pytest.approx(((57.9 + 50.2 + 55.9) / 3, 50.2, 57.9))
