"""Episode-aligned replay: linking, sequence sampling, whole-episode eviction, recurrent refresh, persistence."""

import json
import shutil

import pytest
import torch
from tensordict import TensorDict
from torchrl.modules import set_recurrent_mode

from acer_torchrl._torchrl_compat import stored_tensordict
from acer_torchrl.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from acer_torchrl.envs import EnvInfo
from acer_torchrl.estimates.slots import SlotEstimates
from acer_torchrl.modules import make_torso
from acer_torchrl.replay import _LINKS, LINK_BYTES, EpisodeReplay, OnlineWindows, write_index
from planted import plant_pickle


def make_rows(segments, obs_dim=3):
    """A collected batch [n_rows, T]: each row is a list of (traj_id, first_step, n_steps, ends_episode).

    "observation" encodes (traj_id, step) so tests can check what was gathered; ``("next", "observation")``
    is the next step's.
    """
    rows = []
    for row in segments:
        traj, step, done, init = [], [], [], []
        for tid, first, n, ends in row:
            traj += [tid] * n
            step += list(range(first, first + n))
            done += [False] * (n - 1) + [ends]
            init += [first == 0] + [False] * (n - 1)
        rows.append((traj, step, done, init))
    T = len(rows[0][0])
    assert all(len(r[0]) == T for r in rows)
    traj = torch.tensor([r[0] for r in rows])
    step = torch.tensor([r[1] for r in rows])
    done = torch.tensor([r[2] for r in rows]).unsqueeze(-1)
    return TensorDict(
        {
            "observation": encode(traj, step, obs_dim),
            ("next", "observation"): encode(traj, step + 1, obs_dim),
            "is_init": torch.tensor([r[3] for r in rows]).unsqueeze(-1),
            "step_count": step.unsqueeze(-1),
            ("collector", "traj_ids"): traj,
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "truncated"): torch.zeros_like(done),
            ("next", "reward"): torch.ones(*traj.shape, 1),
        },
        batch_size=traj.shape,
    )


def encode(traj, step, obs_dim=3):
    """The observation of ``step`` of trajectory ``traj``: (traj, step, features that differ per step)."""
    traj, step = traj.float(), step.float()
    return torch.stack([traj, step] + [torch.sin(1.3 * traj + 0.7 * step + i) for i in range(obs_dim - 2)], -1)


def check_sequences(sample):
    """Every real step of a sequence follows the previous one inside the same trajectory."""
    obs, mask = sample["observation"], sample["mask"]
    for b in range(obs.shape[0]):  # test-side reference loop
        real = obs[b][mask[b]]
        assert (real[:, 0] == real[0, 0]).all(), "sequence crosses an episode boundary"
        assert torch.equal(real[:, 1], real[0, 1] + torch.arange(real.shape[0]).float()), "steps out of order"
        assert not mask[b][mask[b].sum():].any(), "padding must come last"


def test_chunks_interleaved_across_batches_are_linked_in_order():
    rb = EpisodeReplay(1000, seed=0)
    # two envs; trajectory 1 continues in the next batch of the same row, 2 ends, 3 starts
    rb.extend(make_rows([[(1, 0, 6, False)], [(2, 0, 4, True), (3, 0, 2, False)]]))
    rb.extend(make_rows([[(1, 6, 6, True)], [(3, 2, 6, False)]]))
    assert len(rb) == 24
    sample = rb.sample_sequences(512, 8)
    check_sequences(sample)
    # a sequence starting at trajectory 1, step 4 runs through the batch boundary to step 11
    start = ((sample["observation"][:, 0, 0] == 1) & (sample["observation"][:, 0, 1] == 4)).nonzero()
    assert start.numel(), "sampler never drew that start (seeded)"
    row = sample[start[0, 0]]
    assert row["mask"].all() and torch.equal(row["observation"][:, 1], torch.arange(4, 12).float())
    # sequences of trajectory 2 (4 steps) are padded, never extended into trajectory 3
    short = sample[(sample["observation"][:, 0, 0] == 2) & (sample["observation"][:, 0, 1] == 0)]
    assert short.shape[0] > 0 and (short["mask"].sum(-1) == 4).all()


