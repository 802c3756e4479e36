"""The final score (a run's mean greedy return over the last 10 % of its env steps) against a plain
reading of its definition, and the trainer's evaluation schedule that fills its window."""

import csv
import json
import os
import signal
from collections import deque
from types import SimpleNamespace

import numpy as np

import pytest
import torch
from tensordict.nn import TensorDictModule
from torchrl.envs import Transform

from acer_torchrl.config import load_config
from acer_torchrl.envs import make_env
from acer_torchrl.metrics import final_score, final_window_steps
from acer_torchrl.evaluation import (MAX_DEATHS_IN_A_ROW, BackgroundEvaluator, InlineEvaluator, evaluate,
                                    evaluation_env_config)
from acer_torchrl.processes import HelperDied


def plain_final_score(curve, env_steps):
    """The definition, spelled out: evaluations at or after 90 % of the run; if fewer than three, the last three."""
    inside = [ret for step, ret in curve if step >= 0.9 * env_steps]
    if len(inside) < 3:
        inside = [ret for _, ret in curve][-3:]
    return sum(inside) / len(inside), len(inside)


@pytest.mark.parametrize(
    "curve, env_steps",
    [
        ([(s, float(s % 7)) for s in range(2500, 50_001, 2500)], 50_000),  # periodic, the window holds 3
        ([(2500 * i, 500.0 - i) for i in range(1, 21)] + [(45_000, 480.0), (47_500, 470.0)], 50_000),  # extra points
        ([(10_000, 1.0), (20_000, 2.0), (30_000, 3.0), (40_000, 4.0)], 40_000),  # one in the window: the last 3
        ([(5, 7.0), (10, 8.0)], 10),  # shorter than three evaluations: all of them
    ],
)
def test_final_score_matches_its_definition(curve, env_steps):
    expected, count = plain_final_score(sorted(curve), env_steps)
    score = final_score(curve, env_steps)
    assert score.mean == pytest.approx(expected)
    assert score.evaluations == count
    assert score.last == sorted(curve)[-1][1]


def test_final_score_is_not_the_first_touch_or_the_best():
    """A run that touched 500 and fell is scored by where it ended."""
    curve = [(2500 * i, r) for i, r in enumerate([20, 200, 500, 500, 500, 317, 306, 258, 228, 230], 1)]
    score = final_score(curve, 25_000)
    assert score.mean == pytest.approx((258 + 228 + 230) / 3)
    assert final_score([], 100) is None


def test_final_window_steps():
    assert final_window_steps(50_000, 80) == [45_000, 47_500, 50_000]
    assert final_window_steps(1000, 50) == [900, 950, 1000]
    assert final_window_steps(1000, 80) == [840, 920, 1000]  # two batches in the window: the last three
    assert final_window_steps(64, 32) == [32, 64]


