"""benchmarks/learning.py's rows: each row's record is one line of ``learning-rows.jsonl`` keyed by its name; a run
adds its line (and its learning.md row), a taken name is refused, ``--replace`` puts the new record in the old one's
place, and ``--resume`` reads the seeds a benchmark finished."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
TINY = ["--seeds", "1", "--frames", "192", "--parallel", "1", "collector.workers=0", "collector.frames_per_batch=48",
        "replay.min_size=96", "replay.batch_size=8", "network.hidden=16", "eval.background=false", "eval.episodes=2",
        "eval.max_steps=60", "eval.interval=96", "threads=1"]


def test_a_row_replaces_its_line_in_place_and_a_new_one_is_appended(learning, tmp_path):
    rows = tmp_path / learning.ROWS
    assert learning.read_rows(rows) == {}
    for name, score in (("a", 1.0), ("b", 2.0), ("a", 3.0), ("c", 4.0)):
        learning.write_row(rows, {"name": name, "final_score_iqm": score})
    assert [json.loads(line) for line in rows.read_text().splitlines()] == [
        {"name": "a", "final_score_iqm": 3.0}, {"name": "b", "final_score_iqm": 2.0},
        {"name": "c", "final_score_iqm": 4.0}]
    assert sorted(p.name for p in tmp_path.iterdir()) == [learning.ROWS], "no temporary file left"


def test_a_replaced_row_takes_its_old_lines_place_in_the_table(learning, tmp_path):
    page = tmp_path / "learning.md"
    page.write_text(learning.HEADER + "\nnotes\n")
    row = {"name": "a", "threshold": None, "frames": 10, "failed": [], "final_score_ci95": [1.0, 2.0],
           "final_score_per_seed": [1.0, 2.0], "final_score_iqm": 1.5, "final_score_at_threshold": "n/a",
           "steps_to_threshold": [], "wall_time_s_per_seed": 1.0, "env_steps_per_s": 1.0, "machine": "m",
           "date": "d", "command": "c"}
    for name, iqm in (("a", 1.5), ("b", 1.5), ("a", 9.0)):
        learning.put_markdown_row({**row, "name": name, "final_score_iqm": iqm}, page)
    table = [line for line in page.read_text().splitlines() if line.startswith("| [")]
    assert table == [learning.markdown_row({**row, "final_score_iqm": 9.0}),
                     learning.markdown_row({**row, "name": "b"})]
    assert "([record](learning-rows.jsonl#a))" in table[0] and page.read_text().endswith("\nnotes\n")


@pytest.mark.integration
def test_a_run_writes_its_line_a_second_is_refused_and_a_resumed_one_replaces_it(tmp_path):
    results, runs = tmp_path / "results", tmp_path / "runs"
    bench = [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "acer", "cartpole", *TINY,
             "--results", str(results), "--runs", str(runs)]
    first = subprocess.run(bench, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    lines = (results / "learning-rows.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert len(lines) == 1 and record["name"] == "acer-cartpole" and list(record["curves"]) == ["0"]
    assert len(record["final_score_per_seed"]) == 1 and (results / "acer-cartpole.png").is_file()

    again = subprocess.run(bench, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
    assert again.stderr.strip().splitlines()[-1].endswith("already holds a row acer-cartpole: give another --name, "
                                                         "or --replace")
    assert (results / "learning-rows.jsonl").read_text().splitlines() == lines

    (bench_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    resumed = subprocess.run([*bench, "--replace", "--resume", str(bench_dir)], cwd=tmp_path, env=ENV,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (line,) = (results / "learning-rows.jsonl").read_text().splitlines()
    replaced = json.loads(line)
    assert replaced["curves"] == record["curves"], "the finished seed was read, not run again"
    assert replaced["command"] == record["command"] and replaced["total_wall_s"] != record["total_wall_s"]
    assert [p for p in runs.iterdir() if p.is_dir()] == [bench_dir]
    table = [row for row in (results / "learning.md").read_text().splitlines() if row.startswith("| [acer-cartpole]")]
    assert len(table) == 1


def test_a_resumed_benchmark_starts_anew_a_seed_stopped_before_its_first_checkpoint(learning, tmp_path):
    """A seed stopped during its start-up leaves ``config.yaml`` (and the lock file) but no checkpoint. ``--resume``
    used to pass it ``resume=``, which the recipe refuses ("no checkpoint"), so the seed ended as failed; now it
    starts anew in its directory; once it has a checkpoint, ``resume=``."""
    seed_dir = tmp_path / "seed1"
    seed_dir.mkdir()
    (seed_dir / "config.yaml").write_text("loss: acer\n")
    (seed_dir / "run.lock").touch()
    extra = [arg for arg in TINY[6:] if "=" in arg]
    assert learning.recipe_args("cartpole", 1, 192, seed_dir, extra)[:4] == [
        "preset=cartpole", "seed=1", "total_frames=192", f"run_dir={seed_dir}"]
    summary = learning.run_seed("acer", "cartpole", 1, 192, seed_dir, extra)
    assert "failed" not in summary and summary["env_steps"] >= 192, seed_dir.with_suffix(".log").read_text()[-2000:]
    assert (seed_dir / "checkpoint").is_dir()
    assert learning.recipe_args("cartpole", 1, 192, seed_dir, extra) == [f"resume={seed_dir}", "log.progress=false"]


@pytest.mark.parametrize("given, message", [
    (["--seed-offset", "700"], "error: unrecognized arguments: --seed-offset"),
    (["acer.replay_ratioo=2"], "error: unknown config key 'acer.replay_ratioo'"),
])
def test_a_mistyped_flag_or_setting_is_one_usage_error_before_any_seed_runs(tmp_path, given, message):
    """A flag the benchmark does not know used to reach every seed's recipe as a setting: each seed failed and the
    benchmark still wrote a row of failures. Now it is refused first: exit code 2, nothing run or written."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    bench = [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "acer", "cartpole", *TINY, *given,
             "--results", str(results), "--runs", str(runs)]
    out = subprocess.run(bench, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr.strip().splitlines()[-1], out.stderr
    assert "Traceback" not in out.stderr and not results.exists() and not runs.exists()
