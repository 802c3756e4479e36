"""Prioritized sequence replay (Reactor sec. 3.3): the draw against a reference written from the definition, eviction,
checkpoint/resume, the losses' priorities and importance weights, and a recipe run with it."""

import subprocess
import sys

import pytest
import torch
import yaml

from acer_torchrl.objectives.common import weighted_mean, window_priority
from acer_torchrl.priority_tree import SequencePriorities
from acer_torchrl.replay import EpisodeReplay, unprioritized, write_index
from test_replay import check_sequences, make_rows
from test_reactor import make_loss, make_window, one_thread, reference  # noqa: F401 (one_thread: autouse)
from test_user_errors import ENV, ROOT, TINY

CAPACITY, BLOCK, EPSILON = 48, 8, 0.2
DRAWS = 400_000


def prioritized_replay(capacity=CAPACITY, seed=0):
    return EpisodeReplay(capacity, seed=seed, priorities=SequencePriorities(capacity, BLOCK, EPSILON))


def filled_replay():
    """A wrapped ring (an evicted episode, a running trajectory) with priorities on a few window starts, placed so
    that a block has several cells, a block has one, and blocks have none."""
    rb = prioritized_replay()
    rb.extend(make_rows([[(1, 0, 14, True), (2, 0, 10, True), (3, 0, 16, False)]]))
    rb.extend(make_rows([[(3, 16, 6, True), (4, 0, 6, False)]]))  # wraps: episode 1 is evicted
    alive = rb.alive_slots()
    chosen = alive[torch.tensor([0, 3, 4, 10, 25])]
    rb.priorities.assign(chosen, torch.tensor([0.5, 3.0, 0.25, 2.0, 7.0]), rb.alive)
    return rb


def reference_probabilities(rb) -> dict[int, float]:
    """P(start at slot) straight from the definition, one slot at a time: assigned windows their priority; in each
    block, an unassigned one the mean of its cells' priorities weighted by the cells' lengths (the cell of a stored
    slot: the last assigned slot at or before it, else the block's first); blocks with none the same weighted mean
    over the blocks that have one (1 before any); then epsilon uniform."""
    pri, assigned, alive = rb.priorities.priority, rb.priorities.assigned, rb.alive
    p_hat, blocks_mass, blocks_steps, lazy_blocks = {}, 0.0, 0, []
    for first in range(0, rb.capacity, BLOCK):
        slots = [s for s in range(first, min(first + BLOCK, rb.capacity)) if alive[s]]
        owners = [s for s in slots if assigned[s]]
        if not owners:
            lazy_blocks.append(slots)
            continue
        cell_of = {}
        for s in slots:
            before = [o for o in owners if o <= s]
            cell_of[s] = before[-1] if before else owners[0]
        mean = sum(float(pri[cell_of[s]]) for s in slots) / len(slots)  # sum_i |I_i| p_i / sum_i |I_i|
        blocks_mass += mean * len(slots)
        blocks_steps += len(slots)
        for s in slots:
            p_hat[s] = float(pri[s]) if assigned[s] else mean
    global_mean = blocks_mass / blocks_steps if blocks_steps else 1.0
    for slots in lazy_blocks:
        p_hat.update(dict.fromkeys(slots, global_mean))
    total, n = sum(p_hat.values()), len(p_hat)
    return {s: EPSILON / n + (1 - EPSILON) * p / total for s, p in p_hat.items()}


def assert_draws_follow(rb, expected: dict[int, float]):
    """Empirical start frequencies over many draws within 5 standard errors of ``expected``; no other start."""
    starts = rb.priorities.sample(DRAWS, rb.alive_slots(), rb.alive, rb.generator)
    counts = torch.bincount(starts, minlength=rb.capacity)
    slots = torch.tensor(sorted(expected))
    p = torch.tensor([expected[s] for s in sorted(expected)], dtype=torch.float64)
    assert torch.equal(counts.nonzero().squeeze(-1), slots[p > 0])
    counts = counts.double() / DRAWS
    assert ((counts[slots] - p).abs() <= 5 * (p * (1 - p) / DRAWS).sqrt() + 1e-6).all()


