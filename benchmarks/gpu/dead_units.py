"""Whether a weights file's network still tells states apart: the share of each ReLU layer's units (a conv layer's
channels) that are off on every one of N states a random policy met, and how much the policy varies across them.
A network whose units are all off outputs the same policy in every state: ACER's Pong run of 2.63M steps with Adam
1e-3 ended so, greedy -21 throughout (``benchmarks/results/gpu.md``, 2026-11-28). The window prints it after each
Pong piece; a freshly initialised network of the same preset (``--weights init``) is the reference.

usage: python benchmarks/gpu/dead_units.py ALGO WEIGHTS [--states 600] [key=value ...]   (WEIGHTS: a file of
cut_weights.py, or init)
"""

import argparse
import dataclasses

import torch
from tensordict import TensorDict
from torch import nn
from torchrl.envs.utils import RandomPolicy

from acer_torchrl.checkpoint import load_weights
from acer_torchrl.config import load_config
from acer_torchrl.envs import env_info, make_env
from acer_torchrl.objectives.names import BEHAVIOUR
from acer_torchrl.settings import get_algorithm


def states_of_a_random_policy(env_cfg, count: int, seed: int = 5) -> torch.Tensor:
    """``count`` observations met by a uniform random policy in 4 games of ``env_cfg``'s env."""
    env = make_env(dataclasses.replace(env_cfg, num_envs=4), seed=seed)
    steps = -(-count // 4)
    observations = env.rollout(steps, RandomPolicy(env.action_spec), break_when_any_done=False)["observation"]
    env.close()
    return observations.flatten(0, 1)[:count]


def relu_activity(policy: nn.Module, observations: torch.Tensor) -> tuple[list[tuple[str, int, int]], dict]:
    """Per ReLU of ``policy`` (in call order): its name, its units off on every state, its units; and the policy's
    outputs on ``observations``."""
    seen, hooks = [], []
    for name, module in policy.named_modules():
        if isinstance(module, nn.ReLU):
            def record(_module, _inputs, out, name=name):
                on = (out > 0).flatten(2).any(-1) if out.ndim == 4 else out > 0  # a channel is on anywhere
                seen.append((name, int((~on.any(0)).sum()), on.shape[-1]))
            hooks.append(module.register_forward_hook(record))
    with torch.no_grad():
        outputs = policy(TensorDict({"observation": observations}, batch_size=observations.shape[:1]))
    for hook in hooks:
        hook.remove()
    return seen, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("algo")
    parser.add_argument("weights", help="a weights file of cut_weights.py, or init (the preset's initialisation)")
    parser.add_argument("--states", type=int, default=600)
    args, overrides = parser.parse_known_args()
    torch.manual_seed(0)
    if args.weights == "init":
        cfg = load_config(args.algo, ["device=cpu", *overrides])
    else:
        weights = load_weights(args.weights)
        cfg = load_config(args.algo, [f"env.name={weights['env']}", "device=cpu", *overrides])
    agent = get_algorithm(cfg.loss).build(cfg, env_info(cfg.env))
    if args.weights != "init":
        agent.loss.load_state_dict(weights["loss"], strict=False)
    layers, outputs = relu_activity(agent.policy, states_of_a_random_policy(cfg.env, args.states))
    for name, off, units in layers:
        print(f"{name}: {off}/{units} units off on all {args.states} states ({off / units:.0%})")
    stats = outputs[BEHAVIOUR]  # the policy's statistics as acting writes them (modules.py)
    if "logits" in stats.keys():
        pi = stats["logits"].softmax(-1)
        greedy = torch.bincount(pi.argmax(-1), minlength=pi.shape[-1]).tolist()
        print(f"policy: std across states {pi.std(0).max():.4f} (largest over actions); greedy actions {greedy}")
    else:
        print(f"policy: std of the mean action across states {stats['loc'].std(0).max():.4f} (largest over dims)")


if __name__ == "__main__":
    main()
