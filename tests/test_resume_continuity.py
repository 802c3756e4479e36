"""A run checkpointed and resumed goes on as the uninterrupted run does: the same collected batches into both give
the same metrics rows and weights. What a resume changes by design is applied to both: the envs restart their
episodes (the replay forgets its open trajectories, ``EpisodeReplay.load``), so only learner-side state can differ.
A resume audit found what the checkpoint left out: the next metrics row's statistics so far and LASER's fresh
windows (each test fails without it)."""

import copy
import shutil

import pytest
import torch

from acer_torchrl.config import load_config
from acer_torchrl.evaluation import InlineEvaluator
from acer_torchrl.trainer import Trainer

TINY = ["collector.workers=0", "collector.frames_per_batch=32", "replay.min_size=64", "replay.batch_size=4",
        "network.hidden=16", "eval.episodes=1", "eval.max_steps=20", "log.progress=false", "eval.background=false",
        "eval.interval=64", "log.checkpoint_interval=100000", "total_frames=480"]
# LASER with atari_gpu's geometry (settings/laser.py): an update's fresh windows come from the last 4 batches
LASER_FOUR_BATCHES = [*TINY, "env.num_envs=8", "collector.frames_per_batch=64", "replay.seq_len=8",
                      "replay.batch_size=160", "laser.online_share=0.2", "total_frames=640"]


def collected(algo, args, run_dir, n):
    trainer = Trainer(load_config(algo, [*args, f"run_dir={run_dir}"]))
    batches = trainer.start()
    try:
        return [next(batches).clone() for _ in range(n)]
    finally:
        trainer.stop_collecting()
        trainer.close()


@pytest.mark.parametrize("algo, args, n, cut", [
    ("acer", TINY, 10, 7),
    ("laser", LASER_FOUR_BATCHES, 8, 4),
    ("reactor", [*TINY, "replay.seq_len=8", "replay.prioritized=true", "reactor.distributional=true"], 10, 7),
    ("vracer", ["preset=pendulum", *TINY, "replay.seq_len=1", "replay.batch_size=8"], 10, 7),
], ids=["acer-metrics-row", "laser-fresh-windows", "reactor-prioritized-distributional", "vracer"])
def test_a_resumed_run_goes_on_as_the_uninterrupted_one(tmp_path, algo, args, n, cut):
    """Checkpointed after batch ``cut``, inside a metrics row's window (rows every 64 env steps, batches of 32 or
    64); LASER's first updates after it mix in 32 fresh windows of the 4 batches before (8 a batch)."""
    data = collected(algo, args, tmp_path / "source", n)
    through = Trainer(load_config(algo, [*args, f"run_dir={tmp_path / 'through'}"]))
    through.start()
    for batch in data[:cut]:
        through.step(batch.clone())
    through.checkpoint()
    through.replay._open.clear()  # what the resume does by design (the envs restart their episodes)
    shutil.copytree(tmp_path / "through", tmp_path / "resumed", symlinks=True)
    resumed = Trainer(load_config(None, [f"resume={tmp_path / 'resumed'}"]))
    resumed.start()
    rng = torch.get_rng_state()
    rows = {}
    for name, trainer in (("through", through), ("resumed", resumed)):
        torch.set_rng_state(rng)
        for batch in data[cut:]:
            trainer.step(batch.clone())
        rows[name] = [{k: v for k, v in r.items() if k != "wall_time_s"} for r in trainer.log.rows]
        trainer.stop_collecting()
    assert len(rows["resumed"]) > cut // 2 and rows["resumed"] == rows["through"]
    assert all(torch.equal(p, q) for p, q in zip(through.params, resumed.params))
    for trainer in (through, resumed):
        trainer.close()


def test_a_resume_at_another_seq_len_drops_the_fresh_windows_cut_at_the_old_one(tmp_path):
    """``replay.seq_len`` is applied on resume; the fresh windows the checkpoint kept were cut at the old length, and
    mixing them into a batch of the new one failed at the first update (tensor sizes 16 and 8)."""
    args = [*TINY, "replay.seq_len=8", "replay.batch_size=8", "laser.online_share=0.5", "total_frames=192"]
    Trainer(load_config("laser", [*args, f"run_dir={tmp_path}"])).train()
    resumed = Trainer(load_config(None, [f"resume={tmp_path}", "replay.seq_len=16", "total_frames=320"]))
    assert len(resumed.online.batches) == 0
    assert resumed.train()["env_steps"] == 320


class HeldEvaluator(InlineEvaluator):
    """Plays nothing until drained: the evaluations asked are still being played at every checkpoint (a GPU learner's
    Atari evaluations, which one process plays slower than the learner asks for them)."""

    blocking = False

    def __init__(self, inline: InlineEvaluator):
        self.policy, self.env, self.max_steps = inline.policy, inline.env, inline.max_steps
        self._done, self.asked = [], []

    def submit(self, tag, seed, weights=None):
        self.asked.append((tag, seed, copy.deepcopy(self.policy.state_dict() if weights is None else weights)))

    def results(self):
        return []

    def unfinished(self):
        return list(self.asked)

    def drain(self):
        for tag, seed, weights in self.asked:
            super().submit(tag, seed, weights)
        self.asked = []
        return super().results()


