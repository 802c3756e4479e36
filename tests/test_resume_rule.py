"""One rule for settings on resume (acer_torchrl.config.APPLIED_ON_RESUME): every key of every algorithm is either
applied to the resumed run's live objects after its checkpoint is loaded, or run-defining and refused; and the
settings an algorithm cannot use, or a run that could end before its first update, are refused at start.

The walk over every key builds each algorithm's trainer in this process from a tiny checkpoint (no collection):
one resume per algorithm changes every applied key at once, and each run-defining key is checked alone."""

import dataclasses
import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from acer_torchrl import cli
from acer_torchrl.checkpoint import CheckpointError
from acer_torchrl.config import (APPLIED_ON_RESUME, RESUME_BOOKKEEPING, ConfigError, check_resume_changes,
                                 flat_settings, is_run_defining, load_config, set_key)
from acer_torchrl.evaluation import InlineEvaluator
from acer_torchrl.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
PRESETS = {"acer": "cartpole", "reactor": "cartpole", "vracer": "pendulum", "laser": "cartpole"}
TINY = ["collector.workers=0", "log.progress=false", "network.hidden=16", "replay.capacity=4096",
        "replay.min_size=64", "total_frames=4000", "eval.background=true"]
SAVED_STEPS = 1000  # the tiny checkpoint's env steps: the schedules and the step size depend on them


def tiny_checkpoint(algo: str, run_dir: Path, env_steps: int = SAVED_STEPS) -> None:
    """A run of ``algo`` saved at ``env_steps`` (with one update) without collecting anything."""
    trainer = Trainer(load_config(algo, [f"preset={PRESETS[algo]}", f"run_dir={run_dir}", *TINY]))
    try:
        trainer.counters.env_steps, trainer.counters.updates = env_steps, 1
        trainer.checkpoint()
    finally:
        trainer.close()


def rule_of(cfg, name: str):
    """The declared range (:func:`~acer_torchrl.validation.allowed`) of ``name`` in ``cfg``'s section, if any."""
    *path, field = name.split(".")
    section = cfg.algo if path and path[0] == cfg.loss else cfg
    for part in path if section is cfg else []:
        section = getattr(section, part)
    return getattr(type(section), "__allowed__", {}).get(field)


def another_value(cfg, key: str, value):
    """A value of ``key``'s type (and in its declared range where one is declared) other than ``value``."""
    rule = rule_of(cfg, key)
    if isinstance(value, bool):
        return not value
    if isinstance(value, list):
        return [v + 1 for v in value]
    if value is None:
        return "1"  # an unset optional number or switch
    if isinstance(value, str):
        names = getattr(rule, "names", ())
        return next((n for n in names if n != value), f"{value}x")
    candidates = [value * 2, value / 2, value + 1, 0.5] if isinstance(value, float) else [value + 1, value - 1]
    if isinstance(value, float) and math.isinf(value):
        candidates = [10.0]
    return next(c for c in candidates if c != value and (rule is None or c in rule))  # 0.0 * 2 is 0.0