def check_next_observations(rb):
    """Every live step's ("next", "observation") is its own next observation, read from the successor
    or from the chunk end's copy."""
    steps = rb.gather(rb.alive.nonzero().squeeze(-1))
    traj, step = steps["observation"][:, 0], steps["observation"][:, 1]
    torch.testing.assert_close(steps["next", "observation"], encode(traj, step + 1), rtol=0, atol=0)
    return steps


@pytest.mark.parametrize("memmap", [False, True])
def test_observations_are_stored_once(tmp_path, memmap):
    rb = EpisodeReplay(40, seed=0, scratch_dir=tmp_path / "storage" if memmap else None)
    # trajectory 1 runs across batches (its first chunk end gets a successor later), 2 terminates,
    # 3 is still running at the end, 4 is cut by a truncation
    rb.extend(make_rows([[(1, 0, 6, False)], [(2, 0, 4, True), (3, 0, 2, False)]]))
    first_end = int(rb.end_entry.ge(0).nonzero()[0])
    rb.extend(make_rows([[(1, 6, 6, True)], [(3, 2, 6, False)]]))
    truncated = make_rows([[(4, 0, 5, True)]])
    truncated["next", "terminated"].zero_()
    truncated["next", "truncated"][:, -1] = True
    rb.extend(truncated)
    assert ("next", "observation") not in rb.buffer.storage._storage.keys(True)
    assert rb.end_entries_written == 6  # one per chunk: 1, 2, 3 | 1, 3 | 4
    assert rb.next[first_end] >= 0, "the first chunk end of trajectory 1 is linked to its successor"
    steps = check_next_observations(rb)
    assert len(steps) == 29
    picked = rb.sample_steps(16, keys=["observation", ("next", "observation")])
    torch.testing.assert_close(picked["next", "observation"], encode(picked["observation"][:, 0], picked["observation"][:, 1] + 1))
    seq = rb.sample_sequences(32, 5)
    last = seq["mask"].sum(-1) - 1  # padding repeats the last real step, so its next observation too
    torch.testing.assert_close(seq["next", "observation"][:, :, 1], seq["observation"][:, :, 1] + 1)
    assert last.min() >= 0
    # wrap the ring: overwritten episodes are evicted whole, the survivors still read their next observations
    rb.extend(make_rows([[(5, 0, 30, True)]]))
    check_next_observations(rb)
    rb.save(tmp_path / "saved")
    other = EpisodeReplay(40, seed=0, scratch_dir=tmp_path / "other" if memmap else None)
    other.load(tmp_path / "saved")
    assert other.successor_keys == ("observation",) and other.end_entries_written == rb.end_entries_written
    kept = check_next_observations(other)
    if memmap:  # a resumed run: a new process's replay on the scratch files the killed one left behind
        again = EpisodeReplay(40, seed=0, scratch_dir=tmp_path / "storage")
        again.load(tmp_path / "saved")
        assert (check_next_observations(again) == kept).all()


def test_trajectories_are_cut_where_the_collector_dropped_steps():
    """A batch that never arrives (TorchRL's async collector drops one when its queue stays full) must not
    be bridged: step 5 of trajectory 1 is not followed by step 12."""
    rb = EpisodeReplay(100, seed=0)
    rb.extend(make_rows([[(1, 0, 6, False)], [(2, 0, 6, False)]]))
    # steps 6-11 of trajectory 1 are lost, trajectory 2 goes on; trajectory 3's first 4 steps are lost too
    rb.extend(make_rows([[(1, 12, 6, True)], [(2, 6, 2, True), (3, 4, 4, False)]]))
    assert rb.steps_missing == 6 + 4
    obs = rb.gather(torch.arange(len(rb)))["observation"]
    linked = rb.next[: len(rb)] >= 0
    succ = obs[rb.next[: len(rb)][linked]]
    assert torch.equal(succ[:, 0], obs[linked][:, 0]) and torch.equal(succ[:, 1], obs[linked][:, 1] + 1)
    assert rb.num_episodes == 4  # 1 cut in two, 2 whole, 3
    check_sequences(rb.sample_sequences(256, 10))
    check_next_observations(rb)  # step 5's next observation is its own copy, not step 12's


