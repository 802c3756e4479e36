"""Environment construction: time limits, POMDP, dtypes, Atari preprocessing, errors, batched envs."""

import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from torchrl.modules import LSTMModule

from acer_torchrl.envs import EnvConfig, atari_vector_env, env_info, make_env, make_env_fn


def balance(td):
    """CartPole controller that keeps the pole up for a long while (push toward the fall)."""
    obs = td["observation"]
    td["action"] = (obs[..., 2] + 0.5 * obs[..., 3] > 0).long()
    return td


def test_cartpole_time_limit_is_truncation_not_termination():
    env = make_env(EnvConfig(max_episode_steps=25), seed=0)
    td = env.rollout(100, balance, break_when_any_done=True)
    assert td.shape == (25,)
    truncated, terminated = td["next", "truncated"].squeeze(-1), td["next", "terminated"].squeeze(-1)
    assert truncated[-1] and not terminated[-1] and td["next", "done"][-1]
    assert not truncated[:-1].any() and not terminated.any()
    assert td["next", "step_count"][-1].item() == 25
    env.close()


def test_cartpole_keeps_the_registered_time_limit_by_default():
    env = make_env(EnvConfig())
    assert env.base_env._env.spec.max_episode_steps == 500
    env.close()


@pytest.mark.integration
def test_ale_py_is_imported_only_when_an_atari_id_is_asked_for():
    """A fresh process: a CartPole env leaves ale-py unimported (~0.2 s in every worker); an Atari id that
    gymnasium does not know yet, in either of ale-py's namings, registers them on demand."""
    script = (
        "import sys\n"
        "from acer_torchrl.envs import EnvConfig, env_family, make_env\n"
        "make_env(EnvConfig('CartPole-v1')).close()\n"
        "assert 'ale_py' not in sys.modules, 'ale_py imported for CartPole'\n"
        "assert env_family('PongNoFrameskip-v4') == 'atari' and env_family('ALE/Breakout-v5') == 'atari'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_batched_env_resets_finished_games_only():
    """num_envs=3: each game ends and restarts on its own; counters, is_init and returns follow."""
    env = make_env(EnvConfig(num_envs=3, max_episode_steps=6), seed=1)
    assert env.batch_size == (3,)
    td = env.rollout(40, break_when_any_done=False)
    assert td.shape == (3, 40)
    done = td["next", "done"].squeeze(-1)
    truncated, terminated = td["next", "truncated"].squeeze(-1), td["next", "terminated"].squeeze(-1)
    count = td["next", "step_count"].squeeze(-1)
    assert (done == (truncated | terminated)).all()
    assert torch.equal(truncated, count == 6) and not (truncated & terminated).any()  # the limit truncates
    assert (count <= 6).all()
    is_init = td["is_init"].squeeze(-1)
    assert is_init[:, 0].all()
    assert torch.equal(is_init[:, 1:], done[:, :-1])  # a game restarts right after it ended, alone
    assert (td["step_count"].squeeze(-1)[is_init] == 0).all()
    # episode_reward is the running sum of rewards since the episode began
    reward = td["next", "reward"].squeeze(-1)
    ep = td["next", "episode_reward"].squeeze(-1)
    running = torch.zeros(3)
    for t in range(40):
        running = torch.where(is_init[:, t], torch.zeros(3), running) + reward[:, t]
        assert torch.allclose(ep[:, t], running)
    env.close()


def test_pomdp_cartpole_observes_x_and_theta_of_the_full_env():
    full = make_env(EnvConfig(), seed=7)
    pomdp = make_env(EnvConfig(pomdp=True), seed=7)
    assert env_info(EnvConfig(pomdp=True)).obs_shape == (2,)
    a = full.rollout(30, balance, break_when_any_done=False)
    b = pomdp.rollout(30, lambda td: td.set("action", a["action"][td["step_count"].item()]), break_when_any_done=False)
    assert b["observation"].shape == (30, 2)
    assert torch.equal(b["observation"], a["observation"][:, [0, 2]])
    assert torch.equal(b["next", "reward"], a["next", "reward"])
    full.close(), pomdp.close()


def test_mujoco_observations_are_float32_and_match_gymnasium():
    info = env_info(EnvConfig("Hopper-v5"))
    assert info.obs_shape == (11,) and info.obs_dtype == torch.float32 and not info.discrete
    assert info.action_dim == 3 and info.action_low == (-1.0,) * 3 and info.action_high == (1.0,) * 3
    env = make_env(EnvConfig("Hopper-v5"), seed=3)
    td = env.reset()
    gym_env = gym.make("Hopper-v5")
    gym_env.reset(seed=3)  # what make_env(seed=3) does; env.reset() above is the next episode
    raw, _ = gym_env.reset()
    assert raw.dtype == np.float64
    assert td["observation"].dtype == torch.float32
    assert torch.equal(td["observation"], torch.from_numpy(raw.astype(np.float32)))
    env.close()


@pytest.mark.parametrize("num_envs", [1, 2])
def test_continuous_actions_out_of_bounds_step_as_their_clipped_values(num_envs):
    """HalfCheetah-v5 charges -0.1 |a|^2 on the action it is given: unclipped, an action of 20 in each joint cost
    -240 a step and a policy whose mean strayed out of [-1, 1] scored -2.7e5 a game (LASER's first MuJoCo run). The
    env now steps 20 as 1; the collected action stays the policy's own."""
    rewards, actions = [], []
    for value in (20.0, 1.0):
        env = make_env(EnvConfig("HalfCheetah-v5", num_envs=num_envs), seed=0)
        td = env.reset()
        td["action"] = torch.full(env.action_spec.shape, value)
        td = env.step(td)
        rewards.append(td["next", "reward"])
        actions.append(td["action"])
        assert env.action_spec.space.high.max().item() == 1.0  # the bounds the policies read are kept
        env.close()
    torch.testing.assert_close(rewards[0], rewards[1])
    assert (rewards[1] > -1.0).all() and (actions[0] == 20.0).all()


def test_known_harmless_mujoco_warning_is_silenced(capfd):
    make_env(EnvConfig("HalfCheetah-v5", num_envs=2)).close()
    assert "settotalmass" not in capfd.readouterr().err


def test_classic_control_infos():
    assert env_info(EnvConfig("Acrobot-v1")) == env_info(EnvConfig("Acrobot-v1", num_envs=4))
    info = env_info(EnvConfig("Acrobot-v1"))
    assert info.discrete and info.num_actions == 3 and info.obs_shape == (6,)
    info = env_info(EnvConfig("Pendulum-v1"))
    assert not info.discrete and info.action_low == (-2.0,) and info.action_high == (2.0,)


def test_atari_pong_frames_are_uint8_stacks():
    info = env_info(EnvConfig("ALE/Pong-v5"))
    assert info.obs_shape == (4, 84, 84) and info.obs_dtype == torch.uint8
    assert info.discrete and info.num_actions == 6
    env = make_env(EnvConfig("ALE/Pong-v5"), seed=0)
    td = env.rollout(60, break_when_any_done=False)
    obs, nxt = td["observation"], td["next", "observation"]
    assert obs.shape == (60, 4, 84, 84) and obs.dtype == torch.uint8
    assert td["action"].dtype == torch.int64 and td["action"].shape == (60,)
    assert torch.equal(nxt[:, :3], obs[:, 1:])  # the stack shifts by one frame per step
    assert torch.equal(obs[1:], nxt[:-1])
    assert obs[-1, -1].float().std() > 0  # a real picture, not a blank frame
    env.close()
    assert env_info(EnvConfig("ALE/Pong-v5", frame_stack=1)).obs_shape == (1, 84, 84)


def test_the_atari_presets_evaluate_whole_games():
    """``ATARI_EPISODE_STEPS`` (the Atari presets' ``eval.max_steps``) is ALE's own episode limit in agent steps."""
    from acer_torchrl.envs import _register_atari
    from acer_torchrl.settings.env import ATARI_EPISODE_STEPS

    _register_atari()
    frames = gym.registry["ALE/Pong-v5"].kwargs["max_num_frames_per_episode"]
    assert ATARI_EPISODE_STEPS == frames // EnvConfig().frame_skip


def test_atari_noop_starts_and_frame_skip():
    """ale-py counts emulator frames: no-op starts add 0..noop_max frames, a step adds frame_skip."""
    venv = atari_vector_env(EnvConfig("ALE/Pong-v5", noop_max=0, frame_skip=3), num_envs=2)
    _, info = venv.reset(seed=0)
    assert (info["episode_frame_number"] == 0).all()
    _, _, _, _, info = venv.step(np.zeros(2, dtype=np.int64))
    assert (info["episode_frame_number"] == 3).all()
    venv.close()
    venv = atari_vector_env(EnvConfig("ALE/Pong-v5", noop_max=30), num_envs=8)
    _, info = venv.reset(seed=0)
    starts = info["episode_frame_number"]
    assert ((starts >= 0) & (starts <= 30)).all() and len(set(starts.tolist())) > 1
    venv.close()


def test_atari_explicit_reset_replaces_autoreset():
    """The premise of ManualResetAtariVectorEnv: after an explicit partial reset, the next step does not reset again."""
    venv = atari_vector_env(EnvConfig("ALE/Pong-v5", noop_max=0, max_episode_steps=3), num_envs=2)
    venv.reset(seed=0)
    for _ in range(3):
        _, _, terminated, truncated, info = venv.step(np.zeros(2, dtype=np.int64))
    assert truncated.all() and not terminated.any()
    _, info = venv.reset(options={"reset_mask": np.array([True, False])})
    assert info["episode_frame_number"][0] == 0
    _, _, _, _, info = venv.step(np.zeros(2, dtype=np.int64))
    assert info["episode_frame_number"][0] == 4  # one step into the new episode
    venv.close()


@pytest.mark.parametrize("episodic_life", [True, False])
def test_atari_episodic_life(episodic_life):
    """With episodic life a lost life ends the episode and the next one continues the game."""
    venv = atari_vector_env(EnvConfig("ALE/Breakout-v5", episodic_life=episodic_life, noop_max=0), num_envs=1)
    venv.reset(seed=0)
    rng = np.random.default_rng(0)
    ends = []  # (lives when the episode ended, lives and frame number after the reset)
    while not ends or ends[-1][2] != 0:
        _, _, terminated, truncated, info = venv.step(rng.integers(4, size=1))
        if terminated[0] or truncated[0]:
            _, after = venv.reset(options={"reset_mask": terminated | truncated})
            ends.append((info["lives"][0], after["lives"][0], after["episode_frame_number"][0]))
    if episodic_life:
        assert [e[0] for e in ends] == [4, 3, 2, 1, 0]
        assert all(before == after and frame > 0 for before, after, frame in ends[:-1])  # game goes on
    else:
        assert len(ends) == 1
    assert ends[-1][0] == 0 and ends[-1][1:] == (5, 0)  # game over: a new game
    venv.close()


def test_atari_truncation_batched():
    env = make_env(EnvConfig("ALE/Pong-v5", num_envs=2, max_episode_steps=10), seed=0)
    td = env.rollout(25, break_when_any_done=False)
    truncated, terminated = td["next", "truncated"].squeeze(-1), td["next", "terminated"].squeeze(-1)
    count = td["next", "step_count"].squeeze(-1)
    assert torch.equal(truncated, count == 10) and not terminated.any()
    assert truncated[:, 9].all() and truncated[:, 19].all()
    env.close()


def test_seeds():
    def first_obs(seed):
        env = make_env(EnvConfig(), seed=seed)
        obs = env.reset()["observation"]
        env.close()
        return obs

    assert torch.equal(first_obs(5), first_obs(5))
    assert not torch.equal(first_obs(5), first_obs(6))
    batched = make_env(EnvConfig(num_envs=2), seed=5).reset()["observation"]
    assert torch.equal(batched[0], first_obs(5)) and torch.equal(batched[1], first_obs(6))


@pytest.mark.parametrize(
    "name, match",
    [
        ("Foo-v0", r"unknown env.name 'Foo-v0': supported families are classic control .*MuJoCo v5.*ALE/Pong-v5"),
        ("CarRacing-v3", r"unknown env.name 'CarRacing-v3'"),
        ("Hopper-v4", r"env.name 'Hopper-v4': only MuJoCo v5 tasks are supported, use 'Hopper-v5'"),
    ],
)
def test_unknown_env_ids(name, match):
    with pytest.raises(ValueError, match=match):
        make_env(EnvConfig(name))


def test_config_errors():
    with pytest.raises(ValueError, match=r"env.pomdp=true is defined for CartPole-v1 only"):
        make_env(EnvConfig("Pendulum-v1", pomdp=True))
    with pytest.raises(ValueError, match=r"env.num_envs must be in \[1, 1024\], got 0"):
        make_env(EnvConfig(num_envs=0))
    with pytest.raises(ValueError, match=r"env.max_episode_steps must be >= 1 or none, got 0"):
        make_env(EnvConfig(max_episode_steps=0))


def test_extra_transforms_are_cloned_and_factories_pickle():
    lstm = LSTMModule(input_size=4, hidden_size=8, in_key="observation", out_key="core")
    primer = lstm.make_tensordict_primer()
    fn = make_env_fn(EnvConfig(), seed=0, extra_transforms=[primer])
    envs = [pickle.loads(pickle.dumps(fn))() for _ in range(2)]  # one primer list, two envs
    for env in envs:
        td = env.reset()
        assert td["recurrent_state_h"].shape == (1, 8) and td["recurrent_state_c"].shape == (1, 8)
        env.close()


def test_atari_episodic_life_restarts_the_game_when_its_frames_are_used_up():
    """A life lost on the step that also uses up the game's frames (``max_num_frames_per_episode``): ale-py calls
    it a termination, not a truncation, and restarts the game at the next step. The env must then reset (not skip
    the reset as for a plain lost life), so that every step's next stack is its own stack shifted by one frame:
    never a stack that jumps to another game's first frames (seed 5 met the case at step 540 before the fix)."""
    venv = atari_vector_env(EnvConfig("ALE/Breakout-v5", episodic_life=True, noop_max=30, max_episode_steps=60), num_envs=2)
    obs, _ = venv.reset(seed=5)
    rng = np.random.default_rng(0)
    used_up = jumps = 0
    for _ in range(1_200):
        following, _, terminated, truncated, info = venv.step(rng.integers(4, size=2))
        jumps += sum(not np.array_equal(following[e][:-1], obs[e][1:]) for e in range(2))
        done = terminated | truncated
        used_up += int((terminated & (info["episode_frame_number"] >= venv.max_frames) & (info["lives"] > 0)).sum())
        if done.any():
            reset_obs, _ = venv.reset(options={"reset_mask": done})
            following = np.where(done[:, None, None, None], reset_obs, following)
        obs = following
    venv.close()
    assert used_up >= 1 and jumps == 0