# each applied key's new value on resume (None: another_value's) and where a resumed trainer shows it in effect
APPLIED = {
    "total_frames": (5000, lambda t: t.optimizer.param_groups[0]["lr"] == expected_lr(t)),
    "device": ("cpu", lambda t: t.device == torch.device("cpu")),
    "threads": (1, lambda t: torch.get_num_threads() == 1),
    "collector.workers": (1, lambda t: collector_options(t)["num_workers"] == 1),
    "collector.frames_per_batch": (40, lambda t: collector_options(t)["frames_per_batch"] == 40),
    # read from the trainer's config at each draw (Trainer.draw_batch)
    "replay.batch_size": (None, lambda t: t.cfg.replay.batch_size == t.new["replay.batch_size"]),
    "replay.seq_len": (None, lambda t: t.cfg.replay.seq_len == t.online.seq_len == t.new["replay.seq_len"]),
    "replay.min_size": (128, lambda t: t.cfg.replay.min_size == 128 and getattr(t.agent.estimates, "n_start", 128) == 128),
    "replay.recurrent_state": ("zero", lambda t: t.cfg.replay.recurrent_state == "zero"),
    "replay.prefetch": (True, lambda t: t.draws_ahead()),  # the draw-ahead thread made in Trainer.__init__
    "optim.lr": (2e-3, lambda t: t.optimizer.param_groups[0]["lr"] == expected_lr(t)),
    "optim.eps": (0.5, lambda t: all(g["eps"] == 0.5 for g in t.optimizer.param_groups)),
    "optim.weight_decay": (0.25, lambda t: all(g["weight_decay"] == 0.25 for g in t.optimizer.param_groups)),
    "optim.max_grad_norm": (0.125, lambda t: clipped_norm(t) <= 0.125 * (1 + 1e-4)),
    "optim.lr_end_factor": (0.5, lambda t: t.optimizer.param_groups[0]["lr"] == expected_lr(t)),
    "eval.interval": (3000, lambda t: t.counters.next_eval == 3000),
    "eval.episodes": (3, lambda t: t.evaluator_made.env.batch_size == torch.Size([3])),
    "eval.max_steps": (77, lambda t: t.evaluator_made.max_steps == 77),
    "eval.background": (False, lambda t: isinstance(t.evaluator_made, InlineEvaluator)),
    "log.progress": (True, lambda t: t.bar_shown),
    # its writer hides the points the killed run logged after the checkpoint (tests/test_metrics.py)
    "log.tensorboard": (True, lambda t: [x.purge_step for x in t.log.loggers
                                         if "Tensorboard" in type(x).__name__] == [SAVED_STEPS + 1]),
    "log.wandb": (True, lambda t: any("Wandb" in type(x).__name__ for x in t.log.loggers)),
    "log.checkpoint_interval": (1500, lambda t: t.counters.next_checkpoint == 1500),
}


def expected_lr(trainer) -> float:
    """The step size the resumed run's settings give at :data:`SAVED_STEPS` (times the loss's own annealing)."""
    new = trainer.new
    progress = SAVED_STEPS / new["total_frames"]
    return new["optim.lr"] * (1 - (1 - new["optim.lr_end_factor"]) * progress) * trainer.loss.lr_scale()


def collector_options(trainer) -> dict:
    """The keywords the trainer's collector is made with (:func:`~acer_torchrl.collectors.make_collector`)."""
    seen = {}
    original = sys.modules["acer_torchrl.trainer"].make_collector
    sys.modules["acer_torchrl.trainer"].make_collector = lambda env_fns, policy, **kw: seen.update(kw)
    try:
        trainer.make_collector(100)
    finally:
        sys.modules["acer_torchrl.trainer"].make_collector = original
    return seen


def clipped_norm(trainer) -> float:
    """The gradients' norm after the trainer's clipping of large gradients."""
    for p in trainer.params:
        p.grad = torch.full_like(p, 10.0)
    trainer.clip_gradients()
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in trainer.params])).item()


def applicable(key: str) -> bool:
    """Whether ``key`` can be switched on here (the loggers need their packages)."""
    package = {"log.tensorboard": "tensorboard", "log.wandb": "wandb"}.get(key)
    return package is None or importlib.util.find_spec(package) is not None


def test_every_applied_key_has_its_check_here():
    assert set(APPLIED) == set(APPLIED_ON_RESUME)


@pytest.mark.parametrize("algo", list(PRESETS))
def test_every_key_is_applied_to_the_live_run_or_refused_on_resume(tmp_path, algo):
    run_dir = tmp_path / "run"
    tiny_checkpoint(algo, run_dir)
    saved = load_config(algo, [f"resume={run_dir}"])
    keys = [k for k in flat_settings(saved) if k not in RESUME_BOOKKEEPING]
    # run-defining: each change alone is refused, in one line naming the key
    for key in [k for k in keys if is_run_defining(k)]:
        cfg = load_config(algo, [f"resume={run_dir}"])
        set_key(cfg, key, another_value(cfg, key, flat_settings(cfg)[key]))
        refusal = f"is a {algo} run, not" if key == "loss" else f"resume={run_dir}: {key}=.* differs from the run's {key}="
        with pytest.raises(ConfigError, match=refusal) as err:
            check_resume_changes(cfg)
        assert "\n" not in str(err.value)
    # applied: all changed in one resume, each then checked on the live objects
    applied = [k for k in keys if not is_run_defining(k)]
    assert set(applied) == set(APPLIED_ON_RESUME)
    new = {k: APPLIED[k][0] if APPLIED[k][0] is not None else another_value(saved, k, flat_settings(saved)[k])
           for k in applied if applicable(k)}
    if algo == "vracer":
        new["replay.seq_len"] = 1  # the only value it uses (test_settings_a_loss_cannot_use_are_refused)
    threads = torch.get_num_threads()
    trainer = Trainer(load_config(algo, [f"resume={run_dir}", *(f"{k}={v}" for k, v in new.items())]))
    try:
        trainer.new = flat_settings(trainer.cfg)
        trainer.evaluator_made = trainer.make_evaluator()
        with mock.patch.object(sys.stderr, "isatty", return_value=True):  # the bar is drawn on a terminal only
            trainer._start_clock()
        trainer.bar_shown = not trainer._bar.disable
        trainer._stop_clock()
        failed = [k for k in new if not APPLIED[k][1](trainer)]
        assert not failed, f"applied on resume but not in effect: {failed}"
        (record,) = [json.loads(line) for line in (run_dir / "resumes.jsonl").read_text().splitlines()]
        assert set(record["changed"]) == {k for k in new if new[k] != flat_settings(saved)[k]}
    finally:
        trainer.evaluator_made.close()
        trainer.close()
        torch.set_num_threads(threads)


