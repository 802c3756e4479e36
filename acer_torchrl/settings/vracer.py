"""V-RACER's settings: its ``vracer.*`` keys and presets (no torch here: ``--help`` lists them at once)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from acer_torchrl.settings import Algorithm
from acer_torchrl.validation import ConfigError, allowed

if TYPE_CHECKING:
    from acer_torchrl.config import Config

DEFAULT_PRESET = "pendulum"

@allowed(C="(0, inf)", A="[0, inf)", D="(0, 1)", steps_per_update="[1e-3, inf)", init_std="(0, inf)",
         truncation="(0, inf)", reward_scale_interval="[1, inf)", epsilon="(0, inf)")
@dataclass
class VRACERConfig:
    C: float = 4.0  # ReF-ER: c_max(t) = 1 + C / (1 + A t) (eq. 13)
    A: float = 5e-7  # ReF-ER: annealing of c_max and of the learning rate (eq. 13)
    D: float = 0.1  # ReF-ER: tolerated far-policy fraction of the replay (eq. 12)
    rule1: bool = True  # ReF-ER Rule 1 (skip far-policy samples); false: ablation of sec. 5 (then rho <= 1e3, sec. 5.3)
    rule2: bool = True  # ReF-ER Rule 2 (KL penalty, beta of eq. 12); both false: plain ER
    steps_per_update: float = 1.0  # F: env steps per gradient step (App. A)
    # initial policy std in [-1, 1] action units: App. A's covariance Sigma = 0.2 I, i.e. std sqrt(0.2)
    # (the authors' smarties code: explNoise 0.4472135955)
    init_std: float = math.sqrt(0.2)
    truncation: float = 3.0  # actions are drawn from the normal truncated at this many std (App. A)
    reward_scale_interval: int = 1000  # gradient steps between recomputations of sigma_r (App. B, Alg. 1)
    epsilon: float = 1e-7  # App. B: s_hat = (s - mu_s) / (sigma_s + eps), r_hat = r / (sigma_r + eps)

    def validate(self, cfg: Config) -> None:
        """The checks across fields (each field's range is declared above)."""
        if cfg.network.lstm:
            raise ConfigError("loss=vracer trains on single time steps: network.lstm=true is not supported")
        if cfg.replay.seq_len != 1:
            raise ConfigError(f"loss=vracer trains on single time steps: replay.seq_len={cfg.replay.seq_len} would be "
                              "ignored; drop it (replay.seq_len=1)")
        if cfg.replay.prioritized:
            raise ConfigError("loss=vracer replays single steps uniformly (ReF-ER's far-policy share assumes it): "
                              "replay.prioritized=true is not supported; drop it")


_PAPER = {  # App. A: MLP 2x128 Softsign, Adam lr 1e-4, gamma 0.995, N = 2^18, B = 256, F = 1
    "network.hidden": [128, 128],
    "network.activation": "softsign",
    "optim.lr": 1e-4,
    "optim.max_grad_norm": math.inf,  # the paper does not clip gradients
    "gamma": 0.995,
    "replay.capacity": 2**18,
    "replay.batch_size": 256,
    "replay.seq_len": 1,
}

PRESETS: dict[str, dict] = {
    # the paper's settings (App. A) on a MuJoCo task; N_start is not given in the paper
    "mujoco": {
        **_PAPER,
        "env.name": "HalfCheetah-v5",
        "total_frames": 1_000_000,
        "replay.min_size": 10_000,
        "eval.interval": 25_000,
    },
    # the same settings on InvertedPendulum-v5 (the benchmark: a greedy return >= 950 within 50 000 steps)
    "pendulum": {
        **_PAPER,
        "env.name": "InvertedPendulum-v5",
        "total_frames": 50_000,
        "replay.min_size": 2_000,
        "eval.interval": 2_500,
    },
}

# the fields of VRACERConfig that build (algorithms/vracer.py) reads itself (the others go to VRACERLoss)
BUILD_READS = ("epsilon", "init_std", "truncation", "reward_scale_interval")

ALGORITHM = Algorithm(
    "vracer", VRACERConfig, "acer_torchrl.algorithms.vracer.build", PRESETS, DEFAULT_PRESET, BUILD_READS
)
