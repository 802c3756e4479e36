"""Greedy evaluation: the games, and where they are played (on the learner, or beside it in a process).

:func:`evaluate` plays ``eval.episodes`` games side by side with the greedy policy. The trainer asks for an
evaluation at fixed env steps and logs its result with that step's row. Where the games are played:

- :class:`InlineEvaluator`: on the learner, between updates (``eval.background=false``). The learner stops
  for as long as the games last (on CartPole ~0.8 s for ten 500-step games: about a fifth of a 50k-step run).
- :class:`BackgroundEvaluator`: in one process of its own, from a copy of the acting policy's weights taken
  when the evaluation was due; the learner goes on training and logs the row when the result comes back
  (results come back in the order asked). :meth:`~BackgroundEvaluator.drain` waits for all of them: the
  trainer drains at the end. A checkpoint waits for none: it keeps the evaluations still being played, with the
  weights each was asked on (:meth:`~BackgroundEvaluator.unfinished`), and a run resumed from it asks for them
  again (``submit(..., weights=)``). A stop is then as quick as the checkpoint's write, whatever is left to play
  (a GPU learner outruns one process playing Atari games: a stop that drained the backlog ran past its grace).

Both play the same games on the same weights from the seed the trainer asks with (:func:`evaluation_seed`:
from the run's seed and the env step): one evaluation's result depends on the weights and that seed only,
neither on where it ran nor on the evaluations before it.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import multiprocessing as mp
import os
import pickle
import queue
import sys
import traceback
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type
from tqdm import tqdm

from acer_torchrl.processes import HelperDied, died, ignore_learner_signals, learner_signals_held
from acer_torchrl.settings.env import EnvConfig

Result = tuple[Any, float, float, int]  # (the caller's tag, mean return, std of the returns, games cut at max_steps)


def evaluation_env_config(env: EnvConfig, games: int = 1) -> EnvConfig:
    """The env evaluations play: whole games (no episodic life), ``games`` of them side by side."""
    return dataclasses.replace(env, num_envs=games, episodic_life=False)


def evaluation_seed(seed: int, env_steps: int) -> int:
    """The seed of the evaluation a run seeded ``seed`` asks for at ``env_steps``: one stream per pair, apart from
    the collectors' env seeds; below 2**30, so that its games' ``seed + i`` fit ALE's int32 seeds."""
    return int(np.random.SeedSequence([seed, env_steps]).generate_state(1)[0]) >> 2


def evaluate(policy, env: EnvBase, max_steps: int, seed: int) -> tuple[float, float, int]:
    """Greedy (``ExplorationType.DETERMINISTIC``) returns of the games of ``env`` (:func:`evaluation_env_config`),
    played side by side, one policy call per step for all of them, from ``seed``: game i is seeded ``seed + i``
    and any torch draw of the policy comes from a generator seeded ``seed`` (the caller's own is left as it was).

    Each game's first episode counts, whole (all start together, so no game's length decides which
    episodes are counted); a game that ended is reset and stepped on, its steps ignored, until the last one
    ends or ``max_steps`` steps pass (a game still running then counts its return so far). Returns the mean and
    std of the returns and how many games were so cut.
    """
    games = max(env.batch_size.numel(), 1)
    returns = torch.zeros(games, dtype=torch.float64)
    finished = torch.zeros(games, dtype=torch.bool)
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        env.set_seed(seed)
        td = env.reset()
        for _ in range(max_steps):
            step, td = env.step_and_maybe_reset(policy(td))
            # a game's steps after its first episode are ignored, whatever they hold (not multiplied by 0: inf * 0 is NaN)
            returns += torch.where(finished, 0.0, step.get(("next", "reward")).reshape(games).double())
            finished |= step.get(("next", "done")).reshape(games)
            if finished.all():
                break
    return float(returns.mean()), float(returns.std(unbiased=False)), int((~finished).sum())