def test_a_replay_saved_with_every_next_observation_still_loads(tmp_path):
    """Replays saved before observations were stored once hold ``("next", "observation")`` in full."""
    rb = EpisodeReplay(30, seed=0)
    rb.successor_keys = ()  # the old layout: nothing rebuilt, every next observation stored
    rb.extend(make_rows([[(1, 0, 12, True), (2, 0, 8, False)]]))
    assert ("next", "observation") in rb.buffer.storage._storage.keys(True)
    rb.save(tmp_path / "old")
    links = torch.load(tmp_path / "old" / "links.pt")
    del links["end_entry"]
    torch.save(links, tmp_path / "old" / "links.pt")
    counters = json.loads((tmp_path / "old" / "counters.json").read_text())
    (tmp_path / "old" / "counters.json").write_text(json.dumps({k: counters[k] for k in ("episodes_started", "steps_written")}))
    other = EpisodeReplay(30, seed=0)
    other.load(tmp_path / "old")
    assert other.successor_keys == ()
    other.extend(make_rows([[(2, 8, 4, True)]]))
    check_next_observations(other)


def test_loading_a_replay_runs_no_pickled_code(tmp_path):
    rb = EpisodeReplay(30, seed=0)
    rb.extend(make_rows([[(1, 0, 12, True), (2, 0, 8, False)]]))
    rb.save(tmp_path / "saved")
    marker = tmp_path / "pickle-ran"
    for place in ("buffer", "steps", "episode_ends"):  # where TorchRL's format keeps one, and beside our tensors
        plant_pickle(tmp_path / "saved" / place / "prefetch.pkl", marker)
    other = EpisodeReplay(30, seed=0)
    other.load(tmp_path / "saved")
    assert not marker.exists(), "loading the replay unpickled a planted file"
    check_next_observations(other)


def test_a_saved_replay_holds_its_filled_slots_only(tmp_path):
    capacity, obs_dim = 5000, 3
    rb = EpisodeReplay(capacity, seed=0)
    rb.extend(make_rows([[(1, 0, 12, True), (2, 0, 8, False)]], obs_dim=obs_dim))
    rb.save(tmp_path / "saved")
    saved_bytes = sum(f.stat().st_size for f in (tmp_path / "saved").rglob("*") if f.is_file())
    assert saved_bytes < capacity * obs_dim * 4, "the replay's data was saved at full capacity"
    assert (tmp_path / "saved" / "links.pt").stat().st_size < capacity * LINK_BYTES / 10, "links saved at full capacity"
    assert rb.saved_bytes() < capacity * LINK_BYTES / 10
    other = EpisodeReplay(capacity, seed=0)
    other.load(tmp_path / "saved")
    assert len(other) == len(rb)
    other.extend(make_rows([[(2, 8, 4, True)]], obs_dim=obs_dim))
    check_next_observations(other)


def test_a_replay_saved_with_every_slots_links_still_loads(tmp_path):
    """Checkpoints before the links were cut to the written slots hold ``[capacity]`` links and no ``capacity``:
    they load into the same replay, and one of another capacity is refused."""
    rb = EpisodeReplay(40, seed=0)
    rb.extend(make_rows([[(1, 0, 12, True), (2, 0, 8, False)]]))
    rb.save(tmp_path / "old")
    links = torch.load(tmp_path / "old" / "links.pt")
    fresh = EpisodeReplay(40, seed=0)
    for name in _LINKS:
        full = getattr(fresh, name).clone()
        full[: links[name].numel()] = links[name]
        links[name] = full
    del links["capacity"]
    torch.save(links, tmp_path / "old" / "links.pt")
    other = EpisodeReplay(40, seed=0)
    other.load(tmp_path / "old")
    for name in ("episode", "next", "alive", "end_entry"):
        assert torch.equal(getattr(other, name), getattr(rb, name))
    other.extend(make_rows([[(2, 8, 4, True)]]))
    check_next_observations(other)
    with pytest.raises(ValueError, match="holds 40 steps but replay.capacity=30"):
        EpisodeReplay(30, seed=0).load(tmp_path / "old")


def test_the_sampled_starts_are_the_alive_slots_before_and_after_the_replay_wraps():
    rb = EpisodeReplay(30, seed=0)
    rb.extend(make_rows([[(1, 0, 12, True), (2, 0, 8, False)]]))
    assert torch.equal(rb.alive_slots(), rb.alive.nonzero().squeeze(-1)) and rb.alive_slots().numel() == 20
    rb.extend(make_rows([[(2, 8, 4, True), (3, 0, 12, True)]]))  # 36 steps written: episode 1's slots reused
    assert torch.equal(rb.alive_slots(), rb.alive.nonzero().squeeze(-1))


