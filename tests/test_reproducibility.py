"""A fixed seed reproduces a run in one process (``collector.workers=0``): the same ``metrics.csv`` bit for bit,
apart from its wall-clock columns, whether the evaluations are played in their own process or on the learner.
(With worker processes the batches' interleaving with the updates follows the OS scheduler: runs differ.)"""

import csv
from pathlib import Path

import pytest

from acer_torchrl.cli import run

WALL_CLOCK_COLUMNS = ("wall_time_s",)  # the only metrics.csv columns a clock decides
TINY = ["collector.workers=0", "total_frames=3000", "eval.interval=1000", "eval.episodes=3", "log.progress=false"]


def metrics_rows(run_dir: Path, algo: str, preset: str, *overrides: str) -> list[dict[str, str]]:
    """The rows of a tiny in-process run's ``metrics.csv`` as written (the strings: bit for bit), less
    :data:`WALL_CLOCK_COLUMNS`."""
    run(algo, [f"preset={preset}", *TINY, f"run_dir={run_dir}", *overrides])
    with (run_dir / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for column in WALL_CLOCK_COLUMNS:
            del row[column]
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("algo, preset", [("acer", "cartpole"), ("vracer", "pendulum")])
def test_a_seed_reproduces_a_run_in_one_process_bit_for_bit(tmp_path, algo, preset):
    """The first run's evaluations are played in their process (their results arrive while the learner goes on,
    checkpoints wait for them), the second's on the learner: the same rows, evaluations included; another seed
    gives other rows."""
    first = metrics_rows(tmp_path / "first", algo, preset, "seed=1", "log.checkpoint_interval=1000")
    assert int(first[-1]["updates"]) > 0 and all(row["eval_return_mean"] for row in first)
    assert metrics_rows(tmp_path / "again", algo, preset, "seed=1", "eval.background=false") == first
    assert metrics_rows(tmp_path / "other", algo, preset, "seed=2") != first
