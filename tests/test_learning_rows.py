"""benchmarks/learning.py's rows: each row's record is one line of ``learning-rows.jsonl`` keyed by its name; a run
adds its line (and its learning.md row), a taken name is refused, ``--replace`` puts the new record in the old one's
place, and ``--resume`` reads the seeds a benchmark finished; a stopped benchmark keeps its finished seeds in
``results/<name>-partial/``, from where ``--restore-partial`` reads them on another machine."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from acer_torchrl.provenance import code_version, machine

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
        learning.write_row(tmp_path / learning.ROWS, {**row, "name": name, "final_score_iqm": iqm})
        learning.put_markdown_row({**row, "name": name, "final_score_iqm": iqm}, page)
    table = [line for line in page.read_text().splitlines() if line.startswith("| [")]
    assert table == [learning.markdown_row({**row, "final_score_iqm": 9.0}, 1),
                     learning.markdown_row({**row, "name": "b"}, 2)]
    # each record link goes to its row's line of learning-rows.jsonl, which a replaced row keeps
    assert "([record](learning-rows.jsonl#L1))" in table[0] and "([record](learning-rows.jsonl#L2))" in table[1]
    assert page.read_text().endswith("\nnotes\n")


def test_rows_that_share_a_figure_link_it_and_lose_their_own_curve_files(learning, tmp_path, capsys):
    """``learning.py figure``: the rows' curves drawn in one file, which their records and table lines name; each
    row's own ``<name>.png`` goes, its record and line stay (the table's notes too); a name it has no record of, or
    a row's name as the figure's, is one usage error that changes nothing."""
    page = tmp_path / "learning.md"
    page.write_text(learning.HEADER + "\nnotes\n")
    row = {"threshold": None, "frames": 300, "failed": [], "final_score_ci95": [1.0, 2.0], "final_score_iqm": 1.5,
           "final_score_at_threshold": "n/a", "steps_to_threshold": [], "wall_time_s_per_seed": 1.0,
           "env_steps_per_s": 1.0, "machine": "m", "date": "d", "command": "c"}
    rows = {"a": {**row, "name": "a", "final_score_per_seed": [1.0], "curves": {"0": [[100, 0.0], [300, 1.0]]}},
            "ab": {**row, "name": "ab", "final_score_per_seed": [1.0, 2.0],
                   "curves": {"0": [[100, 1.0], [300, 2.0]], "1": [[150, 0.5], [300, 1.5]]}}}
    for name, record in rows.items():
        learning.write_row(tmp_path / learning.ROWS, record)
        learning.put_markdown_row(record, page)
        (tmp_path / f"{name}.png").write_bytes(b"png")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for wrong in (["fig", "a", "nope"], ["a", "ab"]):
        with pytest.raises(SystemExit) as stop:
            learning.shared_figure([*wrong, "--results", str(tmp_path)])
        assert stop.value.code == 2
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert ("no record of the rows ['nope']" in capsys.readouterr().err)

    learning.shared_figure(["fig", "a", "ab", "--results", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png", learning.ROWS, "learning.md"]
    records = learning.read_rows(tmp_path / learning.ROWS)
    assert [r.pop("figure") for r in records.values()] == ["fig.png", "fig.png"] and records == rows
    table = [line for line in page.read_text().splitlines() if line.startswith("| [")]
    assert [line.split(" ", 2)[1] for line in table] == ["[a](fig.png)", "[ab](fig.png)"]
    assert "([record](learning-rows.jsonl#L2))" in table[1] and page.read_text().endswith("\nnotes\n")


def test_a_benchmarks_wall_time_adds_up_over_its_invocations_or_says_it_cannot(learning, tmp_path):
    """A row's ``total_wall_s`` once recorded the last invocation's time alone: a 1M-step row resumed across two
    sessions said 1 801 s. It now adds every invocation's (``wall.json``), and is None once one left no record."""
    bench_dir = tmp_path / "bench"
    ledger = learning.open_wall(bench_dir, resumed=False)
    assert ledger == {"seconds": 0.0, "invocations": 1, "open": True}
    assert learning.close_wall(bench_dir, ledger, 10.5) == {"seconds": 10.5, "invocations": 1, "open": False}
    again = learning.close_wall(bench_dir, learning.open_wall(bench_dir, resumed=True), 5.0)
    assert again == {"seconds": 15.5, "invocations": 2, "open": False}
    learning.open_wall(bench_dir, resumed=True)  # killed before it could close its ledger
    for count in (4, 5):  # the time of invocation 3 is not known: neither is the total, from then on
        closed = learning.close_wall(bench_dir, learning.open_wall(bench_dir, resumed=True), 5.0)
        assert closed == {"seconds": None, "invocations": count, "open": False}
    old = tmp_path / "old"  # a benchmark directory from before the ledger
    old.mkdir()
    assert learning.close_wall(old, learning.open_wall(old, resumed=True), 5.0) == {
        "seconds": None, "invocations": None, "open": False}