class InlineEvaluator:
    """Evaluations on the calling thread, at once: :meth:`submit` plays the games before it returns."""

    blocking = True  # submit() holds the caller up for the games

    def __init__(self, policy, make_env: Callable[[], EnvBase], max_steps: int):
        self.policy, self.env, self.max_steps = policy, make_env(), max_steps
        self._done: list[Result] = []

    def submit(self, tag: Any, seed: int, weights: dict | None = None) -> None:
        """Play the evaluation of the policy's current weights (or ``weights``, a state dict of the policy: an
        evaluation a checkpoint kept) from ``seed``; its result is tagged ``tag``."""
        policy = self.policy
        if weights is not None:
            policy = copy.deepcopy(policy)
            policy.load_state_dict(weights)
        self._done.append((tag, *evaluate(policy, self.env, self.max_steps, seed)))

    def unfinished(self) -> list[tuple[Any, int, dict]]:
        """None: each evaluation is played before :meth:`submit` returns."""
        return []

    def results(self) -> list[Result]:
        done, self._done = self._done, []
        return done

    drain = results

    def close(self, wait_s: float = 0.0) -> None:
        """Close the env (``wait_s``: :meth:`BackgroundEvaluator.close`'s, unused here)."""
        self.env.close()


MAX_DEATHS_IN_A_ROW = 3  # a background evaluation process dead this often, none finished between, is given up
_FAILED = "evaluation failed"  # a reply's tag when the process raised (tags are the trainer's env steps)
_OPEN: weakref.WeakSet = weakref.WeakSet()
atexit.register(lambda: [e.close() for e in list(_OPEN)])


def _serve(policy, make_env: Callable[[], EnvBase], max_steps: int, requests, replies, parent: int) -> None:
    """The evaluation process: plays the games for each ``(tag, seed, weights)`` request, replies ``(tag, mean,
    std, cut)`` (or ``(_FAILED, traceback)``); stops on ``None`` or when its parent is gone."""
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
            tag, seed, weights = request
            policy.load_state_dict(pickle.loads(weights))
            replies.put((tag, *evaluate(policy, env, max_steps, seed)))
        env.close()
    except Exception:  # noqa: BLE001  (handed to the learner, which raises it)
        replies.put((_FAILED, traceback.format_exc()))


