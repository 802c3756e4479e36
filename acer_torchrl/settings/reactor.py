"""Reactor's settings: its ``reactor.*`` keys and presets (no torch here: ``--help`` lists them at once)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from acer_torchrl.objectives.names import PG_ESTIMATORS
from acer_torchrl.settings import Algorithm
from acer_torchrl.settings.env import ATARI_EPISODE_STEPS
from acer_torchrl.validation import MAX_WIDTH, ConfigError, allowed

if TYPE_CHECKING:
    from acer_torchrl.config import Config

FLOAT32_MAX, FLOAT32_TINY = 3.4028234663852886e38, 1.1754943508222875e-38  # float32's largest and smallest normal

DEFAULT_PRESET = "cartpole"

BEHAVIOUR_MODES = ("memorised", "learned")


@allowed(lam="[0, 1]", pg=PG_ESTIMATORS, beta_c="[1, inf]", tislr_c="(0, inf)", behaviour=BEHAVIOUR_MODES,
         epsilon="[0, 1)", target_update="[1, inf)", entropy_coeff="[0, inf)", head_hidden=MAX_WIDTH,
         updates_per_batch="(0, 1000]", atoms="[2, 1000]")
@dataclass
class ReactorConfig:
    lam: float = 1.0  # Retrace lambda in c_s = lambda min(1, pi/mu) (eq. 2); sec. 4.2 also tries 0.9
    pg: str = "beta_loo"  # beta_loo (eq. 5) | tislr (sec. 2.2)
    beta_c: float = 1.0  # beta = min(beta_c, 1/mu(A)): 1 -> LOO (eq. 4), inf -> 1/mu-LOO (eq. 6), 5 -> "M5/L5"
    tislr_c: float = 10.0  # truncation c of TISLR
    behaviour: str = "memorised"  # memorised (stored mu, "M") | learned (mu-hat head, "L")
    epsilon: float = 0.01  # uniform mixing in the pi and mu-hat heads: x (1 - eps) + eps / #actions (Table 1)
    target_update: int = 1000  # T_update: learner steps between target-network copies (sec. 3.4)
    entropy_coeff: float = 0.1  # entropy bonus = entropy_coeff x mean action gap (sec. 3.5)
    head_hidden: int = 32  # width of the heads' hidden linear layer before its CReLU (Table 1)
    updates_per_batch: float = 1.0  # learner steps per collected batch (fractions drawn at random)
    # a categorical critic (C51 atoms, dueling logits, sec. 3.4.1) trained by distributional Retrace and a KL loss
    # (sec. 3.2, eq. 12) instead of the scalar Q regressed on Retrace; the actor reads the distributions' means
    distributional: bool = False
    atoms: int = 51  # number N of atoms z_i of the categorical critic (C51's 51)
    v_min: float = -10.0  # the lowest atom z_0 (finite, below v_max): lower returns count as v_min (C51's Atari value)
    v_max: float = 10.0  # the highest atom z_{N-1}: returns above it count as v_max (C51's Atari value)

    def unused_keys(self, cfg: Config) -> dict[str, str]:
        """The keys of this section that the chosen policy-gradient estimator does not read; the categorical
        critic's, without it; ``network.activation`` (its layers are CReLU)."""
        unused = {"reactor.tislr_c" if self.pg == "beta_loo" else "reactor.beta_c": f"reactor.pg={self.pg}",
                  "network.activation": "loss=reactor (CReLU layers, Table 1)"}
        if not self.distributional:
            unused.update(dict.fromkeys(("reactor.atoms", "reactor.v_min", "reactor.v_max"),
                                        "reactor.distributional=false"))
        return unused

    def validate(self, cfg: Config) -> None:
        """The checks across fields (each field's range is declared above)."""
        if cfg.replay.seq_len < 2:
            raise ConfigError(f"loss=reactor learns from sequences: replay.seq_len={cfg.replay.seq_len} is too short, "
                              "the smallest that works is replay.seq_len=2")
        if not (math.isfinite(self.v_min) and math.isfinite(self.v_max) and self.v_min < self.v_max):
            raise ConfigError(f"the categorical critic's support needs finite reactor.v_min < reactor.v_max, got "
                              f"v_min={self.v_min}, v_max={self.v_max}")
        spacing = (self.v_max - self.v_min) / (self.atoms - 1)  # the support is float32: its span and spacing too
        fits = max(abs(self.v_min), abs(self.v_max), self.v_max - self.v_min) <= FLOAT32_MAX
        if not (fits and spacing >= FLOAT32_TINY):
            raise ConfigError(f"reactor.v_min={self.v_min:g} to reactor.v_max={self.v_max:g} over {self.atoms} atoms "
                              f"does not fit float32 (values and span at most {FLOAT32_MAX:.3g}, spacing at least "
                              f"{FLOAT32_TINY:.3g})")