def test_every_run_length_evaluates_its_final_window_as_fully_as_its_batches_allow():
    """The trainer's schedule, batch by batch, for run lengths that are and are not whole batches: three evaluations
    in the final score's window (the last 10 % of the env steps the run ends at) once it holds three batch ends, and
    every one of the last three batches evaluated when it holds fewer (the final score averages those)."""
    from acer_torchrl.trainer import Trainer

    for per_batch in (8, 77):
        for total_frames in range(1, 40 * per_batch, max(1, per_batch // 5)):  # from 1 batch to 40 (the window: 4)
            cfg = SimpleNamespace(total_frames=total_frames, collector=SimpleNamespace(frames_per_batch=per_batch))
            ends = range(per_batch, total_frames + per_batch, per_batch)  # the last one reaches total_frames
            evaluated = [e for e in ends if Trainer._final_window_due(SimpleNamespace(cfg=cfg), e - per_batch, e)]
            window = [e for e in ends if e >= 0.9 * ends[-1]]
            assert len(set(evaluated) & set(window)) == min(3, len(window)), (total_frames, per_batch, evaluated)
            if len(window) < 3:
                assert evaluated == list(ends[-3:]), (total_frames, per_batch, evaluated)


def test_a_final_window_evaluation_leaves_the_periodic_one_after_it_in_place():
    """LASER's CartPole preset (60 000 steps, batches of 64, an evaluation every 5 000): the rows of the trainer's
    schedule, batch by batch. The final window's points (54 080, 57 088, 60 032) come on top of the periodic
    evaluations: the one at 55 040 stays (before, the window point at 54 080 moved it to 60 032)."""
    from acer_torchrl.trainer import Trainer, next_periodic_evaluation

    per_batch, interval, total = 64, 5_000, 60_000
    trainer = SimpleNamespace(cfg=SimpleNamespace(total_frames=total, collector=SimpleNamespace(frames_per_batch=per_batch)))
    rows, next_eval = [], interval
    for end in range(per_batch, total + per_batch, per_batch):
        if end >= next_eval or Trainer._final_window_due(trainer, end - per_batch, end):
            rows.append(end)
            next_eval = next_periodic_evaluation(next_eval, end, interval)
    assert [r for r in rows if r >= 0.9 * rows[-1]] == [54_080, 55_040, 57_088, 60_032]
    assert rows[:3] == [5_056, 10_048, 15_040] and len(rows) == 12 + 2  # every interval's, and two window points


@pytest.mark.integration
def test_short_run_evaluates_three_times_in_its_final_window(tmp_path):
    """With evaluations far apart (eval.interval beyond the run) the trainer still evaluates at 90, 95 and
    100 % of total_frames, and summary.json carries the final score, the last evaluation and their count; the
    logged step size follows optim.lr_end_factor."""
    from acer_torchrl.cli import run

    summary = run("acer", ["total_frames=640", "collector.workers=0", "collector.frames_per_batch=16",
                           "replay.min_size=64", "replay.batch_size=4", "network.hidden=[16]", "eval.interval=100000",
                           "eval.episodes=2", "eval.max_steps=50", "log.progress=false", f"run_dir={tmp_path}",
                           "optim.lr=0.001", "optim.lr_end_factor=0.5"])
    rows = [r.split(",") for r in (tmp_path / "metrics.csv").read_text().splitlines()]
    column = rows[0].index("eval_return_mean")
    evaluations = [(int(float(r[0])), float(r[column])) for r in rows[1:] if r[column]]
    assert [s for s, _ in evaluations] == [576, 608, 640]  # the batches that crossed 576, 608 and 640
    assert summary["final_score_evaluations"] == 3 and summary["final_score_from_step"] == 576
    assert summary["eval_return_mean"] == pytest.approx(sum(r for _, r in evaluations) / 3)
    assert summary["eval_return_last"] == evaluations[-1][1]
    assert json.loads((tmp_path / "summary.json").read_text())["eval_episodes"] == 2
    assert summary["eval_max_steps"] == 50
    # each evaluation's row says what it played (a resume may change eval.episodes and eval.max_steps)
    played = {(r[rows[0].index("eval_episodes")], r[rows[0].index("eval_max_steps")]) for r in rows[1:] if r[column]}
    assert played == {("2", "50")}
    # and how many of its games eval.max_steps cut: summary.json counts those of the final score's evaluations
    cut = [int(r[rows[0].index("eval_games_cut")]) for r in rows[1:] if r[column]]
    assert summary["final_score_games_cut"] == sum(cut)
    # the last update (in the batch that reached total_frames) stepped with lr x lr_end_factor
    assert float(rows[-1][rows[0].index("lr")]) == pytest.approx(0.0005)


@pytest.mark.integration
def test_evaluation_games_cut_at_max_steps_are_counted_and_said(tmp_path, capsys):
    """``eval.max_steps`` below a game's length (no CartPole game ends within 5 steps): every game is cut, its
    return so far counted; each row says how many, summary.json sums the final score's, and one note says so."""
    from acer_torchrl.cli import run

    summary = run("acer", ["total_frames=128", "collector.workers=0", "collector.frames_per_batch=32",
                           "replay.min_size=64", "replay.batch_size=4", "network.hidden=[16]", "eval.interval=64",
                           "eval.episodes=3", "eval.max_steps=5", "eval.background=false", "log.progress=false",
                           f"run_dir={tmp_path}"])
    rows = [r for r in csv.DictReader((tmp_path / "metrics.csv").open()) if r["eval_return_mean"]]
    assert [(r["eval_return_mean"], r["eval_games_cut"]) for r in rows] == [("5.0", "3")] * len(rows) and len(rows) >= 3
    assert summary["final_score_games_cut"] == 3 * summary["final_score_evaluations"]
    notes = [line for line in capsys.readouterr().err.splitlines() if "eval_games_cut" in line]
    assert notes == [f"note: 3 of the 3 greedy games of the evaluation at {rows[0]['env_steps']} env steps were still "
                     "running after eval.max_steps=5 steps; their returns so far count (metrics.csv: eval_games_cut); "
                     "raise eval.max_steps to the env's own step limit"]


def test_summary_names_every_evaluation_setting_its_final_window_mixed():
    """A resume that changed eval.episodes inside the final window: summary.json lists both counts, not the last."""
    from acer_torchrl.metrics import window_settings

    def row(steps, episodes=None):
        return {"env_steps": steps, "eval_return_mean": 1.0, **({"eval_episodes": episodes} if episodes else {}),
                "eval_max_steps": 100}

    rows = [row(500, 5), {"env_steps": 560, "loss_critic": 0.5}, row(576, 10), row(608, 10), row(640, 5)]
    defaults = {"eval_episodes": 5, "eval_max_steps": 100}
    assert window_settings(rows, 576, defaults) == {"eval_episodes": [5, 10], "eval_max_steps": 100}
    assert window_settings(rows, 600, {"eval_episodes": 10, "eval_max_steps": 100})["eval_episodes"] == [5, 10]
    assert window_settings(rows[:4], 576, defaults) == {"eval_episodes": 10, "eval_max_steps": 100}
    # rows logged before rows recorded their settings count as the run's current ones
    assert window_settings([row(640)], 576, defaults)["eval_episodes"] == 5


def test_linear_lr_schedule_reaches_its_end_factor(tmp_path):
    """optim.lr_end_factor: the step size an update uses falls linearly with the env steps, from optim.lr at
    the start to lr x lr_end_factor at total_frames (and stays there if a resumed run goes on)."""
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer

    trainer = Trainer(load_config("acer", ["total_frames=1000", "optim.lr=0.002", "optim.lr_end_factor=0.25",
                                           "collector.workers=0", f"run_dir={tmp_path}", "log.progress=false"]))
    for steps, factor in ((0, 1.0), (500, 0.625), (1000, 0.25), (4000, 0.25)):
        trainer.counters.env_steps = steps
        assert trainer.lr_schedule() == pytest.approx(factor)
    constant = Trainer(load_config("acer", ["total_frames=1000", "collector.workers=0", f"run_dir={tmp_path}/c"]))
    constant.counters.env_steps = 700
    assert constant.lr_schedule() == 1.0


class AngleOnly(torch.nn.Module):
    """A deterministic CartPole policy of middling skill: episodes of different lengths per seed."""

    def forward(self, observation):
        return (observation[..., 2] > 0).long()


@pytest.mark.parametrize("max_steps", [10_000, 30])
def test_evaluation_plays_each_games_first_episode(max_steps):
    """The side-by-side evaluation equals one episode per game played alone from the same seed (game i of
    an evaluation seeded s is seeded s + i), capped at ``eval.max_steps`` steps; the same again from that seed,
    whatever was played before, and the caller's torch generator is left as it was."""
    cfg = load_config("acer", ["preset=cartpole", "eval.episodes=6", f"eval.max_steps={max_steps}"])
    policy = TensorDictModule(AngleOnly(), in_keys=["observation"], out_keys=["action"])
    env = make_env(evaluation_env_config(cfg.env, games=6))
    torch_state = torch.get_rng_state()
    mean, std, cut = evaluate(policy, env, cfg.eval.max_steps, seed=40)
    assert torch.equal(torch.get_rng_state(), torch_state)
    evaluate(policy, env, cfg.eval.max_steps, seed=41)
    assert evaluate(policy, env, cfg.eval.max_steps, seed=40) == (mean, std, cut)
    alone, ended = [], 0
    for i in range(6):
        single = make_env(evaluation_env_config(cfg.env), seed=40 + i)
        rollout = single.rollout(max_steps, policy, break_when_any_done=True)
        alone.append(float(rollout.get(("next", "reward")).sum()))
        ended += bool(rollout.get(("next", "done"))[-1])
    assert len(set(alone)) > 1 or max_steps == 30  # the games differ: a mean over the wrong episodes would show
    assert mean == pytest.approx(np.mean(alone))
    assert std == pytest.approx(np.std(alone))
    assert cut == 6 - ended and (cut > 0) == (max_steps == 30)  # the games eval.max_steps cut before they ended


class Lean(torch.nn.Module):
    """A linear CartPole policy (greedy: the larger of two scores); its weights decide how well it plays."""

    def __init__(self):
        super().__init__()
        self.score = torch.nn.Linear(4, 2)

    def forward(self, observation):
        return self.score(observation).argmax(-1)


@pytest.mark.integration
def test_background_evaluations_equal_inline_ones_on_the_weights_they_were_asked_with(monkeypatch):
    """The evaluation process plays the same games from the same seed as the learner would, on a copy of the
    weights taken when asked (the learner changes them right after, and the process's loading them leaves the
    learner's alone), and returns results in order; it runs at a lower priority than the learner. The weights
    travel by value: no file descriptor for the learner's resource sharer to serve (a process killed while
    fetching one made that thread print a traceback on the learner's stderr)."""
    from multiprocessing import context, reduction

    from acer_torchrl.envs import make_env_fn

    served_fds = []

    def dup_fd(fd, dup=reduction.DupFd):  # torch's tensor reduction shares each storage's file descriptor here
        if context.get_spawning_popen() is None:  # not passed with a process's start: the resource sharer serves it
            served_fds.append(fd)
        return dup(fd)

    monkeypatch.setattr(reduction, "DupFd", dup_fd)

    cfg = load_config("acer", ["preset=cartpole", "eval.episodes=4", "eval.max_steps=200"])
    env_fn = make_env_fn(evaluation_env_config(cfg.env, games=4))
    policy = TensorDictModule(Lean(), in_keys=["observation"], out_keys=["action"])
    weights = [torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]), torch.zeros(2, 4), torch.randn(2, 4)]
    inline, background = InlineEvaluator(policy, env_fn, 200), BackgroundEvaluator(policy, env_fn, 200)
    try:
        for step, w in enumerate(weights):
            with torch.no_grad():
                policy.module.score.weight.copy_(w)
            inline.submit(step, seed=7)
            background.submit(step, seed=7)
        with torch.no_grad():
            policy.module.score.weight.fill_(3.0)  # after asking: must not reach the evaluations asked before
        expected = inline.results()
        got = background.results() + background.drain()
        assert [r[0] for r in got] == [0, 1, 2]
        assert got == expected
        assert len({r[1] for r in expected}) > 1  # the weights made a difference
        assert background.drain() == [] and inline.drain() == []
        assert served_fds == []
        assert bool((policy.module.score.weight == 3.0).all())  # not the weights the process loaded
        # its games below the learner's and the workers' priority (they take no core from an update)
        learner = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, background._process.pid) == min(learner + 10, 19)
    finally:
        inline.close()
        background.close()


