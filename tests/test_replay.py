"""Episode-aligned replay: linking, sequence sampling, whole-episode eviction, recurrent refresh, persistence."""

import torch
from tensordict import TensorDict
from torchrl.modules import set_recurrent_mode

from acer_torchrl.envs import EnvInfo
from acer_torchrl.modules import make_torso
from acer_torchrl.replay import EpisodeReplay, OnlineWindows


def make_rows(segments, obs_dim=3):
    """A collected batch [n_rows, T]: each row is a list of (traj_id, first_step, n_steps, ends_episode).

    "observation" encodes (traj_id, step) so tests can check what was gathered.
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
    obs = torch.stack([traj.float(), step.float()] + [torch.randn(traj.shape) for _ in range(obs_dim - 2)], -1)
    done = torch.tensor([r[2] for r in rows]).unsqueeze(-1)
    return TensorDict(
        {
            "observation": obs,
            "is_init": torch.tensor([r[3] for r in rows]).unsqueeze(-1),
            ("collector", "traj_ids"): traj,
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "truncated"): torch.zeros_like(done),
            ("next", "reward"): torch.ones(*traj.shape, 1),
        },
        batch_size=traj.shape,
    )


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
    assert set(steps.keys(True, True)) == {"observation", ("next", "reward"), "slot"}
    full = rb.gather(steps["slot"])
    assert torch.equal(steps["observation"], full["observation"])
    assert torch.equal(steps["next", "reward"], full["next", "reward"])


def test_update_writes_values_back_into_storage():
    rb = EpisodeReplay(50, seed=0)
    batch = make_rows([[(1, 0, 5, True)]])
    batch["value"] = torch.zeros(1, 5, 1)
    slots = rb.extend(batch)
    rb.update(slots[1:3], TensorDict({"value": torch.tensor([[2.0], [3.0]])}, [2]))
    assert rb.gather(slots)["value"].flatten().tolist() == [0, 2, 3, 0, 0]
    assert rb.column("value").flatten().tolist() == [0, 2, 3, 0, 0]


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
