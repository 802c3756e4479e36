"""The eq. 8 recursion over a replay's stored episodes, kept current while the replay is written
(``estimates/episode_recursion.py``): against a plain backward loop along the replay's links."""

import random

import torch

from acer_torchrl.estimates.episode_recursion import EpisodeRecursion
from acer_torchrl.estimates.slots import SlotEstimates
from acer_torchrl.replay import EpisodeLinks, EpisodeReplay
from test_replay import make_rows


class Values:
    """Per-slot ``(a, b)`` of the recursion, drawn anew when a slot is written; ``a = 0`` at an episode's last
    stored step (as eq. 8's maps cut there)."""

    def __init__(self, capacity: int, seed: int):
        self.g = torch.Generator().manual_seed(seed)
        self.a = torch.zeros(capacity, dtype=torch.float64)
        self.b = torch.zeros(capacity, dtype=torch.float64)
        self.links: EpisodeLinks | None = None

    def draw(self, slots: torch.Tensor) -> None:
        self.a[slots] = 0.99 * torch.rand(slots.numel(), generator=self.g, dtype=torch.float64)
        self.b[slots] = torch.randn(slots.numel(), generator=self.g, dtype=torch.float64)

    def maps(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        last = self.links.next[slots] < 0
        return torch.where(last, 0.0, self.a[slots]), self.b[slots]


def plain_suffix_after(values: Values, links: EpisodeLinks, slot: int) -> float:
    """``x`` at the step after ``slot``, one step at a time along the links to its episode's last stored step."""
    chain, s = [], int(links.next[slot])
    while s >= 0:
        chain.append(s)
        s = int(links.next[s])
    x = 0.0
    for s in reversed(chain):
        a = 0.0 if int(links.next[s]) < 0 else float(values.a[s])
        x = a * x + float(values.b[s])
    return x


def collected_batches(n_batches: int, seed: int):
    """Batches of three envs x 8 steps with episodes of 1-15 steps; now and then a trajectory's steps are lost
    (the replay cuts it there, as after a batch the collector dropped)."""
    rng = random.Random(seed)
    next_id = 3
    envs = [[i, 0, rng.randint(1, 15)] for i in range(3)]  # trajectory id, its next step, steps left
    for _ in range(n_batches):
        rows = []
        for env in envs:
            row, used = [], 0
            while used < 8:
                n = min(env[2], 8 - used)
                row.append((env[0], env[1], n, n == env[2]))
                env[1] += n
                env[2] -= n
                used += n
                if env[2] == 0:
                    env[:] = [next_id, 0, rng.randint(1, 15)]
                    next_id += 1
            if rng.random() < 0.05:
                env[1] += 3  # three steps lost
            rows.append(row)
        yield make_rows(rows)


def test_recursion_kept_current_through_stores_evictions_and_write_backs_equals_the_plain_loop():
    replay = EpisodeReplay(60, seed=0)
    values = Values(60, seed=1)
    stored = SlotEstimates()
    recursion = None
    rebuilds = refreshes = 0
    for i, batch in enumerate(collected_batches(60, seed=2)):
        slots = replay.extend(batch)
        values.draw(slots)
        new = stored.sync(replay)
        values.links = stored.links
        if recursion is None:
            recursion = EpisodeRecursion(stored.links, values.maps)
        else:
            before = recursion.start
            recursion.refresh(stored.links, new, values.maps)
            refreshes += 1
            rebuilds += recursion.start == 0 and before > 0
        if i % 3 == 1:  # write-backs: new values at some stored steps
            some = stored.alive_slots()[torch.randperm(int(stored.links.alive.sum()), generator=values.g)[:7]]
            values.draw(some)
            recursion.set(some, *values.maps(some))
        alive = stored.alive_slots()
        inner = alive[stored.links.next[alive] >= 0]  # the last stored steps' successor is not stored
        expected = torch.tensor([plain_suffix_after(values, stored.links, int(s)) for s in inner], dtype=torch.float64)
        torch.testing.assert_close(recursion.suffix_after(inner), expected, rtol=1e-12, atol=1e-12)
    assert replay.steps_written > 20 * replay.capacity
    assert 0 < rebuilds < refreshes / 4, "the layout should move on through evictions, starting afresh only now and then"


def test_an_eviction_that_is_not_the_oldest_episodes_lays_everything_out_afresh():
    """Links written by hand: the middle one of three episodes dies (not what the FIFO replay does); the count
    of alive steps gives it away and the recursion is laid out again rather than left with a dead episode."""
    episode = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2])
    position = torch.tensor([0, 1, 0, 1, 2, 0, 1, 2])
    nxt = torch.tensor([1, -1, 3, 4, -1, 6, 7, -1])
    links = EpisodeLinks(torch.ones(8, dtype=torch.bool), episode, position, nxt)
    values = Values(8, seed=3)
    values.links = links
    values.draw(torch.arange(8))
    recursion = EpisodeRecursion(links, values.maps)
    links.alive[2:5] = False
    recursion.refresh(links, torch.tensor([], dtype=torch.long), values.maps)
    assert recursion.layout[recursion.start : recursion.end].tolist() == [0, 1, 5, 6, 7]
    inner = torch.tensor([0, 5, 6])
    expected = torch.tensor([plain_suffix_after(values, links, int(s)) for s in inner], dtype=torch.float64)
    torch.testing.assert_close(recursion.suffix_after(inner), expected, rtol=1e-12, atol=1e-12)