@pytest.mark.integration
def test_the_evaluations_a_checkpoint_keeps_are_played_again_on_the_weights_they_were_asked_with():
    """``unfinished()`` gives the evaluations not played yet with the weights each was asked on (what a checkpoint
    keeps); ``submit(..., weights=)`` plays those weights, not the policy's current ones, in the process and on the
    learner alike (what the resumed run asks), and leaves the policy's own weights as they are."""
    from acer_torchrl.envs import make_env_fn

    cfg = load_config("acer", ["preset=cartpole"])
    env_fn = make_env_fn(evaluation_env_config(cfg.env, games=4))
    policy = TensorDictModule(Lean(), in_keys=["observation"], out_keys=["action"])
    inline, background = InlineEvaluator(policy, env_fn, 200), BackgroundEvaluator(policy, env_fn, 200)
    try:
        with torch.no_grad():
            policy.module.score.weight.copy_(torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]))
        background.submit(0, seed=7)
        [(tag, seed, kept)] = background.unfinished()
        assert (tag, seed) == (0, 7) and torch.equal(kept["module.score.weight"], policy.module.score.weight)
        assert inline.unfinished() == []
        with torch.no_grad():
            policy.module.score.weight.fill_(3.0)  # the learner moved on
        inline.submit(0, seed=7, weights=kept)
        background.submit(1, seed=7, weights=kept)
        [first, again] = background.drain()
        assert first[1:] == again[1:] == inline.results()[0][1:]
        inline.submit(2, seed=7)  # the current weights play other games
        assert inline.results()[0][1:] != first[1:]
        assert bool((policy.module.score.weight == 3.0).all())
    finally:
        inline.close()
        background.close()