def test_a_checkpoint_keeps_the_evaluations_in_play_and_the_resumed_run_plays_them(tmp_path, monkeypatch):
    """A checkpoint does not wait for the evaluations still being played (a stop that drained a GPU learner's backlog
    of Atari evaluations ran past its grace and saved nothing): it keeps them with the weights each was asked on, and
    the resumed run asks for them again. Its rows are the uninterrupted run's, though the killed run logged those
    evaluations' rows after the checkpoint (metrics.csv drops them on resume: no row twice)."""
    made = Trainer.make_evaluator
    monkeypatch.setattr(Trainer, "make_evaluator", lambda self: HeldEvaluator(made(self)))
    data = collected("acer", TINY, tmp_path / "source", 10)
    through = Trainer(load_config("acer", [*TINY, f"run_dir={tmp_path / 'through'}", "log.tensorboard=true"]))
    through.start()
    for batch in data[:7]:
        through.step(batch.clone())
    through.checkpoint()
    assert [row[0] for row in through._awaiting] == [64, 128, 192] and through.log.rows == []  # none waited for
    through.wait_for_evaluations()  # the killed run went on and logged them after its checkpoint
    through.replay._open.clear()
    shutil.copytree(tmp_path / "through", tmp_path / "resumed", symlinks=True)
    resumed = Trainer(load_config(None, [f"resume={tmp_path / 'resumed'}"]))
    assert resumed.log.rows == []  # the rows of the evaluations asked again
    resumed.start()
    rng = torch.get_rng_state()
    rows = {}
    for name, trainer in (("through", through), ("resumed", resumed)):
        torch.set_rng_state(rng)
        for batch in data[7:]:
            trainer.step(batch.clone())
        trainer.wait_for_evaluations()
        rows[name] = [{k: v for k, v in r.items() if k != "wall_time_s"} for r in trainer.log.rows]
        trainer.stop_collecting()
        trainer.close()
    assert [r["env_steps"] for r in rows["resumed"]] == [64, 128, 192, 256, 320]
    assert rows["resumed"] == rows["through"]
    # and TensorBoard, which holds the killed run's points of those rows too, shows each once
    assert tensorboard_steps(tmp_path / "resumed", "eval_return_mean") == [64, 128, 192, 256, 320]


def tensorboard_steps(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


def test_a_finished_run_resumed_plays_the_evaluations_its_checkpoint_kept_and_records_them(tmp_path, monkeypatch):
    """A run whose last checkpoint came at its end with evaluations still in play (a stop during the final drain,
    an evaluation process given up): the resumed run trains nothing but plays them, so it logs their rows (to
    TensorBoard too, each once), records the segment that played them in provenance.jsonl and writes the summary."""
    made = Trainer.make_evaluator
    monkeypatch.setattr(Trainer, "make_evaluator", lambda self: HeldEvaluator(made(self)))
    args = [*TINY, "total_frames=224", "log.tensorboard=true"]
    data = collected("acer", args, tmp_path / "source", 7)
    killed = Trainer(load_config("acer", [*args, f"run_dir={tmp_path / 'run'}"]))
    killed.start()
    killed.wait_for_evaluations = lambda: None  # a stop came during the final drain: the checkpoint keeps them
    assert [killed.step(batch.clone()) for batch in data][-1]  # the run's end
    killed.checkpoint()
    kept = [row[0] for row in killed._awaiting]
    assert kept[:3] == [64, 128, 160] and kept[-1] == 224 and killed.log.rows == []
    del killed.wait_for_evaluations
    killed.wait_for_evaluations()  # logged after the checkpoint (to TensorBoard too), then killed
    killed.replay._open.clear()
    shutil.copytree(tmp_path / "run", tmp_path / "resumed", symlinks=True)
    resumed = Trainer(load_config(None, [f"resume={tmp_path / 'resumed'}"]))
    assert list(resumed.start()) == []
    resumed.finish()
    resumed.close()
    assert [r["env_steps"] for r in resumed.log.rows] == kept
    assert tensorboard_steps(tmp_path / "resumed", "eval_return_mean") == kept
    assert len((tmp_path / "resumed" / "provenance.jsonl").read_text().splitlines()) == 2
    assert (tmp_path / "resumed" / "summary.json").is_file()


def test_evaluations_replayed_with_other_eval_settings_after_a_resume_are_named_in_a_note(tmp_path, monkeypatch, capsys):
    """A resume that changes eval.* while its checkpoint kept evaluations asked before: they are played with the new
    settings (their rows record them), and which rows that touches hangs on how far behind the evaluation process
    was, so a note names them; a resume that keeps the settings says nothing."""
    made = Trainer.make_evaluator
    monkeypatch.setattr(Trainer, "make_evaluator", lambda self: HeldEvaluator(made(self)))
    data = collected("acer", TINY, tmp_path / "source", 4)
    killed = Trainer(load_config("acer", [*TINY, f"run_dir={tmp_path / 'run'}"]))
    killed.start()
    for batch in data:
        killed.step(batch.clone())
    killed.checkpoint()
    killed.replay._open.clear()
    for name, change in (("same", []), ("other", ["eval.max_steps=10"])):
        shutil.copytree(tmp_path / "run", tmp_path / name, symlinks=True)
        capsys.readouterr()
        resumed = Trainer(load_config(None, [f"resume={tmp_path / name}", *change]))
        resumed.start()
        resumed.wait_for_evaluations()
        err = capsys.readouterr().err
        note = [line for line in err.splitlines() if "with other eval settings" in line]
        assert note == ([] if name == "same" else [
            "note: the evaluations asked at 64, 128 env steps with other eval settings were still being played at the "
            "checkpoint; they are played again with this resume's eval_episodes=1, eval_max_steps=10, as their rows "
            "record"]), err
        assert [r["eval_max_steps"] for r in resumed.log.rows] == [20 if name == "same" else 10] * 2
        resumed.stop_collecting()
        resumed.close()
    killed.close()