def test_eviction_is_whole_oldest_episodes_first():
    rb = EpisodeReplay(20, seed=0)
    rb.extend(make_rows([[(1, 0, 8, True), (2, 0, 4, True)]]))
    rb.extend(make_rows([[(3, 0, 6, False)]]))  # 18 slots used
    rb.extend(make_rows([[(3, 6, 4, True)]]))  # wraps: overwrites 2 slots of episode 1
    alive_eps = set(rb.sample_steps(2000)["observation"][:, 0].long().tolist())
    assert alive_eps == {2, 3}, "an episode with an overwritten step must be gone entirely"
    assert len(rb) == 4 + 10
    check_sequences(rb.sample_sequences(256, 5))


def test_single_steps_and_episode_slots():
    rb = EpisodeReplay(100, seed=0)
    rb.extend(make_rows([[(5, 0, 7, True), (6, 0, 3, False)]]))
    steps = rb.sample_steps(64)
    assert steps.shape == (64,)
    idx, mask = rb.episode_slots(steps["slot"])
    eps = rb.gather(idx)["observation"]
    for b in range(64):
        real = eps[b][mask[b]]
        assert (real[:, 0] == steps["observation"][b, 0]).all()
        assert torch.equal(real[:, 1], torch.arange(real.shape[0]).float())
        assert real.shape[0] == (7 if steps["observation"][b, 0] == 5 else 3)


def test_steps_with_selected_keys_equal_the_full_steps():
    rb = EpisodeReplay(100, seed=0)
    rb.extend(make_rows([[(5, 0, 7, True), (6, 0, 3, False)]]))
    steps = rb.sample_steps(32, keys=["observation", ("next", "reward"), "not_stored"])
    assert set(steps.keys(True, True)) == {"observation", ("next", "reward"), "slot", "write_index"}
    full = rb.gather(steps["slot"])
    assert torch.equal(steps["observation"], full["observation"])
    assert torch.equal(steps["next", "reward"], full["next", "reward"])


def test_sampled_steps_carry_the_write_that_stored_them():
    """``write_index``: the w-th step ever written went to slot w mod capacity; a later reader compares it with
    the last write into the slot to tell a replaced step (V-RACER in a sweep)."""
    rb = EpisodeReplay(8, seed=0)
    rb.extend(make_rows([[(1, 0, 5, True)]]))
    rb.extend(make_rows([[(2, 0, 8, False)]]))  # 13 writes: slots 0-4 twice (writes 8-12)
    steps = rb.sample_steps(64)
    expected = torch.where(steps["slot"] < 5, steps["slot"] + 8, steps["slot"])
    assert torch.equal(steps["write_index"], expected)
    assert write_index(torch.arange(8), 3, 8).tolist() == [0, 1, 2, -5, -4, -3, -2, -1]  # slots 3-7: never


def test_slot_estimates_see_exactly_the_slots_written_since_their_last_look():
    """A loss's per-slot estimates (V-RACER's) learn which steps are new from the replay's write counter: the
    slots written since the last sync, round robin past the end, alive ones only; what it wrote elsewhere stays."""
    rb = EpisodeReplay(10, seed=0)
    est = SlotEstimates()
    assert est.sync(rb).tolist() == [] and est.sync(rb) is None  # an empty replay, then nothing new
    rb.extend(make_rows([[(1, 0, 6, True)]]))
    new = est.sync(rb)
    assert new.tolist() == [0, 1, 2, 3, 4, 5] and est.sync(rb) is None
    est.write(new, value=torch.arange(6.0).unsqueeze(-1))
    rb.extend(make_rows([[(2, 0, 3, False)]]))
    assert est.sync(rb).tolist() == [6, 7, 8]
    rb.extend(make_rows([[(2, 3, 4, True)]]))  # slots 9, 0, 1, 2: episode 1 (slots 0-5) is evicted whole
    assert est.sync(rb).tolist() == [9, 0, 1, 2]
    assert est.links.alive.tolist() == [True] * 3 + [False] * 3 + [True] * 4
    assert est.read("value", torch.tensor([3, 4, 5])).tolist() == [3.0, 4.0, 5.0]  # written back, not re-synced
    rb.extend(make_rows([[(4, 0, 5, True)]]))
    rb.extend(make_rows([[(5, 0, 5, True)]]))  # a whole capacity written between two looks: every slot is new
    assert est.sync(rb).tolist() == [3, 4, 5, 6, 7, 8, 9, 0, 1, 2]