def test_a_run_that_recorded_the_removed_compile_keys_resumes(tmp_path):
    """A run from before ``compile`` went recorded ``compile: false`` and ``compile_mode: default`` in its config.yaml:
    it resumes, and the resume changes nothing (``compile=true`` on it is refused: ``tests/test_user_errors.py``)."""
    run_dir = tmp_path / "run"
    tiny_checkpoint("acer", run_dir)
    saved = run_dir / "config.yaml"
    saved.write_text(saved.read_text() + "compile: false\ncompile_mode: default\n")
    trainer = Trainer(load_config("acer", [f"resume={run_dir}", "total_frames=5000"]))
    try:
        assert trainer.counters.env_steps == SAVED_STEPS
        (record,) = [json.loads(line) for line in (run_dir / "resumes.jsonl").read_text().splitlines()]
        assert set(record["changed"]) == {"total_frames"}  # the compile keys are no change
    finally:
        trainer.close()


def test_a_config_yaml_edited_by_hand_is_refused_on_resume(tmp_path):
    """gamma changed in config.yaml, not on the command line: the checkpoint keeps the settings it was trained with, so
    the resume is refused in one line (before, it trained on with gamma 0.9 and recorded no change)."""
    tiny_checkpoint("acer", tmp_path)
    saved = tmp_path / "config.yaml"
    gamma = [line for line in saved.read_text().splitlines() if line.startswith("gamma: ")][0]
    saved.write_text(saved.read_text().replace(gamma, "gamma: 0.9"))
    with pytest.raises(ConfigError) as err:
        Trainer(load_config("acer", [f"resume={tmp_path}", "total_frames=5000"]))
    assert str(err.value) == (f"resume={tmp_path}: config.yaml holds gamma=0.9 (trained with {gamma.split()[1]}), not "
                              "the settings its checkpoint was trained with (edited by hand?); put them back, or start "
                              "a new run to change them")


def test_a_run_defining_edit_or_an_unwritable_replay_store_is_not_called_a_corrupt_checkpoint(tmp_path):
    """replay.capacity edited by hand in config.yaml: the settings are checked before the replay is read, so the line
    says the edit (before: "checkpoint ... is corrupt or unreadable (ValueError: the saved replay holds ...)", which
    invites deleting a sound checkpoint); a file where the memory-mapped replay is restored says that."""
    run_dir = tmp_path / "run"
    cli.run("acer", ["preset=cartpole", *TINY, "total_frames=256", "replay.memmap=true", "eval.background=false",
                     "eval.episodes=1", "eval.max_steps=20", "eval.interval=128", f"run_dir={run_dir}"])
    (run_dir / "summary.json").unlink()  # stopped before its summary: the resume reads the checkpoint
    saved = run_dir / "config.yaml"
    text = saved.read_text()
    saved.write_text(text.replace("capacity: 4096", "capacity: 8192"))
    with pytest.raises(ConfigError, match=r"config.yaml holds replay.capacity=8192 \(trained with 4096\)"):
        Trainer(load_config("acer", [f"resume={run_dir}"]))
    saved.write_text(text)
    shutil.rmtree(run_dir / "replay_storage")
    (run_dir / "replay_storage").write_text("not a directory")
    with pytest.raises(CheckpointError, match=r"its replay cannot be restored into .*replay_storage"):
        Trainer(load_config("acer", [f"resume={run_dir}"]))


