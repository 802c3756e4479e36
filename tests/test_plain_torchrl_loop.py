"""The losses outside this project's pipeline: ``acer_torchrl.objectives`` imports nothing of the package
but itself, and :class:`~acer_torchrl.objectives.laser.LASERLoss` trains CartPole from a plain TorchRL loop
(TorchRL's own collector and replay buffer, no config, trainer or replay of this project)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import ExplorationType, GymEnv, RewardSum, TransformedEnv
from torchrl.modules import ProbabilisticActor

from acer_torchrl.objectives import LASERLoss


@pytest.mark.integration
def test_the_losses_import_nothing_of_the_package_outside_objectives():
    names = ("acer", "laser", "reactor", "vracer", "functional", "refer", "common", "names", "network_call")
    modules = ", ".join(f"acer_torchrl.objectives.{m}" for m in names)
    code = (f"import sys, {modules}; "
            "print(sorted(m for m in sys.modules if m.startswith('acer_torchrl.') and not m.startswith('acer_torchrl.objectives')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    check = "import sys, acer_torchrl.objectives.acer, acer_torchrl.trainer; print('acer_torchrl.trainer' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout.strip() == "True"


@pytest.mark.slow
@pytest.mark.learning
def test_laser_loss_learns_cartpole_in_a_plain_torchrl_loop():
    torch.manual_seed(0)
    env = TransformedEnv(GymEnv("CartPole-v1", categorical_action_encoding=True), RewardSum())
    env.set_seed(0)
    body = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
    # the loss reads the learning network's "logits" / "state_value" and the acting policy's behaviour
    # statistics mu and log mu(a|s), stored in the replay when the step was taken
    network = TensorDictSequential(
        TensorDictModule(body, ["observation"], ["hidden"]),
        TensorDictModule(nn.Linear(64, 2), ["hidden"], ["logits"]),
        TensorDictModule(nn.Linear(64, 1), ["hidden"], ["state_value"]),
    )
    policy = ProbabilisticActor(
        TensorDictSequential(network[0], TensorDictModule(network[1].module, ["hidden"], [("behaviour", "logits")])),
        in_keys={"logits": ("behaviour", "logits")}, distribution_class=torch.distributions.Categorical,
        return_log_prob=True, log_prob_key=("behaviour", "log_prob"), default_interaction_type=ExplorationType.RANDOM,
    )
    loss = LASERLoss(network, discrete=True, gamma=0.99, entropy_coeff=0.01)
    optim = torch.optim.Adam(loss.parameters(), lr=2e-3)
    replay = TensorDictReplayBuffer(storage=LazyTensorStorage(2_000))  # 16-step windows as items
    collector = Collector(env, policy, frames_per_batch=64, total_frames=16_000, auto_register_policy_transforms=False)
    returns = []
    for batch in collector:
        replay.extend(batch.reshape(4, 16))
        returns += batch["next", "episode_reward"][batch["next", "done"]].tolist()
        for _ in range(2):
            out = loss(replay.sample(32))
            optim.zero_grad()
            sum(v for k, v in out.items() if k.startswith("loss_")).backward()
            optim.step()
        collector.update_policy_weights_()
    collector.shutdown()
    first, last = returns[:20], returns[-20:]
    assert sum(first) / len(first) < 40 and sum(last) / len(last) > 120, (sum(first) / 20, sum(last) / 20)