# Table 1 and sec. 3.4 (Atari), shared by the atari and minatar presets. Where they depart from the ICLR 2018 text
# (sec. 3.4: "4-6 acting steps per each learning step", "sequences of length 33 in batches of 4"; sec. 3.4.1: Adam
# at 5e-5 "and zero momentum because asynchronous updates induce implicit momentum"): one learning step of 32
# sequences per 128 acting steps, ~8 replayed steps per acted step where the paper's 4 per ~5 give ~26 (fewer, larger
# updates: the learner's cost on CPU), and Adam's default beta1 = 0.9 (one synchronous learner: no asynchrony to
# supply the momentum)
_ATARI = {
    "network.lstm": True,
    "network.lstm_hidden": 128,
    "replay.seq_len": 33,  # tau
    # "during learning time we always reset the LSTM internal state" (sec. 3.4): a sampled sequence starts from
    # zeros, not from the state LASER's refresh unrolls over the episode's prefix (on Pong that unroll over
    # hundreds of frames made a CPU draw of 32 sequences take ~25 s)
    "replay.recurrent_state": "zero",
    "replay.batch_size": 32,
    "replay.min_size": 10_000,
    "reactor.target_update": 1000,
    "reactor.updates_per_batch": 1.0,
    "collector.frames_per_batch": 128,
    "optim.lr": 5e-5,
}

