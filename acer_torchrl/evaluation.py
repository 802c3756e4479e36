"""Greedy evaluation: the games, and where they are played (on the learner, or beside it in a process).

:func:`evaluate` plays ``eval.episodes`` games side by side with the greedy policy. The trainer asks for an
evaluation at fixed env steps and logs its result with that step's row. Where the games are played:

- :class:`InlineEvaluator`: on the learner, between updates (``eval.background=false``). The learner stops
  for as long as the games last (on CartPole ~0.8 s for ten 500-step games: about a fifth of a 50k-step run).
- :class:`BackgroundEvaluator`: in one process of its own, from a copy of the acting policy's weights taken
  when the evaluation was due; the learner goes on training and logs the row when the result comes back
  (results come back in the order asked). :meth:`~BackgroundEvaluator.drain` waits for all of them: the
  trainer drains before each checkpoint and at the end, so a checkpoint's ``metrics.csv`` holds every
  evaluation up to its step and a run resumed from it re-asks for the later ones.

Both play the same games from the same seed on the same weights: one evaluation's result does not depend
on where it ran.
"""

from __future__ import annotations

import atexit
import dataclasses
import multiprocessing as mp
import os
import queue
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from acer_torchrl.processes import ignore_learner_signals, learner_signals_held
from acer_torchrl.settings.env import EnvConfig

Result = tuple[Any, float, float]  # (the caller's tag, mean return, std of the returns)


def evaluation_env_config(env: EnvConfig, games: int = 1) -> EnvConfig:
    """The env evaluations play: whole games (no episodic life), ``games`` of them side by side."""
    return dataclasses.replace(env, num_envs=games, episodic_life=False)


def evaluate(policy, env: EnvBase, max_steps: int) -> tuple[float, float]:
    """Greedy (``ExplorationType.DETERMINISTIC``) returns of the games of ``env`` (:func:`evaluation_env_config`),
    played side by side, one policy call per step for all of them.

    Each game's first episode counts, whole (all start together, so no game's length decides which
    episodes are counted); a game that ended is reset and stepped on, its steps ignored, until the last one
    ends or ``max_steps`` steps pass (a game still running then counts its return so far).
    """
    games = max(env.batch_size.numel(), 1)
    returns = torch.zeros(games, dtype=torch.float64)
    finished = torch.zeros(games, dtype=torch.bool)
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        td = env.reset()
        for _ in range(max_steps):
            step, td = env.step_and_maybe_reset(policy(td))
            returns += step.get(("next", "reward")).reshape(games).double() * ~finished
            finished |= step.get(("next", "done")).reshape(games)
            if finished.all():
                break
    return float(returns.mean()), float(returns.std(unbiased=False))


class InlineEvaluator:
    """Evaluations on the calling thread, at once: :meth:`submit` plays the games before it returns."""

    blocking = True  # submit() holds the caller up for the games

    def __init__(self, policy, make_env: Callable[[], EnvBase], max_steps: int):
        self.policy, self.env, self.max_steps = policy, make_env(), max_steps
        self._done: list[Result] = []

    def submit(self, tag: Any) -> None:
        self._done.append((tag, *evaluate(self.policy, self.env, self.max_steps)))

    def results(self) -> list[Result]:
        done, self._done = self._done, []
        return done

    drain = results

    def close(self, wait_s: float = 0.0) -> None:
        """Close the env (``wait_s``: :meth:`BackgroundEvaluator.close`'s, unused here)."""
        self.env.close()


_FAILED = "evaluation failed"  # a reply's tag when the process raised (tags are the trainer's env steps)
_OPEN: weakref.WeakSet = weakref.WeakSet()
atexit.register(lambda: [e.close() for e in list(_OPEN)])


def _serve(policy, make_env: Callable[[], EnvBase], max_steps: int, requests, replies, parent: int) -> None:
    """The evaluation process: plays the games for each ``(tag, weights)`` request, replies ``(tag, mean,
    std)`` (or ``(_FAILED, traceback)``); stops on ``None`` or when its parent is gone."""
    ignore_learner_signals()  # held since its start (learner_signals_held), ignored from here
    torch.set_num_threads(1)
    # below the learner and the collector workers: its games (10 of up to 1 000 steps for a MuJoCo task, ~5 s of
    # CPU) take a core from neither while they play, where every update waits on the learner's core
    os.nice(10)
    try:
        env = make_env()
        while os.getppid() == parent:
            try:
                request = requests.get(timeout=1.0)
            except queue.Empty:
                continue
            if request is None:
                break
            tag, weights = request
            policy.load_state_dict(weights)
            replies.put((tag, *evaluate(policy, env, max_steps)))
        env.close()
    except Exception:  # noqa: BLE001  (handed to the learner, which raises it)
        replies.put((_FAILED, traceback.format_exc()))


class BackgroundEvaluator:
    """Evaluations in a process of their own, on the weights the acting policy had when they were asked for."""

    blocking = False

    def __init__(self, policy, make_env: Callable[[], EnvBase], max_steps: int):
        ctx = mp.get_context("spawn")
        self.policy = policy
        self._requests, self._replies = ctx.Queue(), ctx.Queue()
        self._pending = 0
        self._process = ctx.Process(
            target=_serve,
            args=(policy, make_env, max_steps, self._requests, self._replies, os.getpid()),
            daemon=True,
            name="acer-torchrl-evaluator",
        )
        with learner_signals_held():  # held from the start: a Ctrl-C during its imports must not reach it
            self._process.start()
        _OPEN.add(self)

    def submit(self, tag: Any) -> None:
        weights = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
        self._requests.put((tag, weights))
        self._pending += 1

    def _reply(self, block: bool) -> Result | None:
        """The next finished evaluation; None when ``block`` is false and none has finished."""
        while True:
            try:
                reply = self._replies.get(timeout=1.0) if block else self._replies.get_nowait()
            except queue.Empty:
                if not block:
                    return None
                if not self._process.is_alive():
                    raise RuntimeError(f"the evaluation process died (exit code {self._process.exitcode})") from None
                continue
            if reply[0] == _FAILED:
                raise RuntimeError(f"the evaluation process failed:\n{reply[1]}")
            self._pending -= 1
            return reply

    def results(self) -> list[Result]:
        """The evaluations finished so far, in the order they were asked for (does not wait)."""
        done = []
        while self._pending and (reply := self._reply(block=False)) is not None:
            done.append(reply)
        return done

    def drain(self) -> list[Result]:
        """Every evaluation asked for, waiting for those still being played."""
        return [self._reply(block=True) for _ in range(self._pending)]

    def close(self, wait_s: float = 10.0) -> None:
        """Stop the process: asked to end, killed after ``wait_s`` (a stopping learner gives it little: one
        that is still starting up reads the request only when its imports are done)."""
        _OPEN.discard(self)
        if self._process.is_alive():
            self._requests.put(None)
            self._process.join(timeout=wait_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        for q in (self._requests, self._replies):
            q.close()
            q.cancel_join_thread()