def test_an_applied_setting_edited_by_hand_in_config_yaml_is_recorded_as_a_change(tmp_path, capsys):
    """optim.lr changed in config.yaml, not on the command line: the resume applies it (an applied key) and records it
    against the value the checkpoint was trained with, in resumes.jsonl and a note: line (before, config.yaml said the
    new rate for the whole run and nothing recorded the change). A resume killed before its next checkpoint and
    resumed again records it once."""
    tiny_checkpoint("acer", tmp_path)
    saved = tmp_path / "config.yaml"
    lr = [line for line in saved.read_text().splitlines() if line.strip().startswith("lr: ")][0]
    saved.write_text(saved.read_text().replace(lr, lr.split(":")[0] + ": 0.123"))
    for _ in range(2):
        trainer = Trainer(load_config("acer", [f"resume={tmp_path}"]))
        try:
            assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.123 * trainer.lr_schedule())
        finally:
            trainer.close()
    (record,) = [json.loads(line) for line in (tmp_path / "resumes.jsonl").read_text().splitlines()]
    assert record == {"env_steps": SAVED_STEPS, "changed": {"optim.lr": {"from": float(lr.split()[1]), "to": 0.123}}}
    (note,) = capsys.readouterr().err.strip().splitlines()
    assert note == (f"note: resume={tmp_path}: config.yaml holds optim.lr=0.123, not the {float(lr.split()[1])} its "
                    f"checkpoint was trained with (edited by hand?); applied from {SAVED_STEPS} env steps, recorded "
                    "in resumes.jsonl")


def test_weights_of_another_shape_are_named_in_the_one_line(tmp_path):
    """A checkpoint of another network (one from before checkpoints kept their settings, or another env): the line
    names the first tensor whose shape differs and both shapes (before: the first line of tensordict's error, which
    ended in "TensorDict(" and named nothing)."""
    from acer_torchrl.checkpoint import CheckpointError

    small = Trainer(load_config("acer", ["preset=cartpole", f"run_dir={tmp_path / 'small'}", *TINY]))
    large = Trainer(load_config("acer", ["preset=cartpole", f"run_dir={tmp_path / 'large'}", *TINY,
                                         "network.hidden=32"]))
    try:
        with pytest.raises(CheckpointError) as err:
            large.load_learner({"loss": small.loss.state_dict()}, "checkpoint in X", estimates=False)
    finally:
        small.close()
        large.close()
    assert str(err.value).startswith("checkpoint in X does not match this configuration: ")
    assert "is [16, 4] there, [32, 4] here (another network or env)" in str(err.value)


def test_optimiser_settings_changed_on_resume_reach_the_loaded_optimiser(tmp_path):
    """Issue 56 item 1: loading the checkpoint restored the saved eps and weight decay over the new ones."""
    tiny_checkpoint("acer", tmp_path)
    trainer = Trainer(load_config("acer", [f"resume={tmp_path}", "optim.eps=0.5", "optim.weight_decay=0.25"]))
    try:
        (group,) = trainer.optimizer.param_groups
        assert (group["eps"], group["weight_decay"]) == (0.5, 0.25)
        assert trainer.optimizer.state_dict()["state"] == torch.load(
            tmp_path / "checkpoint" / "state.pt", weights_only=True)["optimizer"]["state"], "its moments are kept"
    finally:
        trainer.close()


def test_resume_into_another_run_dir_is_refused_with_how_to_branch(tmp_path):
    tiny_checkpoint("acer", tmp_path / "a")
    config = (tmp_path / "a" / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=f"to branch it, copy the run \\(cp -r {tmp_path / 'a'} {tmp_path / 'b'}\\) "
                                          f"and resume the copy: resume={tmp_path / 'b'}"):
        load_config("acer", [f"resume={tmp_path / 'a'}", f"run_dir={tmp_path / 'b'}"])
    assert not (tmp_path / "b").exists() and (tmp_path / "a" / "config.yaml").read_text() == config
    load_config("acer", [f"resume={tmp_path / 'a'}", f"run_dir={tmp_path / 'a'}/"])  # the same directory: fine


