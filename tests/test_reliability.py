"""What a run survives: a signal to its whole process group at any moment, a second run into its directory, a
full disk, a helper process killed. Process-level checks start a real recipe in a session of its own, as a terminal or
SLURM runs it."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from acer_torchrl.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from acer_torchrl.commands import shell_command
from acer_torchrl.config import ConfigError
from acer_torchrl.metrics import MetricsLog, save_learning_curve, write_summary
from acer_torchrl.replay import EpisodeReplay
from acer_torchrl.rundir import lock_run_dir
from process_group import captured, signal_group, spawned_children, wait_for

RECIPE = str(Path(__file__).parents[1] / "recipes" / "acer.py")
QUIET = ["preset=cartpole", "log.progress=false", "eval.episodes=2"]


def start_recipe(run_dir: Path, *overrides: str) -> subprocess.Popen:
    """``recipes/acer.py`` in a session (process group) of its own, its stdout and stderr in one pipe."""
    return subprocess.Popen([sys.executable, RECIPE, *QUIET, f"run_dir={run_dir}", *overrides],
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def last_line_alone(output: str) -> str:
    """The output's last line, checked to be the only one about the stop and to follow no traceback (the lines
    before it are the run's own, e.g. TorchRL's storage notices)."""
    lines = output.strip().splitlines()
    assert "Traceback" not in output and sum("interrupt" in line.lower() for line in lines) == 1, output
    return lines[-1]


@pytest.mark.integration
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_group_signal_during_start_up_ends_at_once_with_one_line(tmp_path, sig, code):
    proc = start_recipe(tmp_path / "run", "total_frames=200000")
    time.sleep(3.0)  # imports, the agent, the workers starting: before the first batch
    returncode, output, took = signal_group(proc, sig)
    assert (returncode, last_line_alone(output)) == (code, "interrupted during start-up: nothing to save yet")
    assert took < 10, f"acted after {took:.1f} s"
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_a_live_run_is_named_before_what_its_directory_holds(tmp_path):
    """A new run into the directory of a live run that has checkpointed is told that the run is in use (its pid), not
    that it holds a run to continue with resume= (which the live run's lock would refuse); once that run is gone,
    what it left is refused as before."""
    from acer_torchrl.rundir import prepare_run_dir
    from acer_torchrl.validation import ConfigError

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    live = lock_run_dir(run_dir, "run_dir")  # another open file: flock tells it from ours as from another process's
    try:
        in_use = rf"^run_dir={run_dir} is in use by another run \(host .*, pid {os.getpid()}\)"
        with pytest.raises(ConfigError, match=in_use):
            prepare_run_dir(run_dir, resume=False, overwrite=False)
    finally:
        live.close()
    with pytest.raises(ConfigError, match=rf"^run_dir={run_dir} already holds a run"):
        prepare_run_dir(run_dir, resume=False, overwrite=False)
    _, lock = prepare_run_dir(run_dir, resume=False, overwrite=True)
    lock.close()
    assert not (run_dir / "summary.json").exists()


@pytest.mark.integration
def test_a_second_run_into_a_locked_run_dir_is_refused_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    first = start_recipe(run_dir, "total_frames=200000")
    try:
        wait_for(lambda: f"pid {first.pid}" in (run_dir / "run.lock").read_text() if (run_dir / "run.lock").exists()
                 else False, first, 180)
        # generous limits: the second process starts (imports torch) beside the first's learner and workers
        second = subprocess.run([sys.executable, RECIPE, *QUIET, f"run_dir={run_dir}"], capture_output=True, text=True,
                                timeout=180)
        assert second.returncode == 2 and not second.stdout, second
        [line] = second.stderr.strip().splitlines()
        assert f"run_dir={run_dir} is in use by another run" in line and f"pid {first.pid}" in line
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # a crash: the kernel releases the lock with the process
        first.wait()
    lock_run_dir(run_dir, "run_dir").close()  # the stale lock file is no obstacle


@pytest.mark.integration
def test_a_signal_to_the_learning_benchmark_reaches_its_running_seed_which_checkpoints(tmp_path, monkeypatch):
    """``kill -INT <benchmark pid>`` (not the whole group) runs ``learning.forward_stop`` in the benchmark: the
    running seed's recipe gets the signal and checkpoints, and the seed after it never starts. In-process (the
    benchmark's own start needs the ``bench`` extra, which ``make install`` leaves out)."""
    monkeypatch.syspath_prepend(str(Path(RECIPE).parents[1] / "benchmarks"))
    import learning

    monkeypatch.setattr(learning, "INTERRUPTED", threading.Event())
    seed0, results = tmp_path / "seed0", []
    runner = threading.Thread(target=lambda: results.append(
        learning.run_seed("acer", "cartpole", 0, 200_000, seed0, ["eval.episodes=2"])))
    runner.start()
    deadline = time.monotonic() + 180
    while not (seed0 / "metrics.csv").exists():  # learning
        assert runner.is_alive() and time.monotonic() < deadline, results
        time.sleep(0.1)
    learning.forward_stop(signal.SIGINT, None)
    runner.join(timeout=120)
    assert not runner.is_alive() and results == [{"seed": 0, "failed": f"exit 130, see {seed0.with_suffix('.log')}"}]
    assert "interrupted at" in seed0.with_suffix(".log").read_text() and (seed0 / "checkpoint").exists()
    later = learning.run_seed("acer", "cartpole", 1, 200_000, tmp_path / "seed1", [])
    assert later["failed"] == "not started: the benchmark was interrupted" and not (tmp_path / "seed1").exists()


def test_the_lock_is_exclusive_within_a_process_too(tmp_path):
    held = lock_run_dir(tmp_path, "run_dir")
    with pytest.raises(ConfigError, match=f"pid {os.getpid()}"):
        lock_run_dir(tmp_path, "resume")
    held.close()
    lock_run_dir(tmp_path, "resume").close()


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (needs root and mount; skipped otherwise)."""
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip() or 'mount failed'}")
    yield path
    subprocess.run(["umount", str(path)], check=True)


def fill(path: Path, keep_free: int) -> None:
    """Fill the file system of ``path`` up to ``keep_free`` bytes."""
    import shutil

    (path / "filler").write_bytes(b"\0" * max(shutil.disk_usage(path).free - keep_free, 0))


def test_a_full_disk_refuses_the_checkpoint_and_keeps_the_previous_one(small_disk):
    replay = EpisodeReplay(100)
    save_checkpoint(small_disk, {"w": torch.ones(1000)}, {"env_steps": 64}, replay)
    fill(small_disk, 50_000)
    with pytest.raises(CheckpointError, match="checkpoint.tmp: no space left on device .* the previous checkpoint .* "
                                              "64 env steps. is kept"):
        save_checkpoint(small_disk, {"w": torch.ones(100_000)}, {"env_steps": 128}, replay)
    assert not (small_disk / "checkpoint.tmp").exists()
    state, counters = load_checkpoint(small_disk, EpisodeReplay(100))
    assert counters["env_steps"] == 64 and torch.equal(state["w"], torch.ones(1000))


def test_a_disk_that_fills_while_the_checkpoint_is_written_leaves_no_partial_one(small_disk, monkeypatch):
    import shutil

    from acer_torchrl import checkpoint

    fill(small_disk, 200_000)
    plenty = shutil.disk_usage(small_disk)._replace(free=1 << 40)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: plenty)  # the check before passes: filled after
    monkeypatch.setattr(checkpoint, "_write_failure", lambda err, run_dir: "no space left on device")
    with pytest.raises(CheckpointError, match="no space left on device; no earlier checkpoint to resume from"):
        save_checkpoint(small_disk, {"w": torch.ones(100_000)}, {"env_steps": 64}, EpisodeReplay(100))
    assert not (small_disk / "checkpoint.tmp").exists()


def test_a_full_disk_while_logging_metrics_warns_once_and_the_run_goes_on(small_disk, capsys):
    log = MetricsLog(small_disk)
    fill(small_disk, 0)
    log.row(64, 1, 0.5, {"loss": 1.0})
    log.row(128, 2, 1.0, {"loss": 2.0})
    [warning] = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith(f"warning: cannot write {small_disk / 'metrics.csv'} (no space left on device)")
    assert not (small_disk / "metrics.csv.tmp").exists()
    (small_disk / "filler").unlink()
    log.row(192, 3, 1.5, {"loss": 3.0})
    assert len((small_disk / "metrics.csv").read_text().splitlines()) == 4  # the header and every row


@pytest.mark.integration
def test_a_run_whose_checkpoint_does_not_fit_ends_with_one_line(small_disk):
    run = subprocess.run([sys.executable, RECIPE, *QUIET, f"run_dir={small_disk}", "total_frames=2000",
                          "log.checkpoint_interval=500", "replay.capacity=20000"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert sum(line.startswith("error") for line in lines) == 1, run.stderr
    line = lines[-1]
    tmp = small_disk / "checkpoint.tmp"
    assert line.startswith(f"error: cannot write the checkpoint {tmp}: no space left on device")
    assert not (small_disk / "checkpoint.tmp").exists()


def test_a_signal_inside_an_extensions_import_is_still_one_line(monkeypatch, capsys):
    """A Ctrl-C while a C extension initialises (mujoco's, seen under load) reaches the CLI as ``ImportError:
    initialization failed`` raised from the :class:`Interrupted`: still one line and 130, no traceback."""
    import signal as signals

    from acer_torchrl import cli
    from acer_torchrl.processes import Interrupted

    def interrupted_import(*_args, **_kwargs):
        try:
            raise Interrupted(signals.SIGINT)
        except Interrupted as stop:
            raise ImportError("initialization failed") from stop

    monkeypatch.setattr(cli, "run_from_command_line", interrupted_import)
    assert cli.main("acer", []) == 130
    assert capsys.readouterr().err.strip() == "interrupted during start-up: nothing to save yet"


def test_a_full_disk_refuses_summary_json_whole_and_the_curve_with_a_warning(small_disk, capsys):
    log = MetricsLog(small_disk)
    log.row(64, 1, 0.5, {"eval_return_mean": 1.0})
    fill(small_disk, 0)
    with pytest.raises(OSError, match="No space left"):
        write_summary(small_disk / "summary.json", {"pad": "x" * 100_000})
    assert not (small_disk / "summary.json").exists() and not (small_disk / "summary.json.tmp").exists()
    save_learning_curve(log, small_disk / "learning_curve.png", "a curve")  # a log: the run goes on
    [warning] = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith(f"warning: cannot write {small_disk / 'learning_curve.png'} (no space left on device)")
    assert not (small_disk / "learning_curve.png").exists() and not (small_disk / "learning_curve.tmp.png").exists()


def _share_and_hang_up(helper: bool) -> None:
    """A process that shares a file descriptor through multiprocessing's resource sharer (as a tensor put on a
    queue does) and whose reader hangs up before taking it (a learner stopping in the middle of the exchange)."""
    import socket
    from multiprocessing import resource_sharer

    from acer_torchrl.processes import ignore_learner_signals

    if helper:
        ignore_learner_signals()
    shared = resource_sharer.DupFd(os.open(os.devnull, os.O_RDONLY))
    address, _ = shared._id
    with socket.socket(socket.AF_UNIX) as reader:
        reader.connect(address)
    time.sleep(1.0)  # the sharer's thread meets the closed connection meanwhile


def test_a_signal_while_a_helper_starts_is_handled_once_the_start_is_done():
    """With another thread alive (the learner has several), the kernel gives a SIGINT that the starting thread
    blocks to that thread, and Python ran the handler in the start all the same: a CI run's Ctrl-C cut a worker's
    start in the middle of sending it its arguments, and the worker printed a traceback. The handler now runs as
    the start ends, once, with the signal it got."""
    from acer_torchrl.processes import learner_signals_held

    seen, other_thread_up, stop = [], threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (other_thread_up.set(), stop.wait(10)))
    def mine(signum, _frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGINT, mine)
    try:
        other.start()
        other_thread_up.wait(10)
        with learner_signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the other thread takes it; Python's check comes at the next instructions here
            assert seen == [], "the handler ran inside the start"
        assert seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is mine, "the run's own handler is back"
    finally:
        signal.signal(signal.SIGINT, previous)
        stop.set()
        other.join()


@pytest.mark.integration
def test_a_helper_is_quiet_when_the_stopping_learner_hangs_up_on_what_it_shares(capfd):
    """A collector worker's batch reaches the learner as file descriptors that a thread of the worker serves; a
    stop raised in the learner mid-exchange made that thread print a traceback into the run's stderr (a CI run saw
    it below the one line of a Ctrl-C). A helper process drops those; another process still prints them."""
    import multiprocessing as mp

    for helper in (True, False):
        process = mp.get_context("spawn").Process(target=_share_and_hang_up, args=(helper,))
        process.start()
        process.join(60)
        assert process.exitcode == 0
        err = capfd.readouterr().err
        assert ("Traceback" in err) == (not helper), err


# ---------------------------------------------------------------- damaged side files on resume
# a run of four evaluated batches (rows at 32, 64, 96 and 128 env steps), a few seconds
SIDE_RUN = ["total_frames=128", "collector.workers=0", "collector.frames_per_batch=32", "replay.min_size=64",
            "replay.batch_size=4", "network.hidden=16", "eval.interval=32", "eval.episodes=1", "eval.max_steps=20",
            "log.progress=false"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, dict]:
    """A finished run's directory and its summary, copied by the tests that damage it."""
    from acer_torchrl.cli import run

    run_dir = tmp_path_factory.mktemp("finished") / "run"
    return run_dir, run("acer", [*SIDE_RUN, f"run_dir={run_dir}"])