def test_draws_and_importance_weights_match_the_definition():
    rb = filled_replay()
    expected = reference_probabilities(rb)
    assert len(expected) == len(rb) and abs(sum(expected.values()) - 1) < 1e-12
    slots = torch.tensor(sorted(expected))
    p = torch.tensor([expected[s] for s in sorted(expected)], dtype=torch.float64)
    torch.testing.assert_close(rb.priorities.probability(slots, rb.alive, len(rb)), p, rtol=1e-12, atol=0)
    assert_draws_follow(rb, expected)
    # PER eq. 2 with beta = 1, over the batch's largest
    sample = rb.sample_sequences(64, 5)
    starts = sample["slot"][:, 0]
    w = 1.0 / (len(rb) * torch.tensor([expected[int(s)] for s in starts], dtype=torch.float64))
    torch.testing.assert_close(sample["priority_weight"][:, 0], (w / w.max()).float())
    assert (sample["priority_weight"] == sample["priority_weight"][:, :1]).all()  # one weight per window
    assert torch.equal(sample["write_index"], write_index(sample["slot"], rb.steps_written, rb.capacity))
    check_sequences(sample)


def test_before_any_priority_the_draw_is_uniform():
    rb = prioritized_replay()
    rb.extend(make_rows([[(1, 0, 20, True), (2, 0, 12, False)]]))
    assert_draws_follow(rb, dict.fromkeys(rb.alive_slots().tolist(), 1 / len(rb)))
    assert (rb.sample_sequences(16, 4)["priority_weight"] == 1).all()


def test_evicted_and_overwritten_windows_lose_their_priority_and_are_never_drawn():
    rb = prioritized_replay()
    rb.extend(make_rows([[(1, 0, 20, True), (2, 0, 20, False)]]))
    rb.priorities.assign(rb.alive_slots(), torch.full((40,), 5.0), rb.alive)
    drawn = rb.sample_sequences(8, 4)
    rb.extend(make_rows([[(2, 20, 4, True), (3, 0, 8, False)]]))  # slots 40-47 and 0-3: episode 1 is evicted
    written, evicted = torch.tensor([*range(40, 48), *range(4)]), torch.arange(4, 20)
    assert not rb.alive[evicted].any() and not rb.priorities.assigned[evicted].any()
    assert rb.alive[written].all() and not rb.priorities.assigned[written].any()
    assert rb.priorities.assigned[20:40].all()
    assert_draws_follow(rb, reference_probabilities(rb))
    sample = rb.sample_sequences(4096, 6)
    assert rb.alive[sample["slot"][sample["mask"]]].all()
    check_sequences(sample)
    # a trained window written over since it was drawn keeps no priority; the others get theirs
    rb.update_priorities(drawn, torch.full((8,), 0.125))
    starts = drawn["slot"][:, 0]
    kept = rb.alive[starts]
    assert (rb.priorities.priority[starts[kept]] == 0.125).all()
    assert not rb.priorities.assigned[starts[~kept]].any()


def priorities_state(rb):
    return rb.priorities.priority, rb.priorities.assigned, rb.priorities.block_mean, rb.priorities.tree.nodes