class BackgroundEvaluator:
    """Evaluations in a process of their own, on the weights the acting policy had when they were asked for.

    A process that dies (the OOM killer's SIGKILL, a crash) is noticed at the learner's next look for results
    (after every batch, and every second while it waits for one) and started again, on new queues (the dead one may
    have held a queue's lock), with every evaluation it had not finished asked again: one line on stderr, the same
    results (an evaluation depends on its weights and seed only). One that dies :data:`MAX_DEATHS_IN_A_ROW` times
    without finishing an evaluation in between is given up (:class:`~acer_torchrl.processes.HelperDied`: the learner
    saves and stops, its checkpoint keeping what is unfinished); :meth:`drain` then plays what is left on the
    learner."""

    blocking = False

    def __init__(self, policy, make_env: Callable[[], EnvBase], max_steps: int):
        self.policy, self.make_env, self.max_steps = policy, make_env, max_steps
        self._unfinished: deque = deque()  # the requests asked and not answered yet: (tag, seed, weights)
        self._finished: list[Result] = []  # answered and not handed out yet (kept when a look ends in HelperDied)
        self._deaths_in_a_row = 0  # process deaths since the last evaluation it finished
        self._given_up = False
        self._start()
        _OPEN.add(self)

    def _start(self) -> None:
        """Start the process, on new queues, and ask it for every unfinished evaluation."""
        ctx = mp.get_context("spawn")
        self._requests, self._replies = ctx.Queue(), ctx.Queue()
        self._process = ctx.Process(
            target=_serve,
            # a copy: pickled to the process, a policy's parameters move into shared memory, so the process's
            # load_state_dict would write into the learner's live parameters (and they would change under its games)
            args=(copy.deepcopy(self.policy), self.make_env, self.max_steps, self._requests, self._replies, os.getpid()),
            daemon=True,
            name="acer-torchrl-evaluator",
        )
        with learner_signals_held():  # held from the start: a Ctrl-C during its imports must not reach it
            self._process.start()
        for request in self._unfinished:
            self._requests.put(request)

    def submit(self, tag: Any, seed: int, weights: dict | None = None) -> None:
        """Ask for the evaluation of the policy's current weights (a copy, taken now; or ``weights``, a state dict
        of the policy: an evaluation a checkpoint kept) from ``seed``; its result, tagged ``tag``, comes back through
        :meth:`results` or :meth:`drain`."""
        # by value, as bytes: tensors put on a queue as they are reach the process through file descriptors that a
        # thread of this process serves, and one the process is killed while reading (a stopping learner's close)
        # printed a traceback on the learner's stderr
        request = (tag, seed, pickle.dumps(self.policy.state_dict() if weights is None else weights))
        self._unfinished.append(request)
        self._requests.put(request)

    def unfinished(self) -> list[tuple[Any, int, dict]]:
        """The evaluations asked for and not finished yet, in the order asked: ``(tag, seed, weights)``, what a
        checkpoint keeps to ask for them again (:meth:`submit`) in the resumed run. (Finished ones are the caller's
        from its :meth:`results`, which it looks at first.)"""
        return [(tag, seed, pickle.loads(weights)) for tag, seed, weights in self._unfinished]

    def _reply(self, block: bool) -> Result | None:
        """The next finished evaluation; None when ``block`` is false and none has finished. A dead process is
        restarted here (:meth:`_restart`)."""
        while True:
            if self._given_up:
                return self._play_here() if block and self._unfinished else None
            try:
                reply = self._replies.get(timeout=1.0) if block else self._replies.get_nowait()
            except queue.Empty:
                if not self._process.is_alive():
                    self._restart()
                elif not block:
                    return None
                continue
            if reply[0] == _FAILED:
                raise RuntimeError(f"the evaluation process failed:\n{reply[1]}")
            self._unfinished.popleft()
            self._deaths_in_a_row = 0
            return reply

    def _restart(self) -> None:
        """The process died: start it again (one line on stderr), or give it up with
        :class:`~acer_torchrl.processes.HelperDied` after :data:`MAX_DEATHS_IN_A_ROW` deaths in a row."""
        death = died("the evaluation process", self._process.pid, self._process.exitcode)
        self._close_queues()
        self._deaths_in_a_row += 1
        if self._deaths_in_a_row >= MAX_DEATHS_IN_A_ROW:
            self._given_up = True
            raise HelperDied(f"{death}, {self._deaths_in_a_row} times in a row without finishing an evaluation")
        tqdm.write(f"{death}; restarted, {len(self._unfinished)} unfinished evaluation(s) asked again", file=sys.stderr)
        self._start()

    def _play_here(self) -> Result:
        """The oldest unfinished evaluation, played in this process (a given-up process's)."""
        tag, seed, weights = self._unfinished.popleft()
        policy = copy.deepcopy(self.policy)
        policy.load_state_dict(pickle.loads(weights))
        env = self.make_env()
        try:
            return (tag, *evaluate(policy, env, self.max_steps, seed))
        finally:
            env.close()

    def results(self) -> list[Result]:
        """The evaluations finished so far, in the order they were asked for (does not wait)."""
        while (reply := self._reply(block=False)) is not None:
            self._finished.append(reply)
        return self._hand_out()

    def drain(self) -> list[Result]:
        """Every evaluation asked for, waiting for those still being played."""
        while self._unfinished:
            self._finished.append(self._reply(block=True))
        return self._hand_out()

    def _hand_out(self) -> list[Result]:
        """The finished evaluations not handed out yet. Those a look got before the process was given up
        (:class:`~acer_torchrl.processes.HelperDied` from its :meth:`_reply`) come with the next look's, so that the
        learner logs every evaluation, in order."""
        done, self._finished = self._finished, []
        return done

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
        self._close_queues()

    def _close_queues(self) -> None:
        for q in (self._requests, self._replies):
            q.close()
            q.cancel_join_thread()
