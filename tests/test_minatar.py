"""MinAtar (Young & Tian 2019) on real games: channel-first uint8 grids, action sets, the time limit, sticky
actions, MinAtar's encoder, each ``preset=minatar`` end to end, and the one-line error without minatar."""

import json
import sys

import gymnasium as gym
import pytest
import torch

from acer_torchrl.cli import run
from acer_torchrl.config import ConfigError
from acer_torchrl.envs import MINATAR_MAX_EPISODE_STEPS, EnvConfig, EnvInfo, env_info, make_env
from acer_torchrl.modules import MinAtarCNN, make_encoder, make_torso
from acer_torchrl.algorithms import reactor

BREAKOUT = "MinAtar/Breakout-v1"


def test_observations_are_channel_first_uint8_grids():
    env = make_env(EnvConfig(name=BREAKOUT), seed=0)
    spec = env.observation_spec["observation"]
    assert spec.shape == (4, 10, 10) and spec.dtype == torch.uint8  # Breakout: 4 channels
    td = env.rollout(20)
    obs = td["observation"]
    assert obs.shape == (td.shape[0], 4, 10, 10) and obs.dtype == torch.uint8
    assert set(obs.unique().tolist()) == {0, 1}
    raw = env.base_env._env.unwrapped.game.state()  # [10, 10, C] bools
    assert torch.equal(td["next", "observation"][-1], torch.from_numpy(raw).permute(2, 0, 1).to(torch.uint8))
    env.close()


@pytest.mark.parametrize("game, v1_actions", [("Breakout", 3), ("Seaquest", 6), ("SpaceInvaders", 4)])
def test_v1_has_the_minimal_action_set_and_v0_all_six(game, v1_actions):
    assert env_info(EnvConfig(name=f"MinAtar/{game}-v1")).num_actions == v1_actions
    assert env_info(EnvConfig(name=f"MinAtar/{game}-v0")).num_actions == 6


def test_time_limit_truncates_and_defaults_to_minatar_limit():
    env = make_env(EnvConfig(name="MinAtar/Freeway-v1", max_episode_steps=20), seed=0)  # Freeway: no early end
    td = env.rollout(100, break_when_any_done=True)
    assert td.shape == (20,)
    assert td["next", "truncated"][-1] and not td["next", "terminated"].any()
    env.close()
    env = make_env(EnvConfig(name=BREAKOUT))
    assert env.base_env._env.spec.max_episode_steps == MINATAR_MAX_EPISODE_STEPS
    env.close()


@pytest.mark.parametrize("rap, expected", [(None, 0.1), (0.0, 0.0)])
def test_sticky_actions_are_minatars_unless_set(rap, expected):
    env = make_env(EnvConfig(name=BREAKOUT, repeat_action_probability=rap))
    assert env.base_env._env.unwrapped.game.sticky_action_prob == expected
    env.close()


def test_batched_minatar_envs_and_the_encoder_on_their_frames():
    env = make_env(EnvConfig(name=BREAKOUT, num_envs=3), seed=0)
    td = env.rollout(8, break_when_any_done=False)
    assert td["observation"].shape == (3, 8, 4, 10, 10)
    info = EnvInfo((4, 10, 10), torch.uint8, discrete=True, num_actions=3)
    assert make_encoder(info, [64], "relu")(td["observation"]).shape == (3, 8, 128)
    env.close()


def test_encoder_is_the_papers_network():
    """One 3x3 convolution, 16 filters, stride 1, no padding (10x10 -> 8x8), then 128 ReLU units."""
    info = EnvInfo((7, 10, 10), torch.uint8, discrete=True, num_actions=3)  # Freeway's 7 channels
    encoder = make_encoder(info, [64], "relu")
    assert isinstance(encoder, MinAtarCNN) and isinstance(reactor.make_encoder(info, [64]), MinAtarCNN)
    conv, linear = encoder.conv[0], encoder.fc[0]
    assert conv.kernel_size == (3, 3) and conv.stride == (1, 1) and conv.padding == (0, 0)
    assert sum(p.numel() for p in conv.parameters()) == 3 * 3 * 7 * 16 + 16
    assert sum(p.numel() for p in linear.parameters()) == 16 * 8 * 8 * 128 + 128
    assert sum(p.numel() for p in encoder.parameters()) == 1024 + 131_200
    assert make_torso(info, [64], "relu", lstm_hidden=32).out_dim == 32  # the LSTM core may follow


@pytest.mark.filterwarnings("error:No target network updater")  # every target copy a loss has, the trainer updates
@pytest.mark.parametrize("algo", ["acer", "reactor", "laser"])
def test_minatar_preset_runs_and_evaluates(tmp_path, algo):
    summary = run(algo, ["preset=minatar", f"run_dir={tmp_path}", "total_frames=300", "collector.workers=0",
                         "replay.min_size=100", "eval.episodes=1", "eval.max_steps=50", "log.progress=false"])
    assert summary["env"] == BREAKOUT and summary["env_steps"] >= 300
    assert json.loads((tmp_path / "summary.json").read_text())["env"] == BREAKOUT
    columns = json.loads((tmp_path / "checkpoint" / "replay" / "steps" / "columns.json").read_text())["columns"]
    stored = next(c for c in columns if c["key"] == ["observation"])
    assert stored["dtype"] == "uint8" and stored["shape"] == [4, 10, 10]  # the replay keeps uint8 grids


def test_missing_minatar_is_one_line_naming_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "minatar", None)  # `import minatar` now fails as if not installed
    monkeypatch.delitem(sys.modules, "minatar.gym", raising=False)
    for name in [name for name in gym.registry if name.startswith("MinAtar/")]:
        monkeypatch.delitem(gym.registry, name)
    with pytest.raises(ConfigError) as err:
        run("acer", [f"run_dir={tmp_path}", f"env.name={BREAKOUT}"])
    assert str(err.value) == "MinAtar envs need the minatar package: pip install minatar"
    assert not (tmp_path / "config.yaml").exists()
