"""ACER on CartPole-v1 in one file: the library's loss in a plain TorchRL loop.

ACER (Wang et al. 2017, "Sample efficient actor-critic with experience replay", ICLR 2017) is an actor-critic
that learns from replayed windows of k steps: a Retrace target Q^ret for the critic (eq. 5), a truncated
importance-weighted policy gradient with bias correction (eq. 9), and a trust region around an average policy
(sec. 3.3). All of that is :class:`acer_torchrl.objectives.ACERLoss`; this file is the loop around it, built from
TorchRL's own pieces (collector, replay buffer with a slice sampler, target-network updater), in the order of the
paper's Algorithm 1 (the master loop) and Algorithm 2 (one update).

    python examples/acer_cartpole.py [--total-frames 50000] [--seed 0]

Settings: those of the library's ``cartpole`` preset that ACER's 50 000 steps need (``acer_torchrl/settings/acer.py``:
k = 32, 32 windows an update, replay ratio 4, gamma 0.999, Adam 5e-4, entropy bonus 0.01, c = 10, delta = 1,
alpha = 0.99). Not the preset's: one env in this process (the preset steps 2 workers of 4 envs), TorchRL's slice
sampler (see :func:`make_replay`) over a 50 000-step replay, greedy evaluations of 3 episodes (the preset's: 10), and
none of what the preset adds for runs far past 50 000 steps (a target network for Q^ret, a 1M-step replay, a critic
weight falling from 50k steps: ``benchmarks/results/cartpole-stability.md``).

Measured 2026-11-27 on a 2-core x86_64 VM without GPU (torch 2.13, torchrl 0.14.1), the greedy return at 50 048
frames (3 episodes): 500.0 on seeds 0-4 and 419.3 on seed 5; every seed first scored 500 by 40k frames (seeds 0-2:
35k, 35k, 40k; 3-5: 40k, 40k, 15k), and dips after it happen (seed 1: 410 at 40k, seed 5: 419 at 50k). A seed took
62-65 s of CPU; three ran at once beside other jobs (load 12-20) and took 9.5-15.5 min each.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from torchrl.envs import ExplorationType, GymEnv, set_exploration_type
from torchrl.modules import ProbabilisticActor
from torchrl.objectives import SoftUpdate

from acer_torchrl.objectives import ACERLoss
from acer_torchrl.objectives.names import MASK_KEY

ENV = "CartPole-v1"
GAMMA = 0.999  # CartPole lasts up to 500 steps: a long horizon keeps the cart from drifting off late
SEQ_LEN = 32  # k of Alg. 2: steps per replayed window
BATCH = 32  # windows per update (1 024 steps)
FRAMES_PER_BATCH = 64  # env steps collected between two rounds of updates (Alg. 1's "Call ACER on-policy")
REPLAY_RATIO = 4.0  # r of Alg. 1: Poisson(r) replay updates after each on-policy one
REPLAY_START = 1_000  # replay updates begin once this many steps are stored
LR, MAX_GRAD_NORM = 5e-4, 40.0
EVAL_INTERVAL, EVAL_EPISODES = 5_000, 3


def make_networks(n_obs: int, n_actions: int) -> tuple[TensorDictModule, TensorDictModule, ProbabilisticActor]:
    """One torso, two heads (sec. 4): the policy's logits and Q(x, .); and the acting policy built on the same
    modules, which writes its logits under ``("behaviour", "logits")``: mu(.|x), stored with every step (Alg. 2:
    ``mu(.|x_i) <- f(.|phi(x_i))``) because the importance weights rho = pi / mu need the policy that acted."""
    torso = TensorDictModule(
        nn.Sequential(nn.Linear(n_obs, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU()), ["observation"], ["core"]
    )
    policy_head = nn.Linear(128, n_actions)
    nn.init.orthogonal_(policy_head.weight, gain=0.01)  # start near the uniform policy
    nn.init.zeros_(policy_head.bias)
    actor = TensorDictSequential(torso, TensorDictModule(policy_head, ["core"], ["logits"]))
    critic = TensorDictModule(nn.Linear(128, n_actions), ["core"], ["action_value"])
    behaviour = ProbabilisticActor(
        TensorDictSequential(torso, TensorDictModule(policy_head, ["core"], [("behaviour", "logits")])),
        in_keys={"logits": ("behaviour", "logits")},
        distribution_class=torch.distributions.Categorical,
        default_interaction_type=ExplorationType.RANDOM,  # sample while training; greedy in evaluate()
    )
    return actor, critic, behaviour


def make_replay() -> TensorDictReplayBuffer:
    """A FIFO replay of single steps sampled as ``SEQ_LEN``-step windows that never cross an episode boundary:
    the slice sampler cuts at ``("next", "done")``, and a window that meets an episode's end early is padded by
    repeating its last step, flagged in ``("collector", "mask")`` (see :func:`as_windows`). The sampler draws
    an episode uniformly, then a start inside it (the library's own replay draws starts uniformly over steps)."""
    sampler = SliceSampler(slice_len=SEQ_LEN, end_key=("next", "done"), strict_length=False, pad_output=True)
    return TensorDictReplayBuffer(storage=LazyTensorStorage(50_000), sampler=sampler, batch_size=BATCH * SEQ_LEN)


def as_windows(sample: TensorDictBase) -> TensorDictBase:
    """The sampler's flat ``[BATCH * SEQ_LEN]`` steps as the ``[BATCH, SEQ_LEN]`` windows the loss reads, with its
    padding mask under the loss's ``"mask"``: padded steps count in no mean, and the last real step of a window
    bootstraps on V(x_{t+1}) (Alg. 2: ``Q^ret <- sum_a Q(x_k, a) f(a|x_k)``) unless its episode terminated."""
    windows = sample.reshape(BATCH, SEQ_LEN)
    mask = windows.get(("collector", "mask"), None)  # absent when no window of the batch needed padding
    if mask is not None:
        windows.set(MASK_KEY, mask)
    return windows


def update(loss: ACERLoss, optimiser: torch.optim.Optimizer, average: SoftUpdate, windows: TensorDictBase) -> None:
    """One call of Alg. 2 on ``[B, k]`` windows: the loss's terms (policy surrogate with the trust region, critic,
    entropy), one clipped Adam step on their sum (instead of the paper's asynchronous one), then the average policy
    network theta_a <- alpha theta_a + (1 - alpha) theta."""
    out = loss(windows)
    optimiser.zero_grad()
    (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
    nn.utils.clip_grad_norm_(loss.parameters(), MAX_GRAD_NORM)
    optimiser.step()
    average.step()


def evaluate(env: GymEnv, policy: ProbabilisticActor) -> float:
    """Mean return of ``EVAL_EPISODES`` greedy episodes (the most probable action; CartPole-v1 stops at 500)."""
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        returns = [env.rollout(500, policy).get(("next", "reward")).sum().item() for _ in range(EVAL_EPISODES)]
    return sum(returns) / len(returns)


def train(total_frames: int, seed: int) -> None:
    """Alg. 1: collect ``FRAMES_PER_BATCH`` steps with the current policy, update on them (on-policy), then
    Poisson(r) times on replayed windows; print a greedy evaluation every ``EVAL_INTERVAL`` steps and at the end."""
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # a small network: threads that wait for each other cost more than they share
    # GymEnv writes ("next", "terminated") and ("next", "truncated"): the loss bootstraps a truncated episode (the
    # 500-step limit) on V of its stored last observation, and a terminated one (the pole fell) on 0
    env, eval_env = GymEnv(ENV, categorical_action_encoding=True), GymEnv(ENV, categorical_action_encoding=True)
    env.set_seed(seed)
    eval_env.set_seed(seed + 1)
    actor, critic, behaviour = make_networks(env.observation_spec["observation"].shape[-1], env.action_spec.n)
    loss = ACERLoss(actor, critic, discrete=True, gamma=GAMMA, c=10.0, delta=1.0, entropy_coeff=0.01)
    average = SoftUpdate(loss, eps=0.99)  # alpha of sec. 3.3: the average policy network's decay
    optimiser = torch.optim.Adam(loss.parameters(), lr=LR, eps=1e-5)
    replay = make_replay()
    total_frames = -(-total_frames // FRAMES_PER_BATCH) * FRAMES_PER_BATCH  # whole batches, as the collector takes
    collector = Collector(env, behaviour, frames_per_batch=FRAMES_PER_BATCH, total_frames=total_frames,
                          auto_register_policy_transforms=False)  # feed-forward: no InitTracker to add
    # Ctrl-C is noted and acted on between batches: raised wherever Python was (a __del__ included), a
    # KeyboardInterrupt can be dropped, and the run went on (a CI run's Ctrl-C test timed out so)
    stop = []
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    print(f"ACER on {ENV}, seed {seed}: {total_frames} frames", flush=True)
    frames, start = 0, time.time()
    try:
        for batch in collector:
            if stop:
                raise KeyboardInterrupt
            frames += batch.numel()
            replay.extend(batch)
            # on-policy: the fresh steps as windows (an episode may end inside one: the loss cuts its trace there)
            update(loss, optimiser, average, batch.reshape(-1, SEQ_LEN))
            if len(replay) >= REPLAY_START:
                for _ in range(int(torch.poisson(torch.tensor(REPLAY_RATIO)))):
                    update(loss, optimiser, average, as_windows(replay.sample()))
            collector.update_policy_weights_()
            if frames % EVAL_INTERVAL < FRAMES_PER_BATCH or frames >= total_frames:
                print(f"frames {frames:>7}  greedy return {evaluate(eval_env, behaviour):6.1f}  "
                      f"({time.time() - start:.0f} s)", flush=True)
    finally:
        collector.shutdown()
        eval_env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-frames", type=int, default=50_000, help="env steps to train for")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.total_frames < FRAMES_PER_BATCH:
        parser.error(f"--total-frames must be at least {FRAMES_PER_BATCH} (one collected batch)")
    try:
        train(args.total_frames, args.seed)
    except KeyboardInterrupt:  # Ctrl-C: one line, and the shell's exit code for SIGINT
        print("interrupted: this example keeps no checkpoint to resume from", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
