"""``init_from=<weights file>``: a new run from the weights cut out of another run's checkpoint
(``benchmarks/gpu/cut_weights.py``, :func:`acer_torchrl.checkpoint.cut_weights`), as a GPU window continues the
Pong run of the window before (``benchmarks/gpu/window.sh``): the same policy, the counters carried on, the replay
refilled; a file that does not fit the run is one line."""

import csv
import hashlib
import json
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from acer_torchrl.checkpoint import CheckpointError, cut_weights
from acer_torchrl.cli import run
from acer_torchrl.config import ConfigError, load_config
from acer_torchrl.evaluation import evaluation_seed
from acer_torchrl.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TINY = ["preset=cartpole", "seed=3", "collector.workers=0", "collector.frames_per_batch=48", "replay.min_size=96",
        "replay.batch_size=8", "network.hidden=16", "eval.background=false", "eval.episodes=2", "eval.max_steps=60",
        "eval.interval=192", "log.progress=false", "threads=1"]


def metrics(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A tiny ACER CartPole run's weights file and its last metrics row (its final greedy evaluation)."""
    tmp = tmp_path_factory.mktemp("init-from")
    run("acer", [*TINY, "total_frames=384", f"run_dir={tmp / 'first'}"])
    kept = cut_weights(tmp / "first", tmp / "weights.pt")
    assert kept["optimizer"] and kept["env_steps"] == 384  # CartPole's networks and Adam's moments: a few KB
    return tmp / "weights.pt", metrics(tmp / "first")[-1]


def test_a_run_from_weights_plays_the_saved_policy_and_continues_the_counters(tmp_path, saved):
    """The new run's policy, before any update, scores the saved run's final greedy return on the same evaluation
    seed; its counters start at the saved run's, its replay empty; its rows continue the curve."""
    weights, last = saved
    steps, updates = int(last["env_steps"]), int(last["updates"])
    trainer = Trainer(load_config("acer", [*TINY, f"init_from={weights}", "total_frames=576",
                                           f"run_dir={tmp_path / 'second'}"]))
    try:
        assert (trainer.counters.env_steps, trainer.counters.updates, len(trainer.replay)) == (steps, updates, 0)
        evaluator = trainer.make_evaluator()
        evaluator.submit(steps, evaluation_seed(3, steps))
        [(_, mean, _, _)] = evaluator.drain()
        evaluator.close()
    finally:
        trainer.close()
    assert mean == float(last["eval_return_mean"])
    run("acer", [*TINY, f"init_from={weights}", "total_frames=576", f"run_dir={tmp_path / 'third'}"])
    rows = metrics(tmp_path / "third")
    assert int(rows[0]["env_steps"]) > steps and int(rows[-1]["env_steps"]) == 576
    assert int(rows[-1]["updates"]) > updates
    assert yaml.safe_load((tmp_path / "third" / "config.yaml").read_text())["init_from"] == str(weights)
    # what it started from is recorded: the weights' run's segments first, then its own, naming the file
    source, own = [json.loads(line) for line in (tmp_path / "third" / "provenance.jsonl").read_text().splitlines()]
    first = weights.parent / "first"
    assert source == {**json.loads((first / "provenance.jsonl").read_text()), "run_dir": str(first.resolve())}
    started = {"path": str(weights.resolve()), "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
               "run_dir": str(first.resolve()), "seed": 3}
    assert own["from_env_steps"] == steps and own["init_from"] == started
    summary = json.loads((tmp_path / "third" / "summary.json").read_text())
    assert summary["init_from"] == started and "unrecorded" not in summary["code"]  # (before: no init_from; its
    # first segment, not recorded in this run, made the code say "(some segments unrecorded)")


def test_a_damaged_weights_file_is_one_line(tmp_path, saved):
    """A byte changed inside the file's tensors: torch.load reads it without a word (before, the run trained from
    the changed weights); the zip members' CRC-32 catch it."""
    weights, _ = saved
    with zipfile.ZipFile(weights) as archive:
        member = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(weights.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[member.header_offset + 26 : member.header_offset + 30])
    at = member.header_offset + 30 + name_length + extra_length + member.file_size // 2
    data[at] ^= 0x10
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as err:
        run("acer", [*TINY, f"init_from={damaged}", "total_frames=576", f"run_dir={tmp_path / 'run'}"])
    assert str(err.value) == (f"init_from={damaged} is damaged ({member.filename} fails its CRC-32 check); cut it "
                              "again from its run directory with benchmarks/gpu/cut_weights.py")


def test_cut_weights_names_the_settings_the_checkpoint_was_trained_with_not_an_edited_config(tmp_path, saved):
    """config.yaml edited after the run (ReLU written as tanh): the file still says relu, so a tanh run from it is
    refused (before, cut_weights read config.yaml and the ReLU weights ran in a tanh network)."""
    weights, _ = saved
    edited = tmp_path / "edited"
    shutil.copytree(weights.parent / "first", edited)
    config = edited / "config.yaml"
    config.write_text(config.read_text().replace("activation: relu", "activation: tanh"))
    cut_weights(edited, tmp_path / "weights.pt")
    assert torch.load(tmp_path / "weights.pt", weights_only=True)["network"]["activation"] == "relu"
    with pytest.raises(CheckpointError, match="network.activation=relu, this run's has network.activation=tanh"):
        run("acer", [*TINY, "network.activation=tanh", f"init_from={tmp_path / 'weights.pt'}", "total_frames=576",
                     f"run_dir={tmp_path / 'run'}"])


def test_a_run_from_weights_inside_its_final_window_says_its_score_has_fewer_evaluations(tmp_path, saved, capsys):
    """Weights at 384 env steps, total_frames=408: the window's points are 368, 388 and 408 (batches of 4 steps) and
    the run starts past the first; a start before the window says nothing."""
    weights, _ = saved
    short = ["replay.seq_len=4", "replay.batch_size=2", "replay.min_size=8", "collector.frames_per_batch=4"]
    for total, note in ((408, True), (576, False)):
        capsys.readouterr()
        Trainer(load_config("acer", [*TINY, *short, f"init_from={weights}", f"total_frames={total}",
                                     f"run_dir={tmp_path / str(total)}"])).close()
        err = capsys.readouterr().err
        assert err == (f"note: init_from={weights} starts at 384 env steps, past 1 of the final score's 3 evaluation "
                       "points (368, 388, 408): its final score averages the evaluations this run makes from there\n"
                       if note else "")


@pytest.mark.parametrize("overrides, error, message", [
    (["loss=laser"], CheckpointError, "holds acer weights for CartPole-v1, not laser on CartPole-v1"),
    (["network.hidden=32"], CheckpointError,
     "holds weights of a network with network.hidden=[16], this run's has network.hidden=[32]"),
    # the same shapes, another function: before, loaded without a word
    (["network.activation=tanh"], CheckpointError,
     "holds weights of a network with network.activation=relu, this run's has network.activation=tanh"),
    (["optim.name=rmsprop"], CheckpointError,
     "its optimiser state is adam's, this run's optim.name=rmsprop"),
    (["total_frames=384"], ConfigError, "is at 384 env steps: give total_frames > 384"),
    (["total_frames=400", "acer.on_policy=false"], ConfigError,
     "ends before the first update: loss=acer takes it once 96 steps are collected (replay.min_size=96); give "
     "total_frames >= 480"),
])
def test_weights_that_do_not_fit_the_run_are_one_line(tmp_path, saved, overrides, error, message):
    """Another algorithm, another network or optimiser, a run already as long as the weights' or too short to refill the replay
    for an update: refused before anything trains, in one line naming the file."""
    weights, _ = saved
    algo = "laser" if "loss=laser" in overrides else "acer"
    given = [o for o in overrides if o != "loss=laser"]
    with pytest.raises(error) as err:
        run(algo, [*TINY, f"init_from={weights}", "total_frames=576", *given, f"run_dir={tmp_path / 'run'}"])
    assert message in str(err.value) and "\n" not in str(err.value)
    assert error is ConfigError or str(err.value).startswith(f"init_from={weights}")


def test_a_file_that_is_not_weights_is_one_line_with_exit_code_2(tmp_path, saved):
    """A missing file, a file of another kind: the recipe's one error line and exit code 2."""
    weights, _ = saved
    not_weights = tmp_path / "metrics.pt"
    not_weights.write_bytes(b"not a torch file")
    for path, reason in ((tmp_path / "none.pt", "no such file or directory"), (not_weights, "is not a weights file")):
        out = subprocess.run([sys.executable, str(ROOT / "recipes" / "acer.py"), *TINY, f"init_from={path}",
                              f"run_dir={tmp_path / path.stem}"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(f"error: init_from={path}")
        assert reason in out.stderr and "weights_only" not in out.stderr  # (torch's advice to unpickle it)


def test_cut_weights_leaves_the_optimiser_out_when_it_does_not_fit_and_refuses_larger_networks(tmp_path, saved):
    """The file keeps the networks first: the optimiser's state only when both fit; networks alone over the limit
    are one line."""
    weights, _ = saved
    first = weights.parent / "first"
    networks = sum(t.numel() * t.element_size() for t in torch.load(weights)["loss"].values())
    kept = cut_weights(first, tmp_path / "small.pt", max_bytes=networks + 64)
    assert not kept["optimizer"] and kept["bytes"] < weights.stat().st_size
    assert "optimizer" not in torch.load(tmp_path / "small.pt") and "optimizer" in torch.load(weights)
    with pytest.raises(CheckpointError, match="are .* MB, more than"):
        cut_weights(first, tmp_path / "tiny.pt", max_bytes=networks // 2)
    assert not (tmp_path / "tiny.pt").exists()


def standardization(state: dict) -> dict[str, torch.Tensor]:
    """The state standardisation's statistics among a loss's state entries (its ``loc`` and ``scale`` buffers)."""
    return {k: v for k, v in state.items() if k.rsplit(".", 1)[-1] in ("loc", "scale")}


def test_a_run_from_weights_keeps_the_fitted_state_standardisation(tmp_path):
    """The statistics fitted beside the networks travel with the weights (``acer.standardize``: the network's
    ``Standardize`` layer and its ``fitted`` flag): the new run's network sees its inputs as the saved one did, its
    statistics are not fitted afresh on the new run's first steps (before, they were)."""
    standardized = [*TINY, "acer.standardize=true", "acer.on_policy=false"]
    run("acer", [*standardized, "total_frames=288", f"run_dir={tmp_path / 'first'}"])
    cut_weights(tmp_path / "first", tmp_path / "weights.pt")
    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    fitted = standardization(weights["loss"])
    assert fitted and bool(weights["estimates"]["fitted"])
    assert not all(torch.equal(v, torch.zeros_like(v)) for k, v in fitted.items() if k.endswith("loc"))
    run("acer", [*standardized, f"init_from={tmp_path / 'weights.pt'}", "total_frames=576",
                 f"run_dir={tmp_path / 'second'}"])
    state = torch.load(tmp_path / "second" / "checkpoint" / "state.pt", weights_only=True)
    assert {k: v.tolist() for k, v in standardization(state["loss"]).items()} == \
        {k: v.tolist() for k, v in fitted.items()}


def test_cut_weights_into_a_directory_is_one_line_and_leaves_no_temporary_file(tmp_path, saved):
    weights, _ = saved
    run_dir, out = weights.parent / "first", tmp_path / "dir"
    out.mkdir()
    with pytest.raises(CheckpointError, match="is a directory: give the weights file's path"):
        cut_weights(run_dir, out)
    assert list(tmp_path.iterdir()) == [out] and not list(out.iterdir())


def test_weights_of_a_distributional_critic_on_another_support_are_one_line(tmp_path):
    """The atoms' values come from the config (``reactor.v_min``, ``reactor.v_max``), not from the file: a critic
    trained on another support is refused (before, the file's support replaced the configured one without a word,
    while config.yaml recorded the configured one)."""
    tiny = [*TINY, "reactor.distributional=true", "reactor.updates_per_batch=1"]
    run("reactor", [*tiny, "reactor.v_min=0", "reactor.v_max=1000", "total_frames=288",
                    f"run_dir={tmp_path / 'first'}"])
    cut_weights(tmp_path / "first", tmp_path / "weights.pt")
    with pytest.raises(CheckpointError) as err:
        run("reactor", [*tiny, "reactor.v_min=0", "reactor.v_max=100", "total_frames=576",
                        f"init_from={tmp_path / 'weights.pt'}", f"run_dir={tmp_path / 'second'}"])
    assert str(err.value) == (f"init_from={tmp_path / 'weights.pt'} holds a distributional critic on [0, 1000], this "
                              "run's is on [0, 100] (reactor.v_min, reactor.v_max)")


def test_overwrite_with_weights_that_are_refused_keeps_the_old_run(tmp_path, saved):
    """overwrite=true sets the old run aside while the new one is built: refused (here a total_frames the weights
    are already at), the old run is back as it was (before, it was deleted first, the directory left with its lock
    file alone); built, the old run is gone."""
    weights, _ = saved
    old = tmp_path / "old"
    shutil.copytree(weights.parent / "first", old)
    before = {p.relative_to(old): p.read_bytes() for p in old.rglob("*") if p.is_file() and p.name != "run.lock"}
    with pytest.raises(ConfigError, match="is at 384 env steps"):
        run("acer", [*TINY, f"init_from={weights}", "total_frames=384", f"run_dir={old}", "overwrite=true"])
    after = {p.relative_to(old): p.read_bytes() for p in old.rglob("*") if p.is_file() and p.name != "run.lock"}
    assert after == before
    run("acer", [*TINY, f"init_from={weights}", "total_frames=576", f"run_dir={old}", "overwrite=true"])
    assert not (old / ".overwritten").exists() and metrics(old)[0]["env_steps"] != metrics(weights.parent / "first")[0]["env_steps"]