def lstm_torso():
    info = EnvInfo(obs_shape=(3,), obs_dtype=torch.float32, discrete=True, num_actions=2)
    return make_torso(info, [8], "tanh", lstm_hidden=6)


def test_refresh_equals_full_unroll_and_zero_at_episode_start():
    torch.manual_seed(0)
    torso = lstm_torso()
    rb = EpisodeReplay(500, seed=1)
    # episode 1 spans three batches interleaved with others; stored hidden states are garbage
    for segs in ([[(1, 0, 9, False)], [(2, 0, 9, True)]], [[(1, 9, 9, False)], [(3, 0, 9, False)]],
                 [[(1, 18, 9, True)], [(3, 9, 9, True)]]):
        batch = make_rows(segs)
        for key in torso.hidden_keys:
            batch[key] = torch.randn(*batch.shape, 1, 6)
        rb.extend(batch)
    sample = rb.sample_sequences(64, 5)
    with set_recurrent_mode(True):
        rb.refresh_recurrent_state(sample, torso.module, torso.hidden_keys)
        # reference: unroll each whole episode from a zero state, one episode at a time
        for b in range(sample.shape[0]):
            tid, t0 = sample["observation"][b, 0, :2].long().tolist()
            if t0 == 0:
                for key in torso.hidden_keys:
                    assert (sample[key][b, 0] == 0).all()
                continue
            idx, mask = rb.episode_slots(sample["slot"][b, :1])
            episode = rb.gather(idx[:, :t0])  # the t0 steps before the sequence's start
            assert (episode["observation"][0, :, 1] == torch.arange(t0)).all()
            episode["is_init"] = torch.zeros(1, t0, 1, dtype=torch.bool)
            episode["is_init"][0, 0] = True
            for key in torso.hidden_keys:
                episode[key] = torch.zeros(1, t0, 1, 6)
            out = torso.module(episode.select("observation", "is_init", *torso.hidden_keys))
            for key in torso.hidden_keys:  # the LSTM writes its final state at the last step
                torch.testing.assert_close(sample[key][b, 0], out["next", key][0, -1], atol=1e-5, rtol=0)
    starts = sample["observation"][:, 0, 1] == 0
    assert starts.any() and (~starts).any()
    assert (sample["recurrent_state_h"][starts, 0] == 0).all()


def test_save_load_round_trip(tmp_path):
    rb = EpisodeReplay(30, seed=3)
    rb.extend(make_rows([[(1, 0, 12, True), (2, 0, 8, False)]]))
    rb.extend(make_rows([[(2, 8, 15, True)]]))
    rb.save(tmp_path / "replay")
    other = EpisodeReplay(30, seed=99)
    other.load(tmp_path / "replay")
    assert len(other) == len(rb) and other.steps_written == rb.steps_written
    a, b = rb.sample_sequences(16, 6), other.sample_sequences(16, 6)
    assert torch.equal(a["observation"], b["observation"]) and torch.equal(a["mask"], b["mask"])


def replay_state(rb):
    """Everything a resumed replay must get back: its stored rows, the chunk ends' next observations, the
    links, the counters and the sampler's generator."""
    rows = stored_tensordict(rb.buffer.storage)[: min(rb.steps_written, rb.capacity)]
    ends = stored_tensordict(rb.episode_ends)[: min(rb.end_entries_written, rb.capacity)]
    counters = (rb.episodes_started, rb.steps_written, rb.end_entries_written, rb.steps_missing, rb.successor_keys)
    return rows, ends, [getattr(rb, name) for name in _LINKS], counters, rb.generator.get_state()


def assert_same_bits(a, b):
    """Two replays' :func:`replay_state` equal bit for bit (every key, dtype and value)."""
    (rows_a, ends_a, links_a, counters_a, gen_a), (rows_b, ends_b, links_b, counters_b, gen_b) = a, b
    for td_a, td_b in ((rows_a, rows_b), (ends_a, ends_b)):
        assert set(td_a.keys(True, True)) == set(td_b.keys(True, True))
        for key, value in td_a.items(True, True):
            assert value.dtype == td_b.get(key).dtype and torch.equal(value, td_b.get(key)), key
    assert all(torch.equal(x, y) for x, y in zip(links_a, links_b)) and counters_a == counters_b
    assert torch.equal(gen_a, gen_b)


