"""What a saved policy does: a few episodes from a run directory's latest checkpoint.

    python -m acer_torchrl.rollout <run_dir> [--episodes 3] [--seed 123] [--obs 5]

Episodes are played as the trainer's evaluations play them (one env, whole games), greedy
(``ExplorationType.DETERMINISTIC``) and sampled; for each: its length, return, how it ended (terminated,
truncated by the time limit, or cut at ``eval.max_steps``) and, with ``--obs i``, the mean of observation
component ``i`` over the episode (e.g. 5: Hopper-v5's forward velocity of the torso).
Reads the checkpoint's weights only, not its replay. A run directory with no checkpoint (or no config) ends
with one line and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torchrl.envs.utils import ExplorationType, set_exploration_type

from acer_torchrl.checkpoint import load_checkpoint
from acer_torchrl.cli import USER_ERRORS, capped
from acer_torchrl.config import load_config
from acer_torchrl.envs import env_info, make_env
from acer_torchrl.evaluation import evaluation_env_config
from acer_torchrl.settings import get_algorithm


def episode_summary(rollout, obs_index: int | None) -> str:
    """One line on an episode: its length, return, how it ended and (``obs_index``) an observation's mean."""
    nxt = rollout.get("next")
    if bool(nxt.get("terminated")[-1]):
        end = "terminated"
    elif bool(nxt.get("truncated")[-1]):
        end = "truncated"
    else:
        end = "cut at eval.max_steps"
    text = f"length {rollout.shape[-1]:5d}  return {float(nxt.get('reward').sum()):9.1f}  {end}"
    if obs_index is not None:
        text += f"  mean obs[{obs_index}] {float(rollout.get('observation')[..., obs_index].mean()):.2f}"
    return text


def play(run_dir: Path, episodes: int, seed: int, obs_index: int | None) -> None:
    """Print ``episodes`` greedy and ``episodes`` sampled episodes of ``run_dir``'s latest checkpoint."""
    cfg = load_config(None, [f"resume={run_dir}"])
    agent = get_algorithm(cfg.loss).build(cfg, env_info(cfg.env))
    state, _ = load_checkpoint(run_dir)
    agent.loss.load_state_dict(state["loss"])
    env = make_env(evaluation_env_config(cfg.env), seed=seed, extra_transforms=agent.env_transforms)
    torch.manual_seed(seed)  # the sampled actions too: the same seed plays the same episodes
    print(f"{run_dir}: {cfg.loss} on {cfg.env.name}")
    for mode in (ExplorationType.DETERMINISTIC, ExplorationType.RANDOM):
        with torch.no_grad(), set_exploration_type(mode):
            for _ in range(episodes):
                rollout = env.rollout(cfg.eval.max_steps, agent.policy, break_when_any_done=True)
                print(f"  {'greedy ' if mode is ExplorationType.DETERMINISTIC else 'sampled'}  "
                      f"{episode_summary(rollout, obs_index)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m acer_torchrl.rollout", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--obs", type=int, default=None, help="report the mean of this observation component")
    args = parser.parse_args(argv)
    try:
        play(args.run_dir, args.episodes, args.seed, args.obs)
    except USER_ERRORS as err:
        print(f"error: {capped(str(err))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