# (algorithm, overrides, the one line's fragment): settings a loss cannot use, runs that would end before an update
REFUSED = [
    ("vracer", ["replay.seq_len=32"], "loss=vracer trains on single time steps: replay.seq_len=32 would be ignored"),
    ("reactor", ["replay.seq_len=1"], "replay.seq_len=1 is too short, the smallest that works is replay.seq_len=2"),
    ("reactor", ["reactor.updates_per_batch=0"], "reactor.updates_per_batch must be in (0, 1000], got 0.0"),
    ("vracer", ["total_frames=1000"], "total_frames=1000 ends before the first update: loss=vracer takes it once "
                                      "2000 steps are collected (replay.min_size=2000); give total_frames >= 2000"),
    ("laser", ["total_frames=500"], "total_frames=500 ends before the first update"),
    ("reactor", ["total_frames=900"], "give total_frames >= 1000"),
    ("acer", ["acer.on_policy=false", "total_frames=500"], "total_frames=500 ends before the first update"),
    ("vracer", ["vracer.steps_per_update=5000", "total_frames=4000"], "give total_frames >= 5000"),
    ("acer", ["preset=pendulum", "acer.on_policy=none", "acer.replay_ratio=0"], "acer.replay_ratio=0 never updates on InvertedPendulum-v5"),
]


@pytest.mark.parametrize("algo, overrides, fragment", REFUSED, ids=[" ".join(c[1]) for c in REFUSED])
def test_settings_a_loss_cannot_use_are_refused(tmp_path, capsys, algo, overrides, fragment):
    code = cli.main(algo, [f"run_dir={tmp_path / 'run'}", "collector.workers=0", "log.progress=false", *overrides])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and fragment in lines[0], lines
    assert not (tmp_path / "run" / "config.yaml").exists()


# (algorithm, overrides, the note): keys given that the run reads nowhere (or given twice), said once at start
UNUSED = [
    ("laser", ["network.lstm_hidden=8"], "note: network.lstm_hidden=8 has no effect with network.lstm=false"),
    ("acer", ["replay.recurrent_state=zero"], "note: replay.recurrent_state=zero has no effect with network.lstm=false"),
    ("laser", ["preset=cartpole_pomdp", "replay.prefetch=true"],
     "note: replay.prefetch=true has no effect with replay.recurrent_state=refresh"),
    ("reactor", ["replay.prioritized=true", "replay.prefetch=true"],
     "note: replay.prefetch=true has no effect with replay.prioritized=true"),
    ("reactor", ["reactor.tislr_c=5"], "note: reactor.tislr_c=5 has no effect with reactor.pg=beta_loo"),
    ("reactor", ["reactor.pg=tislr", "reactor.beta_c=2"], "note: reactor.beta_c=2 has no effect with reactor.pg=tislr"),
    ("laser", ["laser.trust_region=false", "laser.kl_samples=4"],
     "note: laser.kl_samples=4 has no effect with laser.trust_region=false"),
    ("acer", ["acer.trust_region=false", "acer.delta=2"], "note: acer.delta=2 has no effect with acer.trust_region=false"),
    ("acer", ["acer.replay_ratio=0", "replay.batch_size=8"], "note: replay.batch_size=8 has no effect with acer.replay_ratio=0"),
    ("laser", ["laser.online_share=1", "replay.min_size=10"], "note: replay.min_size=10 has no effect with laser.online_share=1"),
    ("acer", ["optim.alpha=0.9"], "note: optim.alpha=0.9 has no effect with optim.name=adam"),
    # what the env or the algorithm's own layers leave unused (before, recorded in config.yaml without a word)
    ("acer", ["env.frame_skip=8"], "note: env.frame_skip=8 has no effect with env.name=CartPole-v1 (Atari's keys)"),
    ("laser", ["preset=minatar", "network.hidden=32"],
     "note: network.hidden=32 has no effect with env.name=MinAtar/Breakout-v1 (its CNN encoder)"),
    ("reactor", ["network.activation=tanh"],
     "note: network.activation=tanh has no effect with loss=reactor (CReLU layers, Table 1)"),
    # and a key given twice
    ("acer", ["optim.lr=1e-3", "optim.lr=1e-4"], "note: optim.lr is given 2 times (1e-3, 1e-4); the last, optim.lr=1e-4, counts"),
]