@pytest.mark.integration
def test_a_killed_evaluation_process_plays_its_unfinished_evaluations_again_until_it_is_given_up(capsys):
    """SIGKILL to the evaluation process (the OOM killer's): the learner's next look starts it again and asks it for
    the evaluations it had not finished, which come back as they would have; killed MAX_DEATHS_IN_A_ROW times with
    none finished between, it is given up (HelperDied: the learner saves and stops) and what is left is played on
    the learner, the same games."""
    from acer_torchrl.envs import make_env_fn

    cfg = load_config("acer", ["preset=cartpole"])
    env_fn = make_env_fn(evaluation_env_config(cfg.env, games=2))
    policy = TensorDictModule(Lean(), in_keys=["observation"], out_keys=["action"])
    inline, background = InlineEvaluator(policy, env_fn, 100), BackgroundEvaluator(policy, env_fn, 100)

    def kill() -> int:
        pid = background._process.pid
        os.kill(pid, signal.SIGKILL)
        background._process.join()
        return pid

    try:
        for step in range(2):
            inline.submit(step, seed=7)
            background.submit(step, seed=7)
        pid = kill()
        assert background.results() == []
        restarted = f"the evaluation process (pid {pid}) died (killed by SIGKILL); restarted, 2 unfinished evaluation(s) asked again"
        assert capsys.readouterr().err.strip() == restarted
        assert background.drain() == inline.results()
        inline.submit(2, seed=8)
        background.submit(2, seed=8)
        for _ in range(MAX_DEATHS_IN_A_ROW - 1):
            kill()
            assert background.results() == []
        pid = kill()
        with pytest.raises(HelperDied, match=rf"^the evaluation process \(pid {pid}\) died \(killed by SIGKILL\), "
                                             rf"{MAX_DEATHS_IN_A_ROW} times in a row without finishing an evaluation; "
                                             "nothing to save yet$"):
            background.results()
        assert background.drain() == inline.results()
    finally:
        inline.close()
        background.close()