def damaged_copy(finished_run: tuple[Path, dict], tmp_path: Path, name: str, damage) -> Path:
    """A copy of the finished run whose file ``name`` holds ``damage(its bytes)``."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run[0], run_dir)
    (run_dir / name).write_bytes(damage((run_dir / name).read_bytes()))
    return run_dir


def second_row(damage):
    """``damage`` applied to metrics.csv's second row (env steps 64), the other lines as they were."""
    def apply(data: bytes) -> bytes:
        lines = data.splitlines(keepends=True)
        return b"".join([*lines[:2], damage(lines[2]), *lines[3:]])
    return apply


@pytest.mark.integration
@pytest.mark.parametrize("damage, kept", [
    (lambda data: data[:-9], [32, 64, 96]),  # a kill while a copy was written: its tail row cut short
    (second_row(lambda row: b"\x00\xff\xfe" + row[5:]), [32, 96, 128]),  # junk bytes
    (second_row(lambda row: row.replace(b",", b",text", 1)), [32, 96, 128]),  # a word where a number was
], ids=["cut-tail", "junk-bytes", "text-cell"])
def test_a_damaged_metrics_csv_is_repaired_on_resume_with_one_warning(finished_run, tmp_path, capsys, damage, kept):
    from acer_torchrl.cli import run

    run_dir = damaged_copy(finished_run, tmp_path, "metrics.csv", damage)
    capsys.readouterr()
    summary = run("acer", [f"resume={run_dir}", "total_frames=160"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: resume={run_dir}: metrics.csv: 1 unreadable line(s) dropped (the checkpoint at "
                        "128 env steps is what the run continues from)"]
    assert [row["env_steps"] for row in read_rows(run_dir)] == [*kept, 160]
    assert summary["env_steps"] == 160 and summary["restarts"] == 1


@pytest.mark.integration
@pytest.mark.parametrize("name, error", [
    ("metrics.csv", "cannot read {path} (is a directory) to continue its rows; move it away (the resumed run then "
                    "starts a new one) or make it a readable file"),
    ("summary.json", "{path} is a directory, where the run writes its summary; move it away (the resumed run writes a "
                     "new one from its checkpoint)"),
])
def test_a_side_file_that_cannot_be_read_or_replaced_ends_a_resume_in_one_line_touching_nothing(
        finished_run, tmp_path, capsys, name, error):
    """A directory where metrics.csv or summary.json was (tests run as root: no read permission would not stop them):
    one line, exit code 2, the run directory as it was (summary.json's: before the run trains, not after)."""
    from acer_torchrl.cli import main

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run[0], run_dir)
    (run_dir / name).unlink()
    (run_dir / name).mkdir()
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file() and path.name != "run.lock"}
    capsys.readouterr()
    assert main("acer", [f"resume={run_dir}", "total_frames=160"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {error.format(path=run_dir / name)}"]
    assert {path: path.read_bytes() for path in before} == before


def read_rows(run_dir: Path) -> list[dict]:
    """metrics.csv's rows, checked to be whole."""
    log = MetricsLog(run_dir)
    assert log.load_existing(10**9) is None  # the file is whole again
    return log.rows


@pytest.mark.integration
def test_a_half_written_summary_of_a_finished_run_is_rebuilt_from_its_checkpoint(finished_run, tmp_path, capsys):
    from acer_torchrl.cli import run

    run_dir = damaged_copy(finished_run, tmp_path, "summary.json", lambda data: data[: len(data) // 2])
    capsys.readouterr()
    summary = run("acer", [f"resume={run_dir}"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: resume={run_dir}: summary.json unreadable, rebuilt now (the checkpoint at 128 env "
                        "steps is what the run continues from)"]
    before = finished_run[1]
    for key in ("env_steps", "updates", "episodes", "eval_return_mean", "final_score_evaluations", "eval_return_last"):
        assert summary[key] == before[key], key
    assert json.loads((run_dir / "summary.json").read_text()) == summary and "already_finished" not in summary


TINY = ["network.hidden=16", "collector.frames_per_batch=32", "replay.min_size=64", "replay.batch_size=4",
        "eval.max_steps=50"]


@pytest.mark.integration
def test_a_collector_worker_killed_by_sigkill_saves_the_run_and_names_it_in_one_line(tmp_path):
    """The OOM killer's SIGKILL to a collector worker: the learner notices, saves the steps it took since its
    periodic checkpoint, names the worker (pid, signal) and the resume command in one line, exit code 3; that
    command continues the run from the saved step."""
    run_dir = tmp_path / "run"
    proc = start_recipe(run_dir, "total_frames=100000", "collector.workers=2", "log.checkpoint_interval=64",
                        "eval.background=false", "eval.interval=100000", *TINY)
    wait_for((run_dir / "checkpoint" / "counters.json").exists, proc, 120)  # learning, a periodic checkpoint taken
    periodic = json.loads((run_dir / "checkpoint" / "counters.json").read_text())["env_steps"]
    worker = spawned_children(proc.pid)[0]  # no evaluation process (eval.background=false): the workers alone
    os.kill(worker, signal.SIGKILL)
    output = captured(proc, timeout=60)
    saved = json.loads((run_dir / "checkpoint" / "counters.json").read_text())
    line = re.fullmatch(rf"collector worker [01] \(pid {worker}\) died \(killed by SIGKILL\); stopped at (\d+) env "
                        r"steps; continue with: (.*)", output.strip())
    assert proc.returncode == 3 and line and line[2] == shell_command("recipes/acer.py", f"resume={run_dir}"), output
    assert int(line[1]) == saved["env_steps"] >= periodic and saved["restarts"] == 0
    resume = f"{line[2]} total_frames={saved['env_steps'] + 32}"  # as printed, from where it was printed
    resumed = subprocess.run(resume, shell=True, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["env_steps"], summary["restarts"]) == (saved["env_steps"] + 32, 1)


@pytest.mark.integration
def test_a_killed_evaluation_process_is_restarted_and_the_run_goes_on(tmp_path):
    """The evaluation process killed (it holds no state): started again, one line says so, the run ends normally and
    ``metrics.csv`` has every evaluation. Killed as soon as it exists, so that the run has evaluations still to ask
    for on any machine (``tests/test_metrics.py`` kills one with evaluations in hand)."""
    run_dir = tmp_path / "run"
    proc = start_recipe(run_dir, "total_frames=192", "collector.workers=0", "eval.interval=64", "eval.episodes=1",
                        *TINY)
    wait_for(lambda: bool(spawned_children(proc.pid)), proc, 120)
    [evaluator] = spawned_children(proc.pid)  # no collector worker (collector.workers=0): the evaluation process
    os.kill(evaluator, signal.SIGKILL)
    output = captured(proc, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in output, output
    assert re.search(rf"^the evaluation process \(pid {evaluator}\) died \(killed by SIGKILL\); restarted, \d+ "
                     r"unfinished evaluation\(s\) asked again$", output, re.MULTILINE), output
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert [int(r["env_steps"]) for r in rows] == [64, 128, 160, 192]  # every 64, and a short run's last 3 batches
    assert all(r["eval_return_mean"] for r in rows)
