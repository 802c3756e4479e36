"""ale-py's C++ vector env as the project's Atari env (imported only for Atari runs: ale-py's import costs
~0.2 s in every process that builds an env, :func:`acer_torchrl.envs.atari_vector_env` imports it)."""

from __future__ import annotations

import numpy as np
from ale_py.vector_env import AtariVectorEnv
from gymnasium.vector import AutoresetMode


class ManualResetAtariVectorEnv(AtariVectorEnv):
    """ale-py's C++ vector env (standard preprocessing) with autoreset disabled.

    ale-py has no ``DISABLED`` autoreset mode. It runs in ``NEXT_STEP`` mode, where an explicit partial
    reset (``reset_mask``) of a finished env clears its pending autoreset (checked in tests/test_envs.py),
    so declaring ``DISABLED`` lets TorchRL reset finished envs itself, as it does for gymnasium vector envs.

    Episodic life (DQN): ale-py's ``life_loss_info`` ends the episode on a lost life while the game goes on;
    the reset TorchRL then asks for is skipped for those envs, so the next episode continues the game. Not when
    the game has also used up its frames (``max_num_frames_per_episode``): ale-py reports the lost life as a
    termination without truncation but restarts the game at the next step, so that reset is not skipped (skipped,
    the new episode's first step would have been followed by another game's first frames).
    """

    def __init__(self, *, episodic_life: bool, **kwargs):
        super().__init__(autoreset_mode=AutoresetMode.NEXT_STEP, life_loss_info=episodic_life, **kwargs)
        self.max_frames = kwargs.get("max_num_frames_per_episode", 108_000)  # ale-py's default
        self.autoreset_mode = AutoresetMode.DISABLED
        self.metadata = {**self.metadata, "autoreset_mode": AutoresetMode.DISABLED}
        self.episodic_life = episodic_life
        self.life_lost = np.zeros(self.num_envs, dtype=bool)  # ended by a lost life, game not over

    def step(self, actions: np.ndarray):
        obs, reward, terminated, truncated, info = super().step(actions)
        if self.episodic_life:
            game_goes_on = (info["lives"] > 0) & (info["episode_frame_number"] < self.max_frames)
            self.life_lost = terminated & ~truncated & game_goes_on
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        options = dict(options or {})
        mask = options.get("reset_mask", np.ones(self.num_envs, dtype=bool))
        if seed is None and self.life_lost.any():
            options["reset_mask"] = mask & ~self.life_lost
        self.life_lost = self.life_lost & ~mask
        return super().reset(seed=seed, options=options or None)