def test_evaluations_finished_before_the_process_is_given_up_are_handed_out_with_the_next_look():
    """A drain that got evaluation 0 and then gave the process up (HelperDied at the third death in a row) keeps 0:
    the learner's next look (its checkpoint's, playing the rest here) returns 0 and 1 in order. Before, 0 was lost and
    the learner's rows for the two no longer matched their results."""
    evaluator = BackgroundEvaluator.__new__(BackgroundEvaluator)  # no process: its replies are scripted
    evaluator._unfinished = deque([(0, 7, b""), (1, 8, b"")])
    evaluator._finished = []
    replies = iter([(0, 1.0, 0.0, 0), HelperDied("the evaluation process died, 3 times in a row"), (1, 2.0, 0.0, 0)])

    def reply(block):
        if not evaluator._unfinished:
            return None
        answer = next(replies)
        if isinstance(answer, HelperDied):
            raise answer
        evaluator._unfinished.popleft()
        return answer

    evaluator._reply = reply
    with pytest.raises(HelperDied):
        evaluator.drain()
    assert evaluator.drain() == [(0, 1.0, 0.0, 0), (1, 2.0, 0.0, 0)]
    assert evaluator.drain() == [] and evaluator.results() == []


@pytest.mark.integration
def test_a_failing_evaluation_process_raises_on_the_learner():
    from acer_torchrl.envs import make_env_fn

    cfg = load_config("acer", ["preset=cartpole"])
    env_fn = make_env_fn(evaluation_env_config(cfg.env, games=2))
    broken = TensorDictModule(torch.nn.Linear(3, 2), in_keys=["observation"], out_keys=["action"])  # 4 inputs
    evaluator = BackgroundEvaluator(broken, env_fn, 10)
    try:
        evaluator.submit(0, seed=0)
        with pytest.raises(RuntimeError, match="evaluation process failed"):
            evaluator.drain()
    finally:
        evaluator.close()


