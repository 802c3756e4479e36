"""What a run records of what it ran on (acer_torchrl.provenance): the code, packages and machine of each of its
segments (a start, then each resume that trains), and summary.json's code and machines of all of them."""

import importlib.metadata
import json
import subprocess
from pathlib import Path

import pytest

from acer_torchrl import provenance
from acer_torchrl.config import load_config
from acer_torchrl.trainer import Trainer

TINY = ["preset=cartpole", "collector.workers=0", "log.progress=false", "network.hidden=16", "replay.capacity=4096",
        "replay.min_size=64", "total_frames=4000"]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_the_code_is_the_checkouts_commit_with_changes_marked_else_the_installed_version(tmp_path):
    root = tmp_path / "checkout"
    (root / "acer_torchrl").mkdir(parents=True)
    (root / "acer_torchrl" / "loss.py").write_text("a = 1\n")
    (root / "notes.txt").write_text("")
    git(root, "init", "-q")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c", "--allow-empty")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    commit = git(root, "rev-parse", "--short", "HEAD")
    version = provenance.code_version.__wrapped__  # uncached: the checkout changes between the calls
    assert version(root) == commit
    (root / "notes.txt").write_text("not code")
    assert version(root) == commit, "a change outside the code paths is not the code's"
    (root / "acer_torchrl" / "loss.py").write_text("a = 2\n")
    assert version(root) == f"{commit}+changes"
    # a folder inside another project's repository, or no repository: the installed package's version
    for elsewhere in (root / "acer_torchrl", tmp_path / "plain"):
        elsewhere.mkdir(exist_ok=True)
        assert version(elsewhere) == f"acer-torchrl {importlib.metadata.version('acer-torchrl')} (not a git checkout)"


def test_each_segment_that_trains_is_recorded_from_its_env_steps(tmp_path):
    run_dir = tmp_path / "run"
    trainer = Trainer(load_config("acer", [*TINY, f"run_dir={run_dir}"]))
    try:
        trainer.counters.env_steps, trainer.counters.updates = 1000, 1
        trainer.checkpoint()
    finally:
        trainer.close()
    Trainer(load_config("acer", [f"resume={run_dir}"])).close()
    first, second = provenance.segments(run_dir)
    assert (first["from_env_steps"], second["from_env_steps"]) == (0, 1000)
    here = provenance.this_process()
    for record in (first, second):
        assert {k: record[k] for k in ("code", "machine", "python", "packages")} == {
            k: here[k] for k in ("code", "machine", "python", "packages")}
        assert record["packages"]["torch"] and record["packages"]["torchrl"]
    assert provenance.summarize([first, second]) == {"code": here["code"], "machine": here["machine"],
                                                     "date": here["date"]}
    # a finished run resumed trains nothing and writes nothing (docs/running.md)
    (run_dir / "summary.json").write_text(json.dumps({"env_steps": 1000}))
    lines = (run_dir / provenance.FILE).read_text()
    trainer = Trainer(load_config("acer", [f"resume={run_dir}", "total_frames=1000"]))
    trainer.close()
    assert (run_dir / provenance.FILE).read_text() == lines and (run_dir / "summary.json").is_file()
    # resumed to train further it is not finished any more: no summary until its new end (a sweep's table says "-")
    Trainer(load_config("acer", [f"resume={run_dir}", "total_frames=2000"])).close()
    assert len(provenance.segments(run_dir)) == 3 and not (run_dir / "summary.json").exists()


@pytest.mark.parametrize("text, unrecorded", [
    ('{"from_env_steps": 0, "code": "a", "machine": "m", "date": "d1"}\n{"from_env', True),  # a line cut short
    ('{"from_env_steps": 500, "code": "a", "machine": "m", "date": "d1"}\n', True),  # begun before runs recorded it
    ('{"from_env_steps": 0, "code": "a", "machine": "m", "date": "d1"}\n'
     '{"from_env_steps": 500, "code": "b", "machine": "m", "date": "d2"}\n', False),
    # a segment that trained nothing (its resume failed, or it stopped before its first checkpoint) is not the run's
    ('{"from_env_steps": 0, "code": "a", "machine": "m", "date": "d1"}\n'
     '{"from_env_steps": 500, "code": "c", "machine": "gpu", "date": "d3"}\n'
     '{"from_env_steps": 500, "code": "b", "machine": "m", "date": "d2"}\n', False),
])
def test_segments_that_were_not_recorded_are_said_to_be_missing(tmp_path, text, unrecorded):
    (tmp_path / provenance.FILE).write_text(text)
    summary = provenance.summarize(provenance.contributing(provenance.segments(tmp_path)))
    assert summary["code"] == ("a (some segments unrecorded)" if unrecorded else "a, b")
    assert summary["date"] == ("d1" if unrecorded else "d1 to d2") and summary["machine"] == "m"
