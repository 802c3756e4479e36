"""``replay.prefetch``: an update plan's next batch drawn on the ``draw-ahead`` thread while the update in hand runs
(:meth:`acer_torchrl.trainer.Trainer.planned_batches`). The same draws as without it, in the same order, the
replay's generator in the same state after every collected batch (where a checkpoint can be taken), and no thread
left running when an update or a draw fails."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from acer_torchrl.config import load_config
from acer_torchrl.replay import EpisodeReplay
from acer_torchrl.trainer import Trainer
from process_group import captured, signal_group, spawned_children, wait_for

ROOT = Path(__file__).resolve().parents[1]

TINY = ["collector.workers=0", "collector.frames_per_batch=48", "replay.min_size=96", "replay.batch_size=8",
        "network.hidden=16", "eval.background=false", "eval.episodes=1", "eval.max_steps=20", "eval.interval=100000",
        "log.checkpoint_interval=100000", "log.progress=false", "threads=1"]


def tiny_trainer(tmp_path, algo: str, prefetch: bool, *overrides: str) -> Trainer:
    return Trainer(load_config(algo, [*TINY, f"replay.prefetch={prefetch}", f"run_dir={tmp_path / str(prefetch)}",
                                      *overrides]))


def draw_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("draw-ahead")]


def trace(trainer: Trainer, batches: int) -> tuple[list, list, list[str]]:
    """The slots of every update's batch, the replay generator's state after each collected batch, and the threads
    that drew; ``batches`` collected batches stepped through, the trainer closed."""
    slots, states, drawn_on = [], [], []
    draw, update = trainer.draw_batch, trainer.update

    def recorded_draw(share):
        drawn_on.append(threading.current_thread().name)
        return draw(share)

    def recorded_update(sample):
        slots.append(sample.get("slot").clone() if "slot" in sample.keys() else None)
        return update(sample)

    trainer.draw_batch, trainer.update = recorded_draw, recorded_update
    try:
        collected = trainer.start()
        for _ in range(batches):
            trainer.step(next(collected))
            states.append(trainer.replay.generator.get_state())
    finally:
        trainer.close()
    return slots, states, drawn_on


@pytest.mark.parametrize("algo, preset", [("acer", "cartpole"), ("laser", "cartpole"), ("reactor", "cartpole"),
                                          ("vracer", "pendulum")])
def test_prefetch_draws_the_same_batches_in_the_same_order(tmp_path, algo, preset):
    """ACER's on-policy batch and replayed ones, LASER's online windows mixed in, Reactor's sequences, V-RACER's
    single steps with the estimates its updates write back: the same batches, the same generator state after each
    collected batch, the same trained weights; with prefetch the draws ran on the draw-ahead thread."""
    runs = {}
    for prefetch in (False, True):
        trainer = tiny_trainer(tmp_path, algo, prefetch, f"preset={preset}")
        runs[prefetch] = (*trace(trainer, batches=6), trainer.loss.state_dict())
    (slots, states, threads, weights), (slots_ahead, states_ahead, threads_ahead, weights_ahead) = runs.values()
    assert len(slots) >= 5 and len(slots_ahead) == len(slots)
    for before, after in zip(slots, slots_ahead):
        assert (before is None and after is None) or torch.equal(before, after)
    assert all(torch.equal(a, b) for a, b in zip(states, states_ahead))
    assert all(torch.equal(weights[k], weights_ahead[k]) for k in weights)
    assert set(threads) == {"MainThread"} and any(name.startswith("draw-ahead") for name in threads_ahead)
    assert not draw_threads()


@pytest.mark.parametrize("algo, overrides", [("laser", ["preset=cartpole_pomdp"]),
                                             ("reactor", ["preset=cartpole", "replay.prioritized=true"])])
def test_prefetch_is_off_where_a_draw_reads_what_the_update_before_changes(tmp_path, algo, overrides):
    """LASER's LSTM preset refreshes each sequence's start state with the network an update is changing; a
    prioritized replay draws by the priorities the update before wrote: their draws stay on the main thread."""
    trainer = tiny_trainer(tmp_path, algo, True, *overrides)
    try:
        assert not trainer.draws_ahead() and trainer._drawer is None
    finally:
        trainer.close()


@pytest.mark.parametrize("failing", ["update", "draw"])
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failed_update_or_draw_ends_the_step_with_its_error_and_no_draw_running(tmp_path, monkeypatch, failing,
                                                                                  error):
    """An update that fails (or a Ctrl-C in it, as in a library's loop without stop signals) while the next batch
    is being drawn (a slow draw here), or a draw that fails (on the draw-ahead thread, or on the main thread when it
    took over a draw the thread had not begun): the step raises that error in the main thread once the draw in
    flight ended (none runs on), and closing the trainer leaves no draw-ahead thread."""
    calls, draws = [], []  # the calls of what fails; each slow draw's (start, end)

    def fails_second_time(original):
        def call(*args):
            calls.append(threading.current_thread().name)
            if len(calls) == 2:
                raise error("planted")
            return original(*args)
        return call

    def slow_draw(self, *args, **kwargs):
        start = time.perf_counter()
        time.sleep(0.2)
        try:
            return sample_sequences(self, *args, **kwargs)
        finally:
            draws.append((start, time.perf_counter()))

    sample_sequences = EpisodeReplay.sample_sequences
    monkeypatch.setattr(EpisodeReplay, "sample_sequences",
                        fails_second_time(sample_sequences) if failing == "draw" else slow_draw)
    trainer = tiny_trainer(tmp_path, "acer", True, "preset=cartpole", "acer.replay_ratio=8")
    if failing == "update":
        trainer.update = fails_second_time(trainer.update)
    try:
        collected = trainer.start()
        with pytest.raises(error, match="planted"):
            for _ in range(20):
                trainer.step(next(collected))
        raised = time.perf_counter()
        time.sleep(0.5)  # a draw the step left behind would start or end by now
        assert all(end < raised for _, end in draws)
    finally:
        trainer.close()
    assert calls[1] == "MainThread" or failing == "draw"  # a draw not yet begun on the thread is taken on this one
    assert not draw_threads()


@pytest.mark.integration
@pytest.mark.parametrize("stop", ["SIGTERM", "worker SIGKILL"])
def test_a_prefetching_run_stops_on_sigterm_or_a_dead_worker_with_one_line(tmp_path, stop):
    """A recipe run with ``replay.prefetch=true`` and 8 replayed updates a batch (a draw in flight most of the
    time): SIGTERM to its process group, or SIGKILL to a collector worker, ends it as without the thread: one line,
    exit code 143 / 3, a checkpoint, within seconds (no draw-ahead thread keeps the process alive)."""
    run_dir = tmp_path / "run"
    args = [sys.executable, str(ROOT / "recipes" / "acer.py"), f"run_dir={run_dir}", "total_frames=100000",
            "replay.prefetch=true", "acer.replay_ratio=8", "collector.workers=1", "log.checkpoint_interval=96",
            "eval.background=false", "eval.interval=100000", "eval.max_steps=20", "collector.frames_per_batch=48",
            "replay.min_size=96", "replay.batch_size=8", "network.hidden=16", "log.progress=false"]
    proc = subprocess.Popen(args, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    wait_for((run_dir / "checkpoint" / "counters.json").exists, proc, 120)  # learning, a periodic checkpoint taken
    if stop == "SIGTERM":
        code, output, seconds = signal_group(proc, signal.SIGTERM)
    else:
        start = time.monotonic()
        os.kill(spawned_children(proc.pid)[0], signal.SIGKILL)
        code, output, seconds = proc.wait(timeout=60), captured(proc), time.monotonic() - start
    steps = json.loads((run_dir / "checkpoint" / "counters.json").read_text())["env_steps"]
    assert code == (143 if stop == "SIGTERM" else 3) and "Traceback" not in output, output
    assert re.search(rf"(interrupted|stopped) at {steps} env steps; continue with: ", output.strip().splitlines()[-1])
    assert seconds < 30