def test_every_metric_row_reaches_the_torchrl_loggers(tmp_path):
    """TensorBoard / W&B go through ``torchrl.record.loggers``; TorchRL's own CSVLogger stands in for them
    (no optional package): each row's metrics arrive at its env steps, and metrics.csv keeps every row."""
    from torchrl.record.loggers.csv import CSVLogger

    from acer_torchrl.metrics import MetricsLog

    logger = CSVLogger(exp_name="run", log_dir=str(tmp_path / "logs"))
    log = MetricsLog(tmp_path, [logger])
    log.row(1000, 10, 1.5, {"loss_critic": 0.25, "eval_return_mean": 9.0})
    log.row(2000, 20, 3.0, {"loss_critic": 0.125})
    scalars = tmp_path / "logs" / "run" / "scalars"
    assert (scalars / "loss_critic.csv").read_text().split() == ["1000,0.25", "2000,0.125"]
    assert (scalars / "eval_return_mean.csv").read_text().split() == ["1000,9.0"]
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0].startswith("env_steps,updates,wall_time_s,loss_critic")


def test_a_resumed_runs_tensorboard_hides_the_points_the_killed_run_logged_after_its_checkpoint(tmp_path):
    """As metrics.csv drops the killed segment's rows (``MetricsLog.load_existing``), TensorBoard (read back by its
    own reader) shows each env step once: the resumed run's point at 2500, not also the killed run's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from acer_torchrl.metrics import MetricsLog, make_loggers

    def segment(resumed_at, rows):
        log = MetricsLog(tmp_path, make_loggers(tmp_path, tensorboard=True, resumed_at=resumed_at))
        for steps, value in rows:
            log.row(steps, steps // 10, 1.0, {"eval_return_mean": value})
        for logger in log.loggers:
            logger.experiment.close()

    segment(None, [(1000, 1.0), (2000, 2.0), (2500, 2.5)])  # killed after 2500, its checkpoint at 2000
    segment(2000, [(2500, 25.0), (3000, 30.0)])
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("eval_return_mean")] == [
        (1000, 1.0), (2000, 2.0), (2500, 25.0), (3000, 30.0)]


@pytest.mark.parametrize("key", ["tensorboard", "wandb"])
def test_a_logger_without_its_package_is_a_one_line_config_error(key, monkeypatch):
    import importlib.util

    from acer_torchrl.validation import ConfigError

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == key else find_spec(name, *a))
    with pytest.raises(ConfigError, match=rf"^log\.{key}=true needs the {key} package: pip install 'acer-torchrl\[{key}\]'$"):
        load_config("acer", [f"log.{key}=true"])


def test_a_resumed_log_rewrites_its_older_rows_as_they_were(tmp_path):
    """Counts stay ints (``2560``, not ``2560.0``) when a resumed run rewrites the rows before its checkpoint."""
    from acer_torchrl.metrics import MetricsLog

    log = MetricsLog(tmp_path, [])
    log.row(2560, 40, 12.5, {"loss_critic": 0.25, "eval_return_mean": 9.0})
    log.row(5120, 80, 25.125, {"loss_critic": 0.125})
    before = (tmp_path / "metrics.csv").read_text()
    resumed = MetricsLog(tmp_path, [])
    resumed.load_existing(5120)
    resumed.write(list(resumed.rows[0]))
    assert (tmp_path / "metrics.csv").read_text() == before and "2560," in before


def test_a_resume_leaves_in_metrics_csv_only_the_rows_up_to_its_checkpoint(tmp_path):
    """The killed run's rows after its checkpoint (evaluations of weights no checkpoint holds) leave the file at the
    resume, not once the resumed run logs its first row (an interval later); quietly: a kill is no damage."""
    from acer_torchrl.metrics import MetricsLog

    log = MetricsLog(tmp_path, [])
    for steps in (1000, 2000, 3000):
        log.row(steps, steps // 10, steps / 100, {"eval_return_mean": steps / 1000})
    resumed = MetricsLog(tmp_path, [])
    assert resumed.load_existing(2000) is None
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in lines] == ["env_steps", "1000", "2000"]


def test_a_checkpoint_writes_the_rows_again_after_a_failed_write(tmp_path, monkeypatch, capsys):
    """A row whose write failed (a full disk) is on disk once a checkpoint comes, not only with the next row: a
    resume from that checkpoint reads back every row up to it."""
    import os

    from acer_torchrl.metrics import MetricsLog

    log = MetricsLog(tmp_path, [])
    log.row(1000, 100, 1.0, {"eval_return_mean": 1.0})
    real_replace = os.replace

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    log.row(2000, 200, 2.0, {"eval_return_mean": 2.0})
    assert "warning: cannot write" in capsys.readouterr().err
    monkeypatch.setattr(os, "replace", real_replace)
    log.flush()  # what Trainer.checkpoint does
    resumed = MetricsLog(tmp_path, [])
    resumed.load_existing(2000)
    assert [r["env_steps"] for r in resumed.rows] == [1000, 2000]


class NotFiniteAfterTheFirstEpisode(Transform):
    """Every reward of a game after its first episode ended is NaN or inf (a game that blew up once reset)."""

    def __init__(self, games: int):
        super().__init__()
        self.ended = torch.zeros(games, dtype=torch.bool)

    def _step(self, tensordict, next_tensordict):
        reward = next_tensordict.get("reward").clone()
        bad = torch.tensor([float("nan"), float("inf")]).repeat(reward.shape[0])[: reward.shape[0]]
        reward[self.ended] = bad[self.ended].reshape(-1, 1)
        next_tensordict.set("reward", reward)
        self.ended |= next_tensordict.get("done").reshape(-1)
        return next_tensordict


def test_an_evaluation_ignores_whatever_a_game_holds_after_its_first_episode():
    """The steps a game is played on after its first episode are ignored, NaN and inf rewards too (they used to be
    multiplied by 0, and NaN * 0, inf * 0 are NaN): the same returns as the plain games."""
    cfg = load_config("acer", ["preset=cartpole", "eval.episodes=6"])
    policy = TensorDictModule(AngleOnly(), in_keys=["observation"], out_keys=["action"])
    plain = evaluate(policy, make_env(evaluation_env_config(cfg.env, games=6)), cfg.eval.max_steps, seed=40)
    broken = make_env(evaluation_env_config(cfg.env, games=6)).append_transform(NotFiniteAfterTheFirstEpisode(6))
    assert np.isfinite(plain[0])
    assert evaluate(policy, broken, cfg.eval.max_steps, seed=40) == plain