@pytest.mark.parametrize("memmap", [False, True], ids=["in-RAM", "memmap"])
def test_a_checkpointed_replay_comes_back_bit_for_bit(tmp_path, memmap):
    """save_checkpoint / load_checkpoint: the stored rows, links, counters and sampling state of a wrapped ring
    (evicted episodes, a running trajectory, chunk ends) come back exactly; both replays then sample and
    store alike."""
    rb = EpisodeReplay(40, seed=3, scratch_dir=tmp_path / "a" if memmap else None)
    rb.extend(make_rows([[(1, 0, 12, True), (2, 0, 8, False)]]))
    rb.extend(make_rows([[(2, 8, 15, True), (3, 0, 10, False)]]))
    rb.extend(make_rows([[(3, 10, 6, False), (4, 0, 6, True)]]))
    rb.sample_sequences(8, 4)  # the generator moves on from its seed
    save_checkpoint(tmp_path, {"w": torch.arange(3.0)}, {"env_steps": 68}, rb)
    other = EpisodeReplay(40, seed=99, scratch_dir=tmp_path / "b" if memmap else None)
    state, counters = load_checkpoint(tmp_path, other)
    assert torch.equal(state["w"], torch.arange(3.0)) and counters == {"env_steps": 68}
    assert_same_bits(replay_state(rb), replay_state(other))
    a, b = rb.sample_sequences(16, 6), other.sample_sequences(16, 6)
    assert all(torch.equal(v, b.get(k)) for k, v in a.items(True, True))
    for replay in (rb, other):  # open trajectories end at a checkpoint: new ids on both sides
        replay._open.clear()
        replay.extend(make_rows([[(5, 0, 9, True)]]))
    assert_same_bits(replay_state(rb), replay_state(other))


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_replay_column_is_refused_in_one_line(tmp_path, damage):
    rb = EpisodeReplay(40, seed=0)
    rb.extend(make_rows([[(1, 0, 12, True), (2, 0, 8, False)]]))
    save_checkpoint(tmp_path, {}, {}, rb)
    column = tmp_path / "checkpoint" / "replay" / "steps" / "observation.bin"
    data = bytearray(column.read_bytes())
    data[len(data) // 2] ^= 1
    column.write_bytes(data if damage == "flipped byte" else data[:-4])
    message = "fails its checksum" if damage == "flipped byte" else f"holds {len(data) - 4} bytes"
    with pytest.raises(CheckpointError, match=f"replay/steps/observation.bin {message}") as err:
        load_checkpoint(tmp_path, EpisodeReplay(40, seed=0))
    assert "\n" not in str(err.value)


def test_a_replay_saved_as_memory_mapped_tensordicts_still_loads(tmp_path):
    """Checkpoints written before the rows were raw column files hold TensorDict.memmap directories."""
    rb = EpisodeReplay(30, seed=0)
    rb.extend(make_rows([[(1, 0, 12, True), (2, 0, 8, False)]]))
    rb.save(tmp_path / "old")
    for name, storage, rows in (("steps", rb.buffer.storage, 20), ("episode_ends", rb.episode_ends, 2)):
        shutil.rmtree(tmp_path / "old" / name)
        stored_tensordict(storage)[:rows].memmap(tmp_path / "old" / name)
    other = EpisodeReplay(30, seed=0)
    other.load(tmp_path / "old")
    assert_same_bits(replay_state(rb), replay_state(other))


def test_online_windows_cut_rows_and_take_freshest():
    online = OnlineWindows(seq_len=4)
    online.push(make_rows([[(1, 0, 10, False)]]))
    online.push(make_rows([[(2, 0, 8, False)], [(3, 0, 8, False)]]))
    assert online.latest.shape == (4, 4)
    taken = online.take(5)
    assert taken["observation"][:4, 0, 0].tolist() == [2, 2, 3, 3]
    assert taken["observation"][4, 0, 0] == 1
    first = online.batches[1]  # 10 steps -> 3 windows, the last with 2 padding steps
    assert first.shape == (3, 4) and first["mask"].sum() == 10 and not first["mask"][2, 2:].any()
    assert taken["observation"][4, :, 1].tolist() == [8, 9, 9, 9], "of a batch taken in part, its latest window"
    online.push(make_rows([[(4, 0, 16, False)], [(5, 0, 16, False)]]))  # 2 envs x 4 windows
    assert [w[0].tolist() for w in online.take(3)["observation"][:, :, :2]] == [[4, 12], [5, 12], [4, 8]]
    assert online.take(8)["observation"][:, 0, :2].tolist() == [[4, s] for s in (0, 4, 8, 12)] + [[5, s] for s in (0, 4, 8, 12)]


def stacked(batch, k):
    """``batch`` (from :func:`make_rows`) with each observation a stack of the last ``k`` frames of its trajectory,
    as ale-py stacks them: frame ``s`` of trajectory ``i`` encodes ``(i, s)`` and the frames before step 0 are
    the previous game's, as after a lost life. Now and then (every 23 steps) a step's next observation is a new
    stack, not its own shifted by one frame, as when ale-py restarts a game: the frames' era changes."""
    traj, step = batch["collector", "traj_ids"], batch["step_count"].squeeze(-1)
    back = torch.arange(-k + 1, 1)

    def stacks(at):
        era = (at + 7 * traj) // 23
        frames = at.unsqueeze(-1) + back + 1000 * era.unsqueeze(-1)
        return encode(traj.unsqueeze(-1).expand(*frames.shape), frames, obs_dim=4)

    batch["observation"] = stacks(step)
    batch["next", "observation"] = stacks(step + 1)
    return batch


def random_batches(n, seed, k=4, rows=3, T=10):
    """``n`` collected batches of ``rows`` envs x ``T`` steps with episodes that end (terminated) mid-row, run
    across batches, and a dropped batch (a gap in ``step_count``) now and then."""
    g = torch.Generator().manual_seed(seed)
    state = [[r * 1000, 0] for r in range(rows)]  # per env: its trajectory id, its next step
    for _ in range(n):
        segments = []
        for env in range(rows):
            row, left = [], T
            while left:
                tid, first = state[env]
                if torch.rand((), generator=g) < 0.1:  # a batch the collector dropped: the steps jump
                    first += 7
                length = min(left, int(torch.randint(1, 15, (), generator=g)))
                ends = bool(torch.rand((), generator=g) < 0.4) and length == left or length < left
                row.append((tid, first, length, ends))
                state[env] = [tid + 1, 0] if ends else [tid, first + length]
                left -= length
            segments.append(row)
        yield stacked(make_rows(segments), k)


@pytest.mark.parametrize("frame_ring", ["default", "tight"])
@pytest.mark.parametrize("frames", ["float", "bytes"])
def test_frames_stored_once_give_back_the_collected_stacks(monkeypatch, frame_ring, frames):
    """A replay with a frame store returns, for every stored step it can still sample, the very observation and
    next observation that were collected (bit for bit, checked against a replay that keeps the stacks), while
    the ring wraps several times; a tight frame ring evicts episodes whose frames it overwrote, never more than
    that, and never serves a frame written over. ``bytes``: each frame as uint8 (16 bytes), the Atari frames' dtype,
    whose stacks the frame store compares as 8-byte words."""
    if frame_ring == "tight":  # the frame ring laps before the step ring: its evictions are the ones tested
        monkeypatch.setattr("acer_torchrl.replay.frame_capacity", lambda steps, stack: steps + 12)
    k, capacity = 4, 90
    plain, framed = EpisodeReplay(capacity, seed=0), EpisodeReplay(capacity, seed=0, frame_stack=k)
    evicted_by_frames = breaks = 0
    for batch in random_batches(40, seed=1, k=k):
        if frames == "bytes":
            for key in ("observation", ("next", "observation")):
                batch[key] = batch[key].contiguous().view(torch.uint8)
        plain.extend(batch.clone())
        framed.extend(batch.clone())
        alive = framed.alive_slots()
        assert set(alive.tolist()) <= set(plain.alive_slots().tolist())
        evicted_by_frames += plain.alive_slots().numel() - alive.numel()
        a = framed.gather(alive, ["observation", ("next", "observation")])
        b = plain.gather(alive, ["observation", ("next", "observation")])
        assert torch.equal(a["observation"], b["observation"])
        assert torch.equal(a["next", "observation"], b["next", "observation"])
        # a learner on another device gets each distinct frame moved once and expanded there; "cpu:0" is not
        # "cpu" to torch.device's comparison, so this draw takes the path of a GPU learner's
        moved = framed.gather(alive, ["observation", ("next", "observation")], device=torch.device("cpu", 0))
        assert torch.equal(moved["observation"], a["observation"])
        assert torch.equal(moved["next", "observation"], a["next", "observation"])
        shifted = (a["next", "observation"][:, :-1] == a["observation"][:, 1:]).flatten(1).all(1)
        breaks += int((~shifted).sum())
    assert framed.steps_written > 4 * capacity and breaks > 0
    assert (evicted_by_frames > 0) == (frame_ring == "tight")
    assert "observation" not in framed.buffer.storage._storage.keys()
    seq = framed.sample_sequences(8, 5, ["observation", ("next", "observation"), "step_count"])
    assert seq["observation"].shape == (8, 5, k, 16 if frames == "bytes" else 4)


@pytest.mark.parametrize("memmap", [False, True])
def test_frame_store_survives_save_and_load(tmp_path, memmap):
    k = 4
    rb = EpisodeReplay(60, seed=0, frame_stack=k, scratch_dir=tmp_path / "a" if memmap else None)
    for batch in random_batches(12, seed=2, k=k):
        rb.extend(batch)
    rb.save(tmp_path / "saved")
    other = EpisodeReplay(60, seed=0, frame_stack=k, scratch_dir=tmp_path / "b" if memmap else None)
    other.load(tmp_path / "saved")
    a, b = rb.sample_sequences(16, 6), other.sample_sequences(16, 6)
    assert torch.equal(a["observation"], b["observation"]) and torch.equal(a["next", "observation"], b["next", "observation"])
    for batch in random_batches(3, seed=3, k=k):  # after a resume every trajectory starts anew
        rb.extend(batch.clone())
        other.extend(batch.clone())
    alive = rb.alive_slots()
    assert torch.equal(alive, other.alive_slots())
    assert torch.equal(rb.gather(alive)["observation"], other.gather(alive)["observation"])
    plain = EpisodeReplay(60, seed=0)
    with pytest.raises(ValueError, match="frame_stack"):
        plain.load(tmp_path / "saved")


def test_frame_store_refuses_observations_that_are_not_stacks():
    rb = EpisodeReplay(60, seed=0, frame_stack=3)
    with pytest.raises(ValueError, match="stacks of 3 frames"):
        rb.extend(next(random_batches(1, seed=0, k=4)))


class _RandomActions(torch.nn.Module):
    """Uniform random actions for a batch of stacked frames."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, observation):
        return torch.randint(self.n, observation.shape[:-3])


@pytest.mark.integration
def test_real_atari_stacks_come_back_from_the_frame_store():
    """ale-py's stacks as a real collector collects them (Breakout, episodic life: a new episode's first stack
    holds the lost life's frames; 60-step truncations; two games a worker) come back from the frame store bit
    for bit, observation and next observation, while the ring wraps."""
    from tensordict.nn import TensorDictModule

    from acer_torchrl.collectors import make_collector
    from acer_torchrl.config import EnvConfig
    from acer_torchrl.envs import make_env_fn

    torch.manual_seed(0)
    cfg = EnvConfig("ALE/Breakout-v5", num_envs=2, episodic_life=True, max_episode_steps=60)
    policy = TensorDictModule(_RandomActions(4), in_keys=["observation"], out_keys=["action"])
    collector = make_collector(make_env_fn(cfg, seed=0), policy, num_workers=0, frames_per_batch=2 * 25, total_frames=1_500)
    plain, framed = EpisodeReplay(400, seed=0), EpisodeReplay(400, seed=0, frame_stack=4)
    ends = 0
    for batch in collector:
        ends += int(batch["next", "done"].sum())
        plain.extend(batch.clone())
        framed.extend(batch.clone())
        alive = framed.alive_slots()
        a = framed.gather(alive, ["observation", ("next", "observation")])
        b = plain.gather(alive, ["observation", ("next", "observation")])
        assert torch.equal(a["observation"], b["observation"])
        assert torch.equal(a["next", "observation"], b["next", "observation"])
    collector.shutdown()
    assert ends >= 10 and framed.steps_written == 1_500
    assert a["observation"].dtype == torch.uint8 and a["observation"].shape[1:] == (4, 84, 84)
