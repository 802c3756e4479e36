"""ACER's settings: its ``acer.*`` keys and presets (no torch here: ``--help`` lists them at once)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from acer_torchrl.settings import REPLAY_DRAW_KEYS, Algorithm
from acer_torchrl.settings.env import ATARI_EPISODE_STEPS
from acer_torchrl.validation import MAX_WIDTH, ConfigError, allowed

if TYPE_CHECKING:
    from acer_torchrl.config import Config

DEFAULT_PRESET = "cartpole"

@allowed(replay_ratio="[0, 1000]", c="(0, inf)", delta="(0, inf)", alpha="[0, 1)", entropy_coeff="[0, inf)",
         critic_coeff="[0, inf)", sdn_samples="[1, 1000]", sdn_hidden=MAX_WIDTH, init_std="(0, inf)",
         target_update="[0, 1000000]", critic_coeff_end="[0, inf)", critic_decay="[0, 1000000000000]")
@dataclass
class ACERConfig:
    """``acer.<field>=`` overrides (paper values: Atari sec. 4, MuJoCo sec. 6)."""

    # the Gaussian policy's and the SDN's keys: unused with discrete actions (Config.unused_keys notes them)
    continuous_keys: ClassVar[tuple[str, ...]] = ("acer.sdn_samples", "acer.sdn_hidden", "acer.init_std",
                                                  "acer.learn_std")

    replay_ratio: float = 4.0  # r of Alg. 1: Poisson(r) replay updates after each collected batch
    on_policy: bool | None = None  # on-policy update first (Alg. 1); None: discrete yes, continuous no (sec. 6)
    c: float = 10.0  # importance-weight truncation of the policy gradient (eq. 9 / 16)
    trust_region: bool = True  # efficient trust region (sec. 3.3); false: truncation + bias correction only
    delta: float = 1.0  # trust-region constraint (eq. 11)
    alpha: float = 0.99  # average policy network decay: theta_a <- alpha theta_a + (1 - alpha) theta
    entropy_coeff: float = 0.001  # weight of the entropy bonus (sec. 4: 0.001)
    critic_coeff: float = 1.0  # weight of 1/2 (Q^ret - Q)^2 (eq. 6) [+ 1/2 (V^target - V)^2, eq. 14]
    # the critic's weight at the end of critic_decay (linear from critic_coeff over those env steps, then kept);
    # none: critic_coeff throughout (the paper). Not in ACER: a critic that keeps its full step over a run far past
    # the one it learned in regresses on itself (benchmarks/results/cartpole-stability.md)
    critic_coeff_end: float | None = None
    critic_decay: list[int] = field(default_factory=lambda: [50_000, 100_000])  # env steps: [start, end]
    sdn_samples: int = 5  # n of eq. 13 (continuous)
    # discrete: updates between copies of the network whose Q builds Q^ret (a target network as Reactor's, eq. 7);
    # 0: none, Q^ret reads the critic it trains, as in ACER (sec. 3.1)
    target_update: int = 0
    sdn_hidden: list[int] = field(default_factory=lambda: [64])  # the SDN's advantage network A(x, a)
    init_std: float = 0.3  # Gaussian policy std (sec. 6: fixed 0.3)
    learn_std: bool = False  # learn a state-independent std instead of the fixed one
    # standardise vector states with the mean and std of the first replay.min_size stored ones, fitted once before
    # the first replay update (V-RACER's App. B, eq. 14-15; not in ACER, which reads raw states)
    standardize: bool = False
    # continuous: the Gaussian's mean through tanh into the action bounds, loc = c + h tanh(x) (c, h: the bounds'
    # centre and half-width). Not in ACER, which does not say; pfrl's ACER MuJoCo example bounds it so. Unbounded,
    # a mean can leave the bounds the env clips actions to, where the critic only extrapolates: ACER HalfCheetah
    # (mujoco preset, seed 0) fell from 2 429 to -665 after 225k steps with |loc| ~14 (learning.md, sixteenth session)
    bound_mean: bool = False

    def unused_keys(self, cfg: Config) -> dict[str, str]:
        """The trust region's keys (its constraint and its average policy network), without it; the replay's draw,
        without replay updates (on-policy updates only)."""
        unused = {} if self.trust_region else dict.fromkeys(("acer.delta", "acer.alpha"), "acer.trust_region=false")
        if self.critic_coeff_end is None:
            unused["acer.critic_decay"] = "acer.critic_coeff_end=none"
        if self.replay_ratio == 0:
            unused.update(dict.fromkeys(REPLAY_DRAW_KEYS, "acer.replay_ratio=0"))
        return unused

    def validate(self, cfg: Config) -> None:
        """The checks across fields (each field's range is declared above)."""
        if self.on_policy is False and self.replay_ratio == 0:
            raise ConfigError("acer.on_policy=false with acer.replay_ratio=0 never updates; set one of them")
        if len(self.critic_decay) != 2 or self.critic_decay[0] > self.critic_decay[1]:
            raise ConfigError(f"acer.critic_decay must be two env-step counts start,end with start <= end, got "
                              f"{','.join(map(str, self.critic_decay)) or '(empty)'}; e.g. acer.critic_decay=50000,100000")


# paper sec. 4 (Atari), shared by the atari and minatar presets
_ATARI = {
    "collector.workers": 2,
    "collector.frames_per_batch": 80,
    "replay.seq_len": 20,  # k
    "replay.batch_size": 16,
    "replay.capacity": 100_000,  # 50 000 per actor x 2 workers
    "replay.min_size": 10_000,
    "optim.lr": 1e-3,
    "optim.max_grad_norm": 40.0,
    "gamma": 0.99,
    "acer.replay_ratio": 4.0,
    "acer.entropy_coeff": 0.001,
    "acer.c": 10.0,
    "acer.delta": 1.0,
    "acer.alpha": 0.99,
}

PRESETS: dict[str, dict[str, object]] = {
    # quick discrete check (what `make train` runs): a few minutes on 2 cores
    "cartpole": {
        "env.name": "CartPole-v1",
        # gamma 0.999, not 0.99: greedy policies that fell from 500 kept the pole up and let the cart drift off
        # the track after ~300 steps; at 0.99 a state 300 steps from that end is worth 95 against 100 for a safe
        # one (5 %), at 0.999 259 against 1 000 (benchmarks/results/cartpole-stability.md)
        "gamma": 0.999,
        "total_frames": 50_000,
        "collector.workers": 2,
        # 4 games a worker, stepped together: TorchRL's per-step cost (over 100x a CartPole step) is paid
        # once for 4 frames (benchmarks/results/learner.md has the speed)
        "env.num_envs": 4,
        "collector.frames_per_batch": 64,
        # replayed windows of k = 32 steps, not 16 (Q^ret sums twice as many rewards before it bootstraps): final
        # scores >= 475 on 20/20 tuning seeds 0-19 and 9/10 unseen seeds 120-129; with k = 16, 9/10 on 0-9 and
        # 8/10 on unseen seeds 100-109 (benchmarks/results/cartpole-stability.md)
        "replay.seq_len": 32,
        "replay.batch_size": 32,  # 1 024 steps an update (with k = 16, 16 windows reached 475 in fewer seeds)
        # over runs past its 50 000 steps (not in ACER; cartpole-stability.md, twelfth session): a replay that forgets
        # nothing below 1M steps, a target network for Q^ret, and a critic weight falling from 1 at 50k to 0.25 at
        # 100k; the critic regressed on itself without them (V past 1 / (1 - gamma), the policy dead at ~200k)
        "replay.capacity": 1_000_000,
        "acer.target_update": 50,
        "acer.critic_coeff_end": 0.25,
        "acer.critic_decay": "[50000, 100000]",
        "replay.min_size": 1_000,
        "optim.lr": 5e-4,
        "network.hidden": "[128, 128]",
        "eval.interval": 2_500,
        "acer.replay_ratio": 4.0,
        "acer.entropy_coeff": 0.01,
        "acer.c": 10.0,
        "acer.delta": 1.0,
        "acer.alpha": 0.99,
    },
    # paper sec. 4: Nature CNN, k = 20, c = 10, delta = 1, alpha = 0.99, replay ratio 4, 50 000 frames per actor
    "atari": {
        **_ATARI,
        "env.name": "ALE/Pong-v5",
        "eval.max_steps": ATARI_EPISODE_STEPS,  # whole games
        "total_frames": 10_000_000,
        # in RAM: each 84x84 frame is stored once (frame_store.py), ~9 KB a step with its ring's margin
        "eval.interval": 250_000,
        "log.checkpoint_interval": 500_000,
    },
    # The paper's shape on one GPU node (sec. 4: 16 actors, k = 20, 50 000 replayed steps per actor): 8 workers of
    # 16 games on the node's CPU cores, the learner on the GPU; 800 000 steps of single frames in RAM (~7 GB)
    "atari_gpu": {
        **_ATARI,
        "env.name": "ALE/Pong-v5",
        "eval.max_steps": ATARI_EPISODE_STEPS,  # whole games
        "device": "cuda",
        "total_frames": 10_000_000,
        "collector.workers": 8,
        # 16 games a worker: a batch is 16 windows of k = 20 steps, as large as a replayed batch, so that Poisson(4)
        # replay updates follow each on-policy one of equal size (Alg. 1's replay ratio). With 2 games a worker
        # (40 steps a batch) every step was replayed ~8x as often and the learner held the run back
        # (benchmarks/results/gpu.md has both rates)
        "env.num_envs": 16,
        "collector.frames_per_batch": 320,
        "replay.capacity": 800_000,
        "replay.min_size": 20_000,
        "eval.interval": 250_000,
        "log.checkpoint_interval": 1_000_000,
    },
    # The Atari settings (sec. 4) on MinAtar's network (Young & Tian 2019), feed-forward like MinAtar's agents
    # (its trail channels show the last move in one frame); 2M steps (issue 20's benchmark). The replay stays
    # in RAM: 100 000 steps of uint8 [C, 10, 10] grids are at most 100 MB of observations (Seaquest: C = 10).
    "minatar": {
        **_ATARI,
        "env.name": "MinAtar/Breakout-v1",
        "total_frames": 2_000_000,
        "eval.interval": 100_000,
        "log.checkpoint_interval": 200_000,
    },
    # paper sec. 6 / App. E: fixed sigma 0.3, 5 000-step replay per actor, updates every 50 steps,
    # c = 5, alpha = 0.995, n = 5, off-policy only
    "mujoco": {
        "env.name": "HalfCheetah-v5",
        "total_frames": 1_000_000,
        "collector.workers": 2,
        "collector.frames_per_batch": 50,
        "replay.seq_len": 50,
        "replay.batch_size": 8,
        "replay.capacity": 10_000,  # 5 000 per actor x 2 workers
        "replay.min_size": 1_000,
        "optim.lr": 3e-4,
        "eval.interval": 25_000,
        "acer.on_policy": False,
        # not the paper's 4 (sec. 6): 16 replay updates a 50-step batch and V-RACER's state standardisation chosen on
        # tuning seed 700 (Hopper-v5, 300k steps, final score 909.0 against 433.5 with 4 and raw states, 766.1 with 16
        # alone: benchmarks/results/learning.md, acer-hopper-tune-*)
        "acer.replay_ratio": 16.0,
        "acer.standardize": True,
        "acer.entropy_coeff": 0.0,
        "acer.c": 5.0,
        # the bottom of the paper's range [0.1, 2] (App. E), chosen by a rule named before its pilots (Hopper-v5, tuning
        # seed 700, 300k steps: 1 807.5 against the preset's 601.6 with delta = 1; alpha 0.99, one SDN sample and a
        # learned std did not beat it: learning.md, acer-hopper-pilot-*); on seeds 0-2 Hopper 740.0, no better than
        # delta 1's 874.2 (acer-hopper-delta01), HalfCheetah 2 414.8 against delta 1's 1 901.4 (acer-halfcheetah-delta01)
        "acer.delta": 0.1,
        "acer.alpha": 0.995,
        "acer.sdn_samples": 5,
        "acer.init_std": 0.3,
        "acer.learn_std": False,
        # not in ACER: the mean tanh-bounded to the action bounds, named before its pilot (HalfCheetah-v5, tuning seed
        # 700, 300k steps: final score 3 765.2, the rule >= 2 431 held; learning.md, acer-halfcheetah-bound-mean-pilot);
        # on seeds 0-2 it did not carry over: HalfCheetah 1 901.4, Hopper 874.2 (acer-*-bounded)
        "acer.bound_mean": True,
    },
    "pendulum": {
        "env.name": "InvertedPendulum-v5",
        "total_frames": 50_000,
        "collector.workers": 2,
        "collector.frames_per_batch": 50,
        "replay.seq_len": 25,
        "replay.batch_size": 16,
        "replay.capacity": 10_000,
        "replay.min_size": 1_000,
        "optim.lr": 1e-3,
        "eval.interval": 2_500,
        "acer.on_policy": False,
        "acer.replay_ratio": 4.0,
        "acer.entropy_coeff": 0.0,
        "acer.c": 5.0,
        "acer.delta": 2.0,  # the top of the paper's range [0.1, 2]: delta = 1 kept ~40% of steps projected
        # sec. 6: "The rate of the soft updating (alpha as in Section 3.3) is set to 0.995 in all setups
        # involving trust region updating" (0.99 is the Atari value, sec. 4)
        "acer.alpha": 0.995,
    },
}

# the fields of ACERConfig that build (algorithms/acer.py) reads itself (the others go to ACERLoss)
BUILD_READS = ("init_std", "learn_std", "sdn_hidden", "on_policy", "trust_region", "target_update", "alpha",
               "standardize", "bound_mean")

ALGORITHM = Algorithm(
    "acer", ACERConfig, "acer_torchrl.algorithms.acer.build", PRESETS, DEFAULT_PRESET, BUILD_READS
)
