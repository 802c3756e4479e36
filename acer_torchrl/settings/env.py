"""The ``env.*`` keys (no gymnasium or torch here: ``--help`` lists them at once; :mod:`acer_torchrl.envs` makes the envs)."""

from __future__ import annotations

from dataclasses import dataclass

from acer_torchrl.validation import allowed


# ALE's own episode limit (108 000 frames, its v5 ids') in agent steps at the default frame skip of 4: what the Atari
# presets' evaluations play (eval.max_steps), so that their games end as the game does
ATARI_EPISODE_STEPS = 27_000


@allowed(num_envs="[1, 1024]", frame_skip="[1, 1000]", noop_max="[0, inf)", frame_stack="[1, 64]",
         max_episode_steps="[1, inf)", repeat_action_probability="[0, 1]")
@dataclass
class EnvConfig:
    name: str = "CartPole-v1"  # a gymnasium id of one of acer_torchrl.envs.FAMILIES
    pomdp: bool = False  # CartPole only: observe x and theta, not the velocities
    num_envs: int = 1  # envs stepped together in one collector worker (batches [num_envs, T] when > 1)
    frame_skip: int = 4  # Atari: agent steps repeat the action this many frames (max-pool of the last two)
    noop_max: int = 30  # Atari: up to this many no-op frames after a reset
    episodic_life: bool = False  # Atari: a lost life terminates the episode
    frame_stack: int = 4  # Atari: frames stacked in an observation (1 for recurrent agents)
    # time limit in agent steps (None: the id's registered limit; MinAtar: envs.MINATAR_MAX_EPISODE_STEPS)
    max_episode_steps: int | None = None
    # Atari and MinAtar sticky actions (None: the id's, 0.25 for Atari v5; MinAtar's own 0.1)
    repeat_action_probability: float | None = None
