"""What a saved policy does: a few episodes from a run directory's latest checkpoint.

    python benchmarks/rollout.py <run_dir> [--episodes 3] [--seed 123] [--obs 5]

Episodes are played as the trainer's evaluations play them (one env, whole games), greedy
(``ExplorationType.DETERMINISTIC``) and sampled; for each: its length, return, how it ended (terminated,
truncated by the time limit, or cut at ``eval.max_steps``) and, with ``--obs i``, the mean of observation
component ``i`` over the episode (e.g. 5: Hopper-v5's forward velocity of the torso).
Reads the checkpoint's weights only, not its replay.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torchrl.envs.utils import ExplorationType, set_exploration_type

from acer_torchrl.algorithms import get_algorithm
from acer_torchrl.checkpoint import load_checkpoint
from acer_torchrl.config import load_config
from acer_torchrl.envs import env_info, make_env
from acer_torchrl.evaluation import evaluation_env_config


def episode_summary(rollout, obs_index: int | None) -> str:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--obs", type=int, default=None, help="report the mean of this observation component")
    args = parser.parse_args()

    cfg = load_config(None, [f"resume={args.run_dir}"])
    agent = get_algorithm(cfg.loss).build(cfg, env_info(cfg.env))
    state, _ = load_checkpoint(args.run_dir)
    agent.loss.load_state_dict(state["loss"])
    env = make_env(evaluation_env_config(cfg.env), seed=args.seed, extra_transforms=agent.env_transforms)
    print(f"{args.run_dir}: {cfg.loss} on {cfg.env.name}")
    for mode in (ExplorationType.DETERMINISTIC, ExplorationType.RANDOM):
        with torch.no_grad(), set_exploration_type(mode):
            for _ in range(args.episodes):
                rollout = env.rollout(cfg.eval.max_steps, agent.policy, break_when_any_done=True)
                print(f"  {'greedy ' if mode is ExplorationType.DETERMINISTIC else 'sampled'}  "
                      f"{episode_summary(rollout, args.obs)}")


if __name__ == "__main__":
    main()
