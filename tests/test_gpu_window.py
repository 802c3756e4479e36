"""``benchmarks/gpu/window.sh`` on CPU (``DRY=1``: tiny budgets, a MinAtar row, ACER CartPole for Pong): every part
within the budget, and a second window continues the first one's run from the weights it left (the curve joined)."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def window(out: Path, pong_dir: Path, budget: int, parts: str) -> str:
    """Run one dry window; its printed summary (it must end within its budget)."""
    env = {**os.environ, "DRY": "1", "OUT": str(out), "PONG_DIR": str(pong_dir), "PYTHON": sys.executable,
           "BUDGET_S": str(budget), "PARTS": parts, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", "benchmarks/gpu/window.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=budget + 60)
    assert done.returncode == 0, done.stderr
    seconds = int(re.search(r"== window.sh: (\d+) s of", done.stdout).group(1))
    assert seconds <= budget, done.stdout
    return done.stdout


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.integration
def test_a_dry_window_runs_each_part_and_the_next_one_continues_its_run(tmp_path):
    pong_dir = tmp_path / "pong-acer"  # the committed results of the windows so far: none yet
    pong_dir.mkdir()
    first = window(tmp_path / "first", pong_dir, budget=170, parts="tests rows prefetch pong")
    assert "-- gpu tests: " in first and "overhead (neither update nor wait)" in first
    assert "-- acer, replay.prefetch=true: " in first
    assert re.search(r"-- pong, \d+ s: pong.sh: a new run in \S+, from scratch", first)
    assert re.search(r"module\.\S+: \d+/128 units off on all 100 states", first) and "policy: std across states" in first
    piece = tmp_path / "first" / "pong-acer"
    assert (piece / "pong-acer.png").is_file()
    costs = [json.loads(line) for line in (tmp_path / "first" / "pipeline-costs.jsonl").read_text().splitlines()]
    assert [c["overrides"][-1] for c in costs] == ["collector.workers=1", "replay.prefetch=true"]
    for name in ("weights.pt", "pong-acer-metrics.csv"):  # what a session commits after its window
        shutil.copy(piece / name, pong_dir / name)
    before = rows(pong_dir / "pong-acer-metrics.csv")

    second = window(tmp_path / "second", pong_dir, budget=95, parts="pong")
    assert f"pong.sh: a new run in {tmp_path / 'second' / 'run'}, from {pong_dir / 'weights.pt'}" in second
    config = yaml.safe_load((tmp_path / "second" / "run" / "config.yaml").read_text())
    assert config["init_from"] == str(pong_dir / "weights.pt")
    joined = rows(tmp_path / "second" / "pong-acer" / "pong-acer-metrics.csv")
    assert joined[: len(before)] == before and len(joined) > len(before)
    steps = [int(r["env_steps"]) for r in joined]
    updates = [int(r["updates"]) for r in joined]
    assert steps == sorted(set(steps)) and updates == sorted(updates)


@pytest.mark.parametrize("saved", [False, True])
@pytest.mark.parametrize("init_from", ["", "earlier/weights.pt"])
def test_a_pong_piece_resumes_only_a_run_dir_that_reached_a_checkpoint(tmp_path, saved, init_from):
    """A piece killed in its start-up leaves config.yaml and no checkpoint: the next piece in that dir must start
    the run anew (it had been sent to resume it and failed with "no checkpoint"), moving the unsaved dir aside. The
    earlier window's weights (INIT_FROM) start a new run only: a resumed one keeps its own."""
    run_dir = tmp_path / "pong"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("seed: 0\n")
    if saved:
        (run_dir / "checkpoint").mkdir()
        (run_dir / "checkpoint" / "counters.json").write_text("{}")
    env = {**os.environ, "PYTHON": "echo", "INIT_FROM": init_from}  # echo: prints the recipe's command line
    done = subprocess.run(["bash", "benchmarks/gpu/pong.sh", "acer", "5", str(run_dir), "seed=3"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    if saved:
        assert done.stdout.split() == ["recipes/acer.py", f"resume={run_dir}", "seed=3"]
        assert (run_dir / "config.yaml").is_file()
    else:
        start = [f"init_from={init_from}"] if init_from else []
        assert done.stdout.split() == ["recipes/acer.py", f"run_dir={run_dir}", "preset=atari_gpu",
                                       "eval.interval=100000", *start, "seed=3"]
        assert f"from {init_from}" in done.stderr if init_from else "from scratch" in done.stderr
        assert not run_dir.exists() and len(list(tmp_path.glob("pong.unsaved-*"))) == 1