@pytest.mark.parametrize("algo, overrides, note", UNUSED, ids=[" ".join(c[1]) for c in UNUSED])
def test_a_key_the_run_does_not_use_is_said_once_at_start(tmp_path, capsys, monkeypatch, algo, overrides, note):
    monkeypatch.setattr("acer_torchrl.processes.RunGuard.train", lambda guard, trainer: trainer.close() or {})
    cli.run(algo, [f"run_dir={tmp_path / 'a'}", "collector.workers=0", *overrides])
    assert capsys.readouterr().err.splitlines() == [note]
    cli.run(algo, [f"run_dir={tmp_path / 'b'}", "collector.workers=0"])  # presets and defaults hold such keys quietly
    assert capsys.readouterr().err == ""
    # a run refused once built (its directory holds another run) ends with its error line alone
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "summary.json").write_text("{}")
    assert cli.main(algo, [f"run_dir={tmp_path / 'c'}", "collector.workers=0", *overrides]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: run_dir={tmp_path / 'c'} already holds a run")


def test_an_on_policy_run_shorter_than_the_replay_warm_up_still_updates(tmp_path):
    """ACER's on-policy update (Alg. 1) learns from the first batch: total_frames below min_size is a run."""
    trainer = Trainer(load_config("acer", [f"run_dir={tmp_path}", "total_frames=500", *TINY[:3]]))
    trainer.close()


def test_a_resume_below_the_steps_taken_is_refused(tmp_path):
    tiny_checkpoint("acer", tmp_path)
    with pytest.raises(ConfigError, match=f"total_frames=500 is below the {SAVED_STEPS} env steps the run already"):
        Trainer(load_config("acer", [f"resume={tmp_path}", "total_frames=500"]))
    assert not (tmp_path / "resumes.jsonl").exists()
    Trainer(load_config("acer", [f"resume={tmp_path}", "total_frames=1000"])).close()  # the lock was released


def test_a_run_stopped_past_its_total_frames_before_its_summary_resumes_to_write_it(tmp_path):
    """The last batch goes past total_frames (whole batches): a run stopped after it, before its summary.json, resumes
    with the command it printed (before: refused, 'total_frames=4000 is below the 4032 env steps'); a total_frames
    given below its own is still refused."""
    tiny_checkpoint("acer", tmp_path, env_steps=4032)
    Trainer(load_config("acer", [f"resume={tmp_path}"])).close()
    with pytest.raises(ConfigError, match="total_frames=3000 is below the 4032 env steps the run already took"):
        Trainer(load_config("acer", [f"resume={tmp_path}", "total_frames=3000"]))


def test_help_shows_the_values_of_the_preset_given(capsys):
    assert cli.main("acer", ["preset=minatar", "--help"]) == 0
    out = capsys.readouterr().out
    assert "values under preset=minatar" in out and "  env.name=MinAtar/Breakout-v1" in out
    assert "  total_frames=2000000" in out and "  replay.capacity=100000" in out
    assert cli.main("acer", ["preset=nope", "--help"]) == 2
    assert capsys.readouterr().err.strip() == ("error: unknown preset 'nope' for loss=acer; choose one of cartpole, "
                                               "atari, atari_gpu, minatar, mujoco, pendulum")


@pytest.mark.integration
def test_a_finished_run_resumed_for_nothing_writes_nothing_and_further_trains_with_its_new_optimiser(tmp_path):
    """A real recipe run to its end, then resumed with a lower total_frames and another setting: the run says it
    was already finished and no file of it changes (config.yaml was rewritten). Resumed with more steps and new
    optimiser settings, it trains on with them (the checkpoint's optimiser had kept the saved ones)."""
    args = ["collector.workers=0", "collector.frames_per_batch=32", "replay.min_size=64", "replay.batch_size=4",
            "network.hidden=16", "eval.episodes=1", "eval.max_steps=50", "log.progress=false"]
    recipe = [sys.executable, str(ROOT / "recipes" / "acer.py")]
    first = subprocess.run([*recipe, f"run_dir={tmp_path}", "total_frames=64", *args], capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*") if p.is_file()}
    files_summary = (tmp_path / "summary.json").read_text()
    again = subprocess.run([*recipe, f"resume={tmp_path}", "total_frames=32", "eval.episodes=2"], capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0 and "nothing was changed" in again.stdout, again.stderr
    now = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*") if p.is_file()}
    changed = [str(p.relative_to(tmp_path)) for p in now if now[p] != files.get(p)]
    assert changed in ([], ["run.lock"]), changed  # the lock names its holder
    further = subprocess.run([*recipe, f"resume={tmp_path}", "total_frames=96", "optim.eps=0.5",
                              "optim.weight_decay=0.25"], capture_output=True, text=True, timeout=300)
    assert further.returncode == 0, further.stderr
    (group,) = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=True)["optimizer"]["param_groups"]
    assert (group["eps"], group["weight_decay"]) == (0.5, 0.25)
    assert json.loads((tmp_path / "summary.json").read_text())["updates"] > json.loads(files_summary)["updates"]