def test_a_checkpointed_prioritized_replay_resumes_exactly(tmp_path):
    rb = filled_replay()
    rb.update_priorities(rb.sample_sequences(6, 5), torch.rand(6, dtype=torch.float64))
    rb.save(tmp_path / "replay")
    other = prioritized_replay(seed=99)
    other.load(tmp_path / "replay")
    for a, b in zip(priorities_state(rb), priorities_state(other)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    for _ in range(3):  # the same draws, weights and priority updates from here on
        a, b = rb.sample_sequences(16, 5), other.sample_sequences(16, 5)
        for key in ("slot", "mask", "priority_weight", "write_index", "observation"):
            assert torch.equal(a[key], b[key]), key
        new = torch.rand(16, dtype=torch.float64)
        rb.update_priorities(a, new)
        other.update_priorities(b, new)
    batch = make_rows([[(4, 6, 5, True), (5, 0, 3, False)]])
    rb.extend(batch)
    other.extend(batch)
    assert all(torch.equal(a, b) for a, b in zip(priorities_state(rb), priorities_state(other)))


def test_fresh_windows_mixed_in_have_weight_one_and_no_priority_update():
    rb = filled_replay()
    before = rb.priorities.priority.clone()
    online = unprioritized(make_rows([[(9, 0, 4, False)]]))
    assert (online["priority_weight"] == 1).all() and (online["write_index"] == -1).all()
    rb.update_priorities(online, torch.ones(1))
    assert torch.equal(rb.priorities.priority, before)


# ------------------------------------------------------------------ the losses


def test_window_priority_and_weighted_mean_against_a_loop():
    g = torch.Generator().manual_seed(0)
    value = torch.randn(4, 5, 1, generator=g)
    mask = torch.rand(4, 5, 1, generator=g) > 0.3
    mask[:, 0] = True
    weight = torch.rand(4, 1, 1, generator=g).expand(4, 5, 1)
    expected_priority, total, steps = [], 0.0, 0
    for b in range(4):  # reference loop over windows and steps
        real = [float(value[b, t]) for t in range(5) if mask[b, t]]
        expected_priority.append(sum(abs(v) for v in real) / len(real))
        total += float(weight[b, 0]) * sum(real)
        steps += len(real)
    torch.testing.assert_close(window_priority(value, mask), torch.tensor(expected_priority))
    torch.testing.assert_close(weighted_mean(value, mask, weight), torch.tensor(total / steps))


def test_reactor_priority_is_the_mean_td_error_and_weights_scale_each_window():
    """Row 1 of the window terminates, row 2 is truncated (both padded after): ``priority`` is each window's
    mean |Q^ret - Q(x, a)| over its real steps (the paper's Retrace, a loop per step); a weight per window scales
    that window's part of every loss term and of the gradient."""
    loss, nets, target, _ = make_loss()
    td, last = make_window()
    q, _, ret, _, _ = reference(td, last, nets.network, target, loss.hidden_keys, False)
    q_a = q.gather(-1, td["action"].unsqueeze(-1))[..., 0]
    out = loss(td)
    expected = [sum(abs(float(ret[b, t] - q_a[b, t])) for t in range(L + 1)) / (L + 1) for b, L in enumerate(last)]
    torch.testing.assert_close(out["priority"], torch.tensor(expected), rtol=1e-4, atol=1e-5)
    assert out["priority"].shape == (3,) and not out["priority"].requires_grad

    w = torch.tensor([0.5, 1.0, 0.25])
    weighted = td.clone()
    weighted["priority_weight"] = w.unsqueeze(-1).expand(td.shape)
    out_w = loss(weighted)
    n = td["mask"].sum()
    per_step = 0.5 * (ret - q_a) ** 2
    critic = sum(float(w[b]) * float(per_step[b, : L + 1].sum()) for b, L in enumerate(last)) / n
    torch.testing.assert_close(out_w["loss_critic"], critic, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out_w["priority"], out["priority"])
    ones = td.clone()
    ones["priority_weight"] = torch.ones(td.shape)
    for key in ("loss_critic", "loss_objective", "loss_entropy"):
        torch.testing.assert_close(loss(ones)[key], out[key])
    # gradients: a weight of 3 on every window triples the gradient of the whole objective
    grads = []
    for scale in (1.0, 3.0):
        batch = td.clone()
        batch["priority_weight"] = torch.full(td.shape, scale)
        loss.zero_grad()
        sum(v for k, v in loss(batch).items() if k.startswith("loss_")).backward()
        grads.append(torch.cat([p.grad.flatten() for p in loss.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], 3 * grads[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("algo", ["acer", "laser"])
def test_acer_and_laser_write_priorities_and_weight_every_loss_term(tmp_path, algo):
    """The other sequence losses honour the same contract: a ``[B]`` priority, detached and >= 0, and each
    loss term scaled by a window weight (twice the weight: twice the term), identical with weight 1."""
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer

    cfg = load_config(algo, [f"run_dir={tmp_path / 'run'}", "collector.workers=0", "replay.batch_size=8",
                             "replay.seq_len=6", "replay.min_size=64", "log.progress=false"])
    trainer = Trainer(cfg)
    trainer.fill_replay(64)
    batch = trainer.replay.sample_sequences(8, 6, trainer.loss.in_keys)
    out = trainer.loss(batch)
    assert out["priority"].shape == (8,) and (out["priority"] >= 0).all() and not out["priority"].requires_grad
    for scale in (1.0, 2.0):
        weighted = batch.clone()
        weighted["priority_weight"] = torch.full(batch.shape, scale)
        torch.manual_seed(0)
        out_w = trainer.loss(weighted)
        for key in ("loss_critic", "loss_objective", "loss_entropy"):
            torch.testing.assert_close(out_w[key], scale * out[key], rtol=1e-5, atol=1e-7)
    trainer.close()


# ------------------------------------------------------------------ settings and a run


def test_vracer_and_a_shared_replay_sweep_refuse_a_prioritized_replay(tmp_path):
    from acer_torchrl.config import ConfigError, load_config
    from acer_torchrl.shared_replay.sweep import SweepConfig, agent_configs

    with pytest.raises(ConfigError, match="replay.prioritized=true is not supported"):
        load_config("vracer", ["replay.prioritized=true"])
    with pytest.raises(ConfigError, match="shared-replay sweep's replay draws uniformly"):
        agent_configs(SweepConfig(), ["replay.prioritized=true", f"run_dir={tmp_path / 'sweep'}"])
    with pytest.raises(ConfigError, match="replay.prefetch=true: a shared-replay sweep's agents draw through"):
        agent_configs(SweepConfig(), ["replay.prefetch=true", f"run_dir={tmp_path / 'sweep'}"])


def test_a_sweep_says_the_keys_it_reads_nowhere(tmp_path, monkeypatch, capsys):
    """A sweep's command line gets the ``note:`` lines a run's does (it printed none)."""
    from acer_torchrl.shared_replay import sweep

    monkeypatch.setattr(sweep, "run_sweep", lambda *args: {})
    sweep.run(["network.lstm_hidden=32", "optim.alpha=0.9", f"run_dir={tmp_path / 'sweep'}"])
    notes = capsys.readouterr().err.splitlines()
    assert [n.split(" has no effect")[0] for n in notes] == ["note: network.lstm_hidden=32", "note: optim.alpha=0.9"]


@pytest.mark.integration
def test_reactor_recipe_runs_prioritized_and_records_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "recipes" / "reactor.py"), *TINY, "replay.seq_len=8", "replay.prioritized=true",
         "replay.priority_block=4", f"run_dir={run_dir}"],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    replay = yaml.safe_load((run_dir / "config.yaml").read_text())["replay"]
    assert replay["prioritized"] is True and replay["priority_block"] == 4
    links = torch.load(next(run_dir.glob("checkpoint*/replay/links.pt")), weights_only=True)
    assert links["assigned"].any(), "no window got a priority from the updates"
    header = (run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "priority" not in header and {"priority_weight_mean", "priority_weight_min"} <= set(header)


def test_an_update_records_how_far_the_draws_are_from_uniform(tmp_path):
    """The update's statistics (metrics.csv's columns) hold the mean and smallest importance weight of its windows
    (before, nothing in a run's record said that the replay was prioritized, or how much)."""
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer

    trainer = Trainer(load_config("reactor", [f"run_dir={tmp_path / 'run'}", "collector.workers=0", "replay.batch_size=8",
                                              "replay.seq_len=6", "replay.min_size=64", "log.progress=false",
                                              "replay.prioritized=true", "replay.priority_block=4"]))
    trainer.fill_replay(64)
    for _ in range(3):  # the first update assigns priorities: the next draws are not uniform
        batch = trainer.draw_batch(0.0)
        weight = batch["priority_weight"].clone()
        stats = trainer.update(batch)
    assert (stats["priority_weight_mean"], stats["priority_weight_min"]) == pytest.approx(
        (weight.mean().item(), weight.min().item()))
    assert stats["priority_weight_min"] < 1.0
    trainer.close()


@pytest.mark.parametrize("algo, share", [("acer", 0.0), ("laser", 0.0)])
def test_single_step_windows_are_drawn_by_priority_too(tmp_path, algo, share):
    """``replay.seq_len=1`` with a prioritized replay: the draws are windows of one step with their importance
    weights, and the updates write priorities back (a single-step draw used to take the uniform path, leaving
    ``replay.prioritized=true`` in the record and unused)."""
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer

    online = ["acer.replay_ratio=1"] if algo == "acer" else [f"laser.online_share={share}"]
    cfg = load_config(algo, [f"run_dir={tmp_path / 'run'}", "collector.workers=0", "replay.batch_size=8",
                             "replay.seq_len=1", "replay.min_size=64", "replay.prioritized=true",
                             "log.progress=false", *online])
    trainer = Trainer(cfg)
    trainer.fill_replay(64)
    batch = trainer.draw_batch(0.0)
    assert batch.shape == (8, 1) and "priority_weight" in batch.keys()
    assert not trainer.replay.priorities.assigned.any()
    trainer.update(batch)
    assert trainer.replay.priorities.assigned.sum() == len(set(batch.get("slot")[:, 0].tolist()))
    trainer.close()