PRESETS = {
    "cartpole": {
        "env.name": "CartPole-v1",
        # gamma 0.999, not 0.99, as for ACER and LASER: greedy policies kept the pole up and let the cart drift
        # off the track after ~300 steps, which a 0.99 critic cannot tell from safety (5 % of the value). Reactor
        # also needs a faster critic to see it: its Retrace targets read a target network (eq. 7) and the mean
        # trace c is ~0.7, so a far failure's value moves back only a few steps per copy. Final scores over
        # seeds 0-4 at 50k steps: T_update 50 with 4 updates/batch 499, 500, 499, 352, 293 (3/5 >= 450);
        # with 8 updates/batch and lambda 0.9 500, 500, 452, 490, 461 (5/5), but 7/10 over two runs of seeds 0-4
        # and 3/5 on seeds 5-9. lambda 1.0 (the paper's Table 2; sec. 4.2 found 0.9 better on Atari) makes the
        # traces longer, so the critic moves faster still: 5/5 on seeds 0-4 and on seeds 5-9 (the rows
        # reactor-cartpole-lambda1-seeds5-9 and reactor-cartpole in benchmarks/results/learning.md).
        # Both are free in the paper: its learner runs asynchronously as fast as it can, no fixed replay ratio
        # (sec. 3.6), and its T_update 1000-10000 (sec. 3.4) is for 200M Atari steps; here it is ~125 copies
        # in 6 250 updates (benchmarks/results/cartpole-stability.md)
        "gamma": 0.999,
        "total_frames": 50_000,
        "network.hidden": [64],
        "network.lstm": False,
        "replay.seq_len": 33,  # tau (sec. 3.4)
        "replay.batch_size": 16,
        "replay.min_size": 1_000,
        # a replay that forgets nothing below 1M steps and the paper's categorical critic (sec. 3.2), its support
        # [0, 1 / (1 - gamma)]: the scalar critic ran past 1 / (1 - gamma) over 300k steps; with both, 10/10 unseen
        # seeds at 50k and 3/3 at 300k (benchmarks/results/cartpole-stability.md, eleventh session)
        "replay.capacity": 1_000_000,
        "reactor.distributional": True,
        "reactor.v_min": 0.0,
        "reactor.v_max": 1000.0,
        "reactor.target_update": 50,
        "reactor.updates_per_batch": 8.0,
        "reactor.epsilon": 0.05,
        "reactor.lam": 1.0,
        # the learned mu-hat: 5/5 seeds reached 475 within 60k steps, the memorised mu 2/5 (results/learning.md)
        "reactor.behaviour": "learned",
        "optim.lr": 5e-4,
        "eval.interval": 5_000,
    },
    # CartPole without velocities: the Q, pi and mu-hat LSTMs must integrate positions over time. With the
    # paper's entropy constant 0.1 one run collapsed to a deterministic policy (return ~9); with 1.0 and the
    # memorised mu it rose to greedy ~215 after 60k env steps, with the learned mu-hat to 445 at 120k (one run
    # each; the 5-seed benchmark is in benchmarks/results/learning.md)
    "cartpole_pomdp": {
        "env.name": "CartPole-v1",
        "env.pomdp": True,
        "total_frames": 200_000,
        "network.hidden": [64],
        "network.lstm": True,
        "network.lstm_hidden": 64,
        "replay.seq_len": 33,
        "replay.batch_size": 16,
        "replay.min_size": 1_000,
        "replay.capacity": 100_000,
        "reactor.target_update": 200,
        "reactor.updates_per_batch": 2.0,
        "reactor.epsilon": 0.05,
        "reactor.lam": 0.9,
        "reactor.entropy_coeff": 1.0,
        "reactor.behaviour": "learned",
        "optim.lr": 5e-4,
        "eval.interval": 10_000,
    },
    # Table 1 network on single 84x84 frames (the LSTMs carry the history); needs a GPU to learn at speed
    "atari": {
        **_ATARI,
        "env.name": "ALE/Pong-v5",
        "eval.max_steps": ATARI_EPISODE_STEPS,  # whole games
        "env.frame_stack": 1,
        "total_frames": 10_000_000,
        "replay.capacity": 500_000,  # ~10 GB memmap: both observations and the acting outputs are stored
        "replay.memmap": True,
        "eval.interval": 250_000,
    },
    # The atari preset on one GPU node: 14 workers on the node's CPU cores, the learner on the GPU, the replay in
    # RAM (single frames stored once, ~8 KB a step with the acting outputs)
    "atari_gpu": {
        **_ATARI,
        "env.name": "ALE/Pong-v5",
        "eval.max_steps": ATARI_EPISODE_STEPS,  # whole games
        "env.frame_stack": 1,
        "device": "cuda",
        "total_frames": 10_000_000,
        "collector.workers": 14,
        "replay.capacity": 1_000_000,
        "eval.interval": 250_000,
        "log.checkpoint_interval": 1_000_000,
    },
    # MinAtar's encoder (Young & Tian 2019; Table 1's convolutions do not fit 10x10 grids) with MinAtar's discount
    # 0.99; 2M steps (issue 20's benchmark). 200 000 steps in RAM: uint8 [C, 10, 10] grids are at most 1 kB a
    # step, the stored acting outputs a few hundred bytes. 4 games a collector worker (batches [4, 32]): far more
    # env steps/s than one game (benchmarks/results/learner.md).
    # Not the Atari settings: with Table 1's LSTMs, lr 5e-5 and one update a 128-step batch (5 400 updates in
    # 700 000 steps) Breakout stayed at a greedy 0.1-0.8 for 700 000 steps (seed 0); without the
    # LSTMs (MinAtar's frames show the last move: its DQN and AC have none), lr 2.5e-4 (MinAtar's) and 4 updates
    # a batch it reached 3.1, 5.1, 7.9, 9.5 at 100-400k steps (one seed, `reactor-minatar-breakout-probe`
    # in benchmarks/results/learning.md). `network.lstm=true` is the recurrent comparison.
    "minatar": {
        **_ATARI,
        "env.name": "MinAtar/Breakout-v1",
        "env.num_envs": 4,
        "gamma": 0.99,
        "total_frames": 2_000_000,
        "replay.capacity": 200_000,
        "network.lstm": False,
        "optim.lr": 2.5e-4,
        "reactor.updates_per_batch": 4.0,
        "eval.interval": 100_000,
    },
}

# The atari preset with the paper's prioritized sequence replay (ICLR version sec. 3.3, Figure 3's "Reactor"): lazy priorities per
# 32-step neighbourhood, importance weights with beta = 1; a variant, so that the atari preset's rows stay comparable
PRESETS["atari_prioritized"] = {**PRESETS["atari"], "replay.prioritized": True}

# the fields of ReactorConfig that build (algorithms/reactor.py) reads itself (the others go to ReactorLoss)
BUILD_READS = ("head_hidden", "epsilon", "behaviour", "target_update", "distributional", "atoms")

ALGORITHM = Algorithm(
    "reactor", ReactorConfig, "acer_torchrl.algorithms.reactor.build", PRESETS, DEFAULT_PRESET, BUILD_READS
)