@pytest.mark.integration
def test_a_run_writes_its_line_a_second_is_refused_and_a_resumed_one_replaces_it(tmp_path):
    results, runs = tmp_path / "results", tmp_path / "runs"
    bench = [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "acer", "cartpole", *TINY,
             "--results", str(results), "--runs", str(runs)]
    first = subprocess.run(bench, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    (bench_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    first_seconds = json.loads((bench_dir / "wall.json").read_text())["seconds"]
    lines = (results / "learning-rows.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert len(lines) == 1 and record["name"] == "acer-cartpole" and list(record["curves"]) == ["0"]
    assert len(record["final_score_per_seed"]) == 1 and (results / "acer-cartpole.png").is_file()
    # which code trained the seed from which step, and the packages: a row outlives the gitignored runs/
    (segment,) = record["seed_segments"]["0"]
    assert segment == {"from_env_steps": 0, "code": code_version(), "machine": machine(), "date": record["date"]}
    assert [p["torch"] for p in record["packages"]] == [torch.__version__] and record["packages"][0]["python"]

    again = subprocess.run(bench, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
    assert again.stderr.strip().splitlines()[-1].endswith("already holds a row acer-cartpole: give another --name, "
                                                         "or --replace")
    assert (results / "learning-rows.jsonl").read_text().splitlines() == lines

    resumed = subprocess.run([*bench, "--replace", "--resume", str(bench_dir)], cwd=tmp_path, env=ENV,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (line,) = (results / "learning-rows.jsonl").read_text().splitlines()
    replaced = json.loads(line)
    assert replaced["curves"] == record["curves"], "the finished seed was read, not run again"
    assert replaced["command"] == record["command"] and (record["invocations"], replaced["invocations"]) == (1, 2)
    assert record["total_wall_s"] == round(first_seconds, 1) > 0
    assert json.loads((bench_dir / "wall.json").read_text())["seconds"] > first_seconds, "both invocations' time"
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


SEGMENT = {"from_env_steps": 0, "code": "abc1234", "machine": "elsewhere", "date": "2026-11-28"}  # seed 0's


def recorded_seed0(learning, runs, results):
    """``results/acer-cartpole-partial/``, the record of a stopped benchmark's finished seed 0 (192 env steps, final
    score 8.0), written from its run in ``runs``; the record's folder, the seed's summary and what it ran."""
    seed_dir = runs / "acer-cartpole-20261128-000000" / "seed0"
    seed_dir.mkdir(parents=True)
    (seed_dir / "summary.json").write_text(json.dumps(
        {"env_steps": 192, "wall_time_s": 2.0, "env_steps_per_s": 96.0, "eval_return_mean": 8.0}))
    (seed_dir / "metrics.csv").write_text("env_steps,eval_return_mean\n96,5.0\n176,7.0\n184,8.0\n192,9.0\n")
    (seed_dir / "provenance.jsonl").write_text(json.dumps(SEGMENT) + "\n")
    finished = learning.run_seed("acer", "cartpole", 0, 192, seed_dir, [])
    assert finished["final_score"] == 8.0, finished
    partial = learning.partial_dir(results, "acer-cartpole")
    ran = learning.what_ran("acer", "cartpole", 192, [])
    learning.record_partial(partial, seed_dir.parent, [finished], "python benchmarks/learning.py acer cartpole", ran)
    return partial, finished, ran


def test_a_stopped_benchmarks_finished_seeds_outlive_its_directory(learning, tmp_path):
    """A row's seeds can outlast a session, and the next session's machine may be a fresh one: the seeds finished
    before a stop are recorded in ``results/<name>-partial/``; with the benchmark's directory gone,
    ``--restore-partial`` reads them from there (no run) and runs only the others; the row replaces the record."""
    runs, results = tmp_path / "runs", tmp_path / "results"
    partial, finished, ran = recorded_seed0(learning, runs, results)
    assert sorted(p.name for p in partial.iterdir()) == ["README.md", "benchmark.json", "curves.png",
                                                          "seed0-metrics.csv", "seed0-provenance.jsonl",
                                                          "seed0-summary.json"]
    assert "seed 0 8.0" in (partial / "README.md").read_text()

    clash = tmp_path / "elsewhere" / "seed0"
    (clash / "checkpoint").mkdir(parents=True)
    with pytest.raises(SystemExit, match="holds a run of seed 0"):
        learning.restore_partial(partial, clash.parent, ran)
    with pytest.raises(SystemExit, match="holds seeds of .* not of this benchmark's"):  # other settings
        learning.restore_partial(partial, tmp_path / "other", learning.what_ran("acer", "cartpole", 192, ["gamma=0.9"]))
    assert not (tmp_path / "other").exists()

    shutil.rmtree(runs)  # a fresh machine: the benchmark's directory is gone
    bench = [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "acer", "cartpole", "--seeds", "1",
             "--frames", "192", "--parallel", "1", "--results", str(results), "--runs", str(runs)]
    restored = subprocess.run([*bench, "--restore-partial"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                              timeout=120)
    assert restored.returncode == 0, restored.stderr[-3000:]
    (line,) = (results / "learning-rows.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["final_score_per_seed"] == [8.0] and record["curves"]["0"] == [list(p) for p in finished["curve"]]
    assert record["seed_segments"] == {"0": [SEGMENT]}, "the restored seed's code, from the record"
    assert record["total_wall_s"] is None and record["invocations"] is None, "the recorded seed's time is unknown"
    assert not list(runs.glob("*/seed0.log")), "the recorded seed was read, not run"
    assert not partial.exists(), "the row replaces the partial record"
    gone = subprocess.run([*bench, "--name", "other", "--restore-partial"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert gone.returncode == 2 and "--restore-partial: no record" in gone.stderr.strip().splitlines()[-1]


@pytest.mark.integration
def test_a_partial_record_of_seeds_the_row_does_not_hold_is_kept(learning, tmp_path):
    """A benchmark resumed with other seeds (``--first-seed``) than those its partial record holds: the row holds the
    seeds it ran, and the record, their only copy outside ``runs/``, stays (a note says so)."""
    runs, results = tmp_path / "runs", tmp_path / "results"
    partial, _, _ = recorded_seed0(learning, runs, results)
    shutil.rmtree(runs)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learning.py"), "acer", "cartpole", "--seeds",
                           "1", "--first-seed", "1", "--frames", "192", "--parallel", "1", "--results", str(results),
                           "--runs", str(runs), "--restore-partial"], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = (results / "learning-rows.jsonl").read_text().splitlines()
    assert json.loads(line)["seeds_finished"] == [1]
    assert (partial / "seed0-summary.json").is_file()
    assert f"note: {partial} kept: it holds seeds [0], which this row does not" in proc.stderr


@pytest.mark.integration
def test_a_benchmark_stopped_while_a_seed_runs_records_the_seeds_it_had_finished(tmp_path):
    """SIGINT to the benchmark while its second seed runs: that seed checkpoints, the first one (finished) is
    recorded in ``results/<name>-partial/``, and the stop's last line says so."""
    runs, results = tmp_path / "runs", tmp_path / "results"
    bench_dir = runs / "acer-cartpole-20261128-000000"
    (bench_dir / "seed0").mkdir(parents=True)  # finished before (an earlier invocation)
    (bench_dir / "seed0" / "summary.json").write_text(json.dumps(
        {"env_steps": 200000, "wall_time_s": 2.0, "env_steps_per_s": 96.0, "eval_return_mean": 8.0}))
    (bench_dir / "seed0" / "metrics.csv").write_text(
        "env_steps,eval_return_mean\n180000,7.0\n190000,8.0\n200000,9.0\n")
    settings = [arg for arg in TINY if "=" in arg and not arg.startswith("eval.interval")]
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "learning.py"), "acer", "cartpole", "--seeds",
                             "2", "--frames", "200000", "--parallel", "1", "--results", str(results), "--resume",
                             str(bench_dir), *settings], cwd=tmp_path, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (bench_dir / "seed1" / "metrics.csv").exists():  # the second seed is learning
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-3000:]
    partial = results / "acer-cartpole-partial"
    assert f"seeds [0] recorded in {partial}: continue with" in err.strip().splitlines()[-1]
    assert sorted(p.name for p in partial.iterdir()) == ["README.md", "benchmark.json", "curves.png",
                                                         "provenance.json", "seed0-metrics.csv",
                                                         "seed0-summary.json", "wall.json"]
    assert json.loads((partial / "wall.json").read_text())["open"] is False, "the ledger goes with the seeds"
    assert (bench_dir / "seed1" / "checkpoint").is_dir() and not (results / "learning-rows.jsonl").exists()


@pytest.mark.parametrize("given, message", [
    (["--seed-offset", "700"], "error: unrecognized arguments: --seed-offset"),
    (["acer.replay_ratioo=2"], "error: unknown config key 'acer.replay_ratioo'"),
    (["seed=7"], "error: seed= is the benchmark's to set for each seed (--seeds and --first-seed): drop it"),
    (["total_frames=999"], "error: total_frames= is the benchmark's to set for each seed (--frames): drop it"),
    (["--seeds", "0"], "error: --seeds 0: give at least 1"),
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


def finished_seed(run_dir: Path, *, env_steps: int = 192, score: float = 8.0, seed: int = 0, **summary) -> None:
    """A finished seed's files as a recipe leaves them: summary.json and a metrics.csv giving its final score."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(
        {"algorithm": "acer", "seed": seed, "env_steps": env_steps, "eval_return_mean": score, **summary}))
    (run_dir / "metrics.csv").write_text(
        f"env_steps,eval_return_mean\n{env_steps - 16},{score - 1}\n{env_steps - 8},{score}\n{env_steps},{score + 1}\n")


def test_a_seed_directory_of_other_settings_or_another_length_is_not_read_into_the_row(learning, tmp_path):
    """``--resume`` read a finished seed whatever it had run (a LASER seed 7 of 20k steps passed as seed 0 of an ACER
    50k row) and resumed a checkpointed one to its own length; each now is one line before any seed runs."""
    from acer_torchrl.config import dump_yaml, load_config

    settings = ["network.hidden=16", "eval.episodes=2"]
    run_dir = tmp_path / "seed0"

    def why(frames: int = 192, extra=settings) -> str | None:
        return learning.not_this_seed("acer", "cartpole", 0, frames, extra, run_dir)

    assert why() is None  # nothing there yet
    finished_seed(run_dir)
    config = load_config("acer", ["preset=cartpole", "seed=0", "total_frames=192", *settings])
    dump_yaml(config, run_dir / "config.yaml")
    assert why() is None
    assert why(extra=["network.hidden=16", "eval.episodes=10"]) == (
        "it ran with eval.episodes=2; this benchmark's seed 0 has eval.episodes=10")
    assert why(frames=384).startswith("it ran with total_frames=192; this benchmark's seed 0 has total_frames=384")
    # resumed by hand with another setting, later put back: config.yaml agrees, its first segment did not
    changed = {"optim.lr": {"from": 0.01, "to": config.optim.lr}, "threads": {"from": 1, "to": 2}}
    (run_dir / "resumes.jsonl").write_text(json.dumps({"env_steps": 96, "changed": changed}) + "\n")
    assert why() == (f"it ran with optim.lr=0.01 up to 96 env steps (its resumes.jsonl); this benchmark's seed 0 has "
                     f"optim.lr={config.optim.lr}")
    (run_dir / "resumes.jsonl").write_text(json.dumps({"env_steps": 96, "changed": {"threads": {"from": 1, "to": 2}}}))
    assert why() is None  # (how it ran, not what it computed)
    (run_dir / "resumes.jsonl").unlink()
    (run_dir / "config.yaml").unlink()  # a seed restored from a record of before config.yaml went with it
    assert why(frames=384) == "it finished at 192 env steps, not the benchmark's 384"
    finished_seed(run_dir, seed=7)
    assert why() == "its summary.json is of seed 7, not 0"
    finished_seed(run_dir, algorithm="laser")
    assert why() == "its summary.json is of algorithm laser, not acer"
    finished_seed(run_dir)
    with (run_dir / "metrics.csv").open("a") as f:  # resumed by hand to train on, and killed: rows past its summary
        f.write("400,100.0\n")
    assert why() == ("its metrics.csv gives a final score of 31 at 192 env steps, its summary.json 8 (evaluations "
                     "logged after it finished?)")
    with pytest.raises(SystemExit, match=r"^error: .*seed0 is not a run of this benchmark's seed 0: its metrics.csv"):
        learning.check_seed_dirs("acer", "cartpole", range(2), 192, settings, tmp_path)


def test_a_record_restored_into_a_benchmark_with_ledgers_of_its_own_adds_its_invocations_once(learning, tmp_path):
    """``--resume X --restore-partial`` where X has run already: the row names the code and machines of the restored
    seeds' invocations too, and counts their time; restored again, nothing is counted twice."""
    folder, bench = tmp_path / "record", tmp_path / "bench"
    folder.mkdir()
    bench.mkdir()
    ran = learning.what_ran("acer", "cartpole", 192, [])
    (folder / "benchmark.json").write_text(json.dumps(ran) + "\n")
    there, here = {"code": "aaa", "machine": "m1", "date": "d1"}, {"code": "bbb", "machine": "m2", "date": "d2"}
    (folder / learning.PROVENANCE).write_text(json.dumps([there]))
    (folder / learning.WALL).write_text(json.dumps({"seconds": 100.0, "invocations": 1, "open": False}))
    (bench / learning.PROVENANCE).write_text(json.dumps([here]))
    (bench / learning.WALL).write_text(json.dumps({"seconds": 5.0, "invocations": 1, "open": False}))
    for _ in range(2):
        assert learning.restore_partial(folder, bench, ran) == []
        assert json.loads((bench / learning.PROVENANCE).read_text()) == [there, here]
        assert json.loads((bench / learning.WALL).read_text()) == {"seconds": 105.0, "invocations": 2, "open": False}


def test_a_row_names_the_code_its_seeds_trained_on_where_the_benchmark_ran_other_code(learning):
    row = {"name": "a", "threshold": None, "frames": 10, "failed": [], "final_score_ci95": [1.0, 2.0],
           "final_score_iqm": 1.5, "final_score_per_seed": [1.0, 2.0], "steps_to_threshold": [],
           "final_score_at_threshold": "n/a", "wall_time_s_per_seed": 1.0, "env_steps_per_s": 1.0, "machine": "m",
           "date": "d", "command": "c", "code": "bbb, ccc", "seed_code": "bbb"}
    # a row ported (or resumed) by a checkout whose code trained no seed: named, but not as the seeds' code
    assert ", code bbb, ccc (seeds trained on bbb) |" in learning.markdown_row(row, 1)
    row["seed_code"] = "aaa, bbb"  # a seed resumed by hand on other code
    assert ", code bbb, ccc (seeds trained on aaa, bbb) |" in learning.markdown_row(row, 1)
    row["seed_code"] = "bbb, ccc"
    assert ", code bbb, ccc |" in learning.markdown_row(row, 1)


def test_a_seed_whose_final_score_is_not_a_number_is_a_failed_seed(learning, tmp_path):
    """An evaluation that returned NaN (a NaN reward) made the seed's score NaN, and the row's IQM with it."""
    run_dir = tmp_path / "seed0"
    finished_seed(run_dir, score=float("nan"))
    assert learning.run_seed("acer", "cartpole", 0, 192, run_dir, []) == {
        "seed": 0, "failed": f"final score nan (an evaluation returned it, see {run_dir / 'metrics.csv'})"}


def test_a_seed_made_longer_on_resume_is_this_benchmarks_only_where_the_step_size_does_not_fall_over_its_length(
        learning, tmp_path):
    """``total_frames`` raised on resume leaves the numbers of a run that long all along, unless
    ``optim.lr_end_factor`` < 1: the step size then fell over the first length and jumped back up."""
    from acer_torchrl.config import dump_yaml, load_config

    run_dir = tmp_path / "seed0"
    run_dir.mkdir()
    made_longer = {"env_steps": 192, "changed": {"total_frames": {"from": 192, "to": 384}}}
    (run_dir / "resumes.jsonl").write_text(json.dumps(made_longer) + "\n")
    for settings, refused in ((["optim.lr_end_factor=0.5"], True), ([], False)):
        dump_yaml(load_config("acer", ["preset=cartpole", "seed=0", "total_frames=384", *settings]),
                  run_dir / "config.yaml")
        why = learning.not_this_seed("acer", "cartpole", 0, 384, settings, run_dir)
        assert why == ("it ran with total_frames=192 up to 192 env steps (its resumes.jsonl); this benchmark's seed 0 "
                       "has total_frames=384" if refused else None), why


def test_per_seed_scores_are_shown_on_the_side_of_the_threshold_they_are(learning):
    assert [learning.shown(x, 475.0) for x in (474.96, 475.0, 474.94, 499.99)] == [474.96, 475.0, 474.9, 500.0]
    assert learning.shown(474.9999999, 475.0) == 474.9999999 and learning.shown(3.14159, None) == 3.1


def test_a_row_whose_evaluations_break_the_final_score_rule_says_so(learning):
    """Fewer than 10 greedy episodes an evaluation, or games cut at eval.max_steps: the score cell says it."""
    row = {"name": "a", "threshold": None, "frames": 10, "failed": [], "final_score_ci95": [1.0, 2.0],
           "final_score_iqm": 1.5, "final_score_per_seed": [1.0, 2.0], "steps_to_threshold": [],
           "final_score_at_threshold": "n/a", "wall_time_s_per_seed": 1.0, "env_steps_per_s": 1.0, "machine": "m",
           "date": "d", "command": "c"}
    assert "(evaluations" not in learning.markdown_row(row, 1) and "cut" not in learning.markdown_row(row, 1)
    one_seed = {**row, "final_score_per_seed": [1.5], "final_score_ci95": [1.5, 1.5]}
    assert "1.5 [1.5, 1.5] (1 seed: no interval) |" in learning.markdown_row(one_seed, 1)
    row.update(eval_episodes_per_seed=[10, [3, 10]], eval_games_cut_per_seed=[0, 4])
    assert "1.5 [1.0, 2.0] (2 seeds: mean [min, max]) (evaluations of 3 episodes, under 10) (4 evaluation games cut at " \
           "eval.max_steps) |" in learning.markdown_row(row, 1)


def test_failed_and_diverged_seeds_are_named_and_a_row_of_failures_is_not_written(learning, tmp_path, monkeypatch):
    """A seed that failed is named in the row and the benchmark exits 1 after writing the others; with every seed
    failed there is no row (it would stand for the benchmark, or replace its row with --replace) and the partial
    record stays. A diverged seed's score is marked, and one with an evaluation that was not finite; the row names the code and machine of each invocation."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    outcome = {0: {"health": {"status": "evaluation_not_finite"}}, 1: {"health": {"status": "diverged"}}, 2: None}

    def run_seed(algo, preset, seed, frames, run_dir, extra):
        if outcome[seed] is None:
            return {"seed": seed, "failed": f"exit 1, see {run_dir.with_suffix('.log')}"}
        curve = [(160, 1.0 + seed), (176, 2.0 + seed), (192, 3.0 + seed)]
        return {"seed": seed, "curve": curve, "final_score": 2.0 + seed, "env_steps": 192, "wall_time_s": 1.0,
                "env_steps_per_s": 192.0, "final_score_evaluations": 3, **outcome[seed]}

    monkeypatch.setattr(learning, "run_seed", run_seed)
    argv = ["acer", "cartpole", "--seeds", "3", "--frames", "192", "--results", str(results), "--runs", str(runs)]
    with pytest.raises(SystemExit, match=r"^error: 1 of 3 seeds failed \(seed 2: exit 1, see .*seed2.log\); the row "
                                         r"holds the others$"):
        learning.benchmark(argv)
    row = learning.read_rows(results / learning.ROWS)["acer-cartpole"]
    assert (row["seeds_finished"], row["final_score_per_seed"], row["diverged_seeds"]) == ([0, 1], [2.0, 3.0], [1])
    assert row["evaluation_not_finite_seeds"] == [0]
    assert row["failed"][0].startswith("seed 2: exit 1") and row["final_score_evaluations"] == [3, 3]
    assert row["code"] == code_version(paths=learning.CODE_PATHS) and row["machine"] == machine()
    line = next(t for t in (results / "learning.md").read_text().splitlines() if t.startswith("| [acer-cartpole]"))
    assert "| 2.0 (an evaluation not finite), 3.0 (diverged) |" in line and f", code {row['code']} |" in line and "FAILED: 1" in line

    outcome.update({0: None, 1: None})
    partial = learning.partial_dir(results, "other")
    partial.mkdir()
    with pytest.raises(SystemExit, match=r"^error: no seed finished \(seed 0: exit 1.*; seed 2: .*\): no row written$"):
        learning.benchmark([*argv, "--name", "other"])
    assert "other" not in learning.read_rows(results / learning.ROWS) and partial.is_dir()


def test_a_row_does_not_take_the_name_of_a_figure_other_rows_or_pages_show(learning, tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    learning.write_row(results / learning.ROWS, {"name": "tune-a", "figure": "tuning.png"})
    (results / "tuning.png").write_bytes(b"png")
    (results / "laser-sweep.png").write_bytes(b"png")
    for name in ("tuning", "laser-sweep"):
        with pytest.raises(SystemExit) as stop:
            learning.benchmark(["acer", "cartpole", "--frames", "192", "--name", name, "--results", str(results)])
        assert stop.value.code == 2 and f"{name}.png is another figure's" in capsys.readouterr().err
    assert (results / "tuning.png").read_bytes() == b"png" == (results / "laser-sweep.png").read_bytes()


def test_a_recorded_threshold_is_exact(learning):
    assert [learning.exact(x) for x in (475.0, 17.5, 1234567.5, 0.1)] == ["475", "17.5", "1234567.5", "0.1"]


def test_a_row_replaced_out_of_a_shared_figure_leaves_it_drawn_without_its_old_curves(learning, tmp_path, monkeypatch):
    """``--replace`` of a row that ``learning.py figure`` drew with another: the row gets its own curve file back and
    the shared figure is drawn again from the other row alone (before, it kept showing the replaced curves); once no
    row names it, it goes."""
    results = tmp_path / "results"
    results.mkdir()
    base = {"threshold": None, "frames": 192, "failed": [], "final_score_ci95": [1.0, 1.0], "final_score_iqm": 1.0,
            "final_score_at_threshold": "n/a", "steps_to_threshold": [], "wall_time_s_per_seed": 1.0,
            "env_steps_per_s": 1.0, "machine": "m", "date": "d", "command": "c", "final_score_per_seed": [1.0],
            "curves": {"0": [[96, 0.0], [192, 1.0]]}}
    for name in ("acer-cartpole", "other"):
        learning.write_row(results / learning.ROWS, {**base, "name": name})
        learning.put_markdown_row({**base, "name": name}, results / "learning.md")
    learning.shared_figure(["fig", "acer-cartpole", "other", "--results", str(results)])
    drawn = []
    monkeypatch.setattr(learning, "plot_rows",
                        lambda rows, path, title: drawn.append(([r["name"] for r in rows], path)))
    monkeypatch.setattr(learning, "run_seed", lambda algo, preset, seed, frames, run_dir, extra: {
        "seed": seed, "curve": [(96, 2.0), (192, 3.0)], "final_score": 2.5, "env_steps": 192, "wall_time_s": 1.0,
        "env_steps_per_s": 192.0})
    learning.benchmark(["acer", "cartpole", "--seeds", "1", "--frames", "192", "--results", str(results),
                        "--runs", str(tmp_path / "runs"), "--replace"])
    records = learning.read_rows(results / learning.ROWS)
    assert "figure" not in records["acer-cartpole"] and (results / "acer-cartpole.png").is_file()
    assert drawn == [(["other"], results / "fig.png")]
    learning.redraw_shared_figure(results, "nothing-names-it.png")
    (results / "gone.png").write_bytes(b"png")
    learning.redraw_shared_figure(results, "gone.png")
    assert not (results / "gone.png").exists()
