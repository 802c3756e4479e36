"""The shared pipeline end to end with a loss that joins the registry with one line (as new losses do):
real worker processes, run-directory contract, kill + resume without losing replay or step counts,
corrupt checkpoints and bad input ending with one clear line."""

import contextlib
import copy
import csv
import fcntl
import json
import math
import os
import pty
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from acer_torchrl import settings
from acer_torchrl.agent import Agent
from acer_torchrl.checkpoint import CheckpointError, write_manifest
from acer_torchrl.cli import run
from acer_torchrl.commands import shell_command
from acer_torchrl.config import ConfigError
from acer_torchrl.modules import acting_policy, learning_module, make_torso
from acer_torchrl.objectives.common import policy_distribution
from acer_torchrl.objectives.common import ReplayLoss, masked_mean, sequence_mask
from acer_torchrl.provenance import code_version, machine
from acer_torchrl.replay import EpisodeReplay
from acer_torchrl.settings import Algorithm
from planted import plant_pickle
from process_group import signal_group, wait_for

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class ProbeConfig:
    online_steps: int = 1


class ProbeLoss(ReplayLoss):
    """Reward-weighted log-likelihood on whatever batch the trainer draws: enough to exercise the plumbing."""

    def __init__(self, net, info, online_steps):
        super().__init__()
        self.net, self.info, self.online_steps = net, info, online_steps

    def update_plan(self, rng):
        return [1.0] * self.online_steps + [0.0]

    def forward(self, td):
        out = self.net(td.select(*self.net.in_keys, strict=False).clone())
        log_pi = policy_distribution(self.info.discrete, out).log_prob(td["action"]).unsqueeze(-1)
        loss = -masked_mean(log_pi * td["next", "reward"], sequence_mask(td))
        return TensorDict({"loss_probe": loss, "batch_rows": torch.tensor(float(td.shape[0]))}, [])


def build_probe(cfg, info):
    torso = make_torso(info, cfg.network.hidden, cfg.network.activation,
                       cfg.network.lstm_hidden if cfg.network.lstm else None)
    head = nn.Linear(torso.out_dim, info.num_actions)
    net = learning_module(torso, TensorDictModule(head, ["core"], ["logits"]))
    return Agent(ProbeLoss(net, info, cfg.algo.online_steps), acting_policy(torso, head, info), [torso])


ALGORITHM = Algorithm("probe", ProbeConfig, f"{__name__}.build_probe",
                      {"tiny": {"env.name": "CartPole-v1", "replay.seq_len": 4}}, "tiny")
FAST = ["network.hidden=16", "collector.frames_per_batch=32", "replay.min_size=64", "replay.batch_size=4",
        "eval.episodes=1", "eval.max_steps=50", "log.progress=false"]


@pytest.fixture
def probe_registered(monkeypatch):
    monkeypatch.setitem(settings.REGISTRY, "probe", __name__)  # a new loss joins with one line
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("PYTHONPATH", f"{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


@pytest.mark.integration
@pytest.mark.parametrize("workers, lstm", [(2, False), (0, True)])
def test_end_to_end_run_leaves_the_run_directory_contract(tmp_path, probe_registered, workers, lstm):
    cpu_before = time.process_time()
    summary = run("probe", [f"run_dir={tmp_path}", "total_frames=640", f"collector.workers={workers}",
                            f"network.lstm={str(lstm).lower()}", "network.lstm_hidden=8", "eval.interval=320", *FAST])
    cpu_used = time.process_time() - cpu_before
    for key in ("algorithm", "env", "env_steps", "eval_return_mean", "eval_return_std", "wall_time_s",
                "env_steps_per_s", "collector_dropped_steps"):
        assert key in summary
    assert summary["algorithm"] == "probe" and summary["env"] == "CartPole-v1"
    assert summary["env_steps"] >= 640 and summary["updates"] > 0
    # the learner's CPU seconds (this process's, in the loop) per wall second: some, and no more than this process
    # spent in the whole run (not a share under load, which another process on the cores can push anywhere)
    learner_cpu_s = summary["learner_cpu_per_wall_s"] * summary["wall_time_s"]
    assert 0 < learner_cpu_s <= cpu_used + 0.05, (learner_cpu_s, cpu_used)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    for name in ("config.yaml", "metrics.csv", "learning_curve.png", "checkpoint/state.pt", "provenance.jsonl"):
        assert (tmp_path / name).is_file(), name
    assert (summary["code"], summary["machine"]) == (code_version(), machine())  # the code and machine it ran on
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("env_steps,updates,wall_time_s") and len(rows) >= 3
    steps = [float(r.split(",")[0]) for r in rows[1:]]
    assert steps == sorted(set(steps)) and steps[-1] == summary["env_steps"], "the last evaluation is logged once"
    assert "loss_probe" in rows[0] and "eval_return_mean" in rows[0]


@pytest.mark.integration
@pytest.mark.parametrize("lstm", [False, True])
def test_replay_keeps_behaviour_statistics_but_not_the_policy_activations(tmp_path, probe_registered, lstm):
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer

    trainer = Trainer(load_config("probe", [f"run_dir={tmp_path}", "total_frames=64", "collector.workers=0",
                                            f"network.lstm={str(lstm).lower()}", "network.lstm_hidden=8", *FAST]))
    trainer.train()
    assert trainer.agent.activation_keys == (["embed", "core"] if lstm else ["core"])
    stored = trainer.replay.gather(trainer.replay.alive.nonzero().squeeze(-1))
    assert len(stored) == 64
    assert not {"embed", "core"} & set(stored.keys()), "activations are recomputed by every loss, never stored"
    for key in ("observation", "action", ("behaviour", "logits"), ("behaviour", "log_prob"), ("next", "reward")):
        assert key in stored.keys(True)
    if lstm:
        assert "recurrent_state_h" in stored.keys() and ("next", "recurrent_state_h") in stored.keys(True)


@pytest.mark.integration
@pytest.mark.parametrize("memmap", [False, True], ids=["in-RAM", "memmap"])
def test_killed_run_resumes_with_its_replay_and_step_counts(tmp_path, probe_registered, memmap):
    """SIGKILL a run after its first checkpoint; resume=<run_dir> continues from that checkpoint (with a memory-
    mapped replay too, whose scratch files the killed run left in the run directory)."""
    code = ("import sys; from acer_torchrl import settings, cli; settings.REGISTRY['probe'] = 'test_pipeline'; "
            "sys.exit(cli.main('probe'))")
    args = [sys.executable, "-c", code,
            f"run_dir={tmp_path}", "total_frames=100000", "collector.workers=2", "log.checkpoint_interval=256",
            "eval.interval=100000", f"replay.memmap={str(memmap).lower()}", *FAST]
    proc = subprocess.Popen(args, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=os.environ)
    wait_for((tmp_path / "checkpoint" / "counters.json").exists, proc, 120)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its collector workers, at an arbitrary moment
    proc.wait()

    from acer_torchrl.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(tmp_path)
    saved = json.loads((ckpt / "counters.json").read_text())
    before = EpisodeReplay(50_000)  # the default replay.capacity
    before.load(ckpt / "replay")
    assert saved["env_steps"] >= 256 and len(before) > 0
    # a metrics row logged after that checkpoint, before the kill: the resumed run logs those steps again
    metrics = tmp_path / "metrics.csv"
    rows = list(csv.DictReader(metrics.open())) if metrics.exists() else []
    columns = list(rows[0]) if rows else ["env_steps", "updates", "wall_time_s"]
    with metrics.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows + [{"env_steps": saved["env_steps"] + 64, "updates": 0, "wall_time_s": 0}])

    # resuming rebuilds exactly that replay and those counters, then runs to the new total
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer

    trainer = Trainer(load_config(None, [f"resume={tmp_path}", f"total_frames={saved['env_steps'] + 320}"]))
    assert trainer.counters.env_steps == saved["env_steps"] and trainer.counters.restarts == 1
    assert [r["env_steps"] for r in trainer.log.rows] == [float(r["env_steps"]) for r in rows]
    assert trainer.replay.steps_written == before.steps_written and len(trainer.replay) == len(before)
    slots = before.alive.nonzero().squeeze(-1)
    assert torch.equal(trainer.replay.gather(slots)["observation"], before.gather(slots)["observation"])
    summary = trainer.train()
    assert summary["env_steps"] >= saved["env_steps"] + 320 and summary["restarts"] == 1
    assert summary["updates"] > saved["updates"]
    logged = [float(r["env_steps"]) for r in csv.DictReader(metrics.open())]
    assert logged == sorted(set(logged)) and logged[-1] >= saved["env_steps"] + 320, "one row per logged step"


@pytest.mark.integration
def test_gpu_learners_acting_copy_is_written_in_place(tmp_path, probe_registered):
    """A GPU learner's acting copy (forced here on CPU): after each batch ``sync_acting_policy`` copies the learner's
    weights into the copy's own tensors, the shared memory the collector's workers act with
    (``tests/test_collectors.py`` checks what they act with), and allocates none."""
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer

    trainer = Trainer(load_config("probe", [f"run_dir={tmp_path}", "total_frames=192", "collector.workers=2", *FAST]))
    trainer.acting = copy.deepcopy(trainer.agent.policy)
    tensors = TensorDict.from_module(trainer.acting)
    initial = tensors.data.clone()
    assert trainer.train()["updates"] > 0
    acting, learner = TensorDict.from_module(trainer.acting), TensorDict.from_module(trainer.agent.policy)
    # the same tensors, which the collector moved to shared memory in place (their memory, not the objects, changed)
    assert all(acting.get(key) is t and t.is_shared() for key, t in tensors.items(True, True))
    assert (acting.data == learner.data).all() and not (acting.data == initial).all()


@pytest.mark.integration
def test_a_killed_run_leaves_the_learning_curve_of_its_checkpoint(tmp_path):
    """The curve PNG is written (atomically) with each checkpoint, not only when a run ends: SIGKILL after the first
    checkpoint leaves a whole PNG of the evaluations that checkpoint holds."""
    args = [sys.executable, str(ROOT / "recipes" / "acer.py"), f"run_dir={tmp_path}", "total_frames=100000",
            "collector.workers=0", "eval.interval=64", "log.checkpoint_interval=128", *FAST]
    proc = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    curve = tmp_path / "learning_curve.png"
    try:
        wait_for(curve.exists, proc, 120)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert curve.read_bytes().startswith(b"\x89PNG") and curve.read_bytes().endswith(b"IEND\xaeB`\x82")
    assert not (tmp_path / "summary.json").exists()


def stderr_of(args: list[str], terminal: bool) -> str:
    """What the command ``args`` (exit code 0) wrote to its stderr: a pseudo-terminal (``terminal``) or a pipe."""
    if not terminal:
        proc = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 x 100 (a new one has 0 columns)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    chunks = []
    with contextlib.suppress(OSError):  # EIO once every process of the run closed the terminal
        while chunk := os.read(leader, 4096):
            chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    return b"".join(chunks).decode()


@pytest.mark.integration
@pytest.mark.parametrize("terminal", [False, True], ids=["log-file", "terminal"])
def test_progress_is_a_bar_on_a_terminal_and_a_line_per_evaluation_in_a_log(tmp_path, terminal):
    """``log.progress`` (on by default): a tqdm bar when stderr is a terminal; in a log file (SLURM's, a redirect)
    no bar, whose redraws piled up there as carriage returns (~2 KB/s), but one line per evaluation."""
    args = [sys.executable, str(ROOT / "recipes" / "acer.py"), f"run_dir={tmp_path}", "total_frames=192",
            "collector.workers=0", "eval.interval=64", *[a for a in FAST if not a.startswith("log.progress")]]
    stderr = stderr_of(args, terminal)
    with open(tmp_path / "metrics.csv") as f:
        evaluations = [(int(r["env_steps"]), float(r["eval_return_mean"])) for r in csv.DictReader(f)]
    assert [steps for steps, _ in evaluations] == [64, 128, 160, 192]  # 160: the last three batches (a short run)
    if terminal:
        assert "192/192" in stderr and "step/s]" in stderr and "greedy return" not in stderr, stderr
        return
    assert "\r" not in stderr and len(stderr.splitlines()) == len(evaluations), stderr
    for line, (steps, mean) in zip(stderr.splitlines(), evaluations):
        assert re.fullmatch(rf"{tmp_path.name}: {steps}/192 env steps, greedy return {mean:.1f}, \d+ env steps/s",
                            line), line


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_checkpoints_and_says_how_to_resume_in_one_line(tmp_path, sig):
    """Ctrl-C (SIGINT to the terminal's process group) or SIGTERM to the run's whole group (``kill -- -PGID``):
    a checkpoint of the batch in hand, one line. The collector workers get the signal too and leave it to the
    learner (with SIGTERM they used to die first, and the learner hung waiting for their weight acknowledgement)."""
    args = [sys.executable, str(ROOT / "recipes" / "acer.py"), f"run_dir={tmp_path}", "total_frames=100000",
            "collector.workers=2", "log.checkpoint_interval=64", "eval.interval=100000", *FAST]
    proc = subprocess.Popen(args, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=os.environ)
    wait_for((tmp_path / "checkpoint" / "counters.json").exists, proc, 120)  # training, the handlers in place
    returncode, stderr, _ = signal_group(proc, sig)
    steps = json.loads((tmp_path / "checkpoint" / "counters.json").read_text())["env_steps"]
    assert returncode == 128 + sig and "Traceback" not in stderr, stderr
    resume = shlex.join([sys.executable, str(ROOT / "recipes" / "acer.py"), f"resume={tmp_path}"])  # not "python"
    assert stderr.strip().splitlines()[-1] == f"interrupted at {steps} env steps; continue with: {resume}"
    assert 64 <= steps < 100000 and not (tmp_path / "summary.json").exists()
    # the printed command, typed where the run was started (no recipes/ there), finishes the run
    again = subprocess.run(f"{resume} total_frames={steps}", shell=True, cwd=tmp_path, capture_output=True, text=True,
                           env=os.environ, timeout=120)
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["env_steps"] == steps


def test_a_checkpoint_falls_due_on_its_schedule_with_an_evaluation_in_play(tmp_path, probe_registered):
    """A checkpoint falls due while an evaluation is still being played (one asked at the same step, as every
    ``eval.interval`` that divides ``log.checkpoint_interval`` asks): it is taken on its schedule, keeping that
    evaluation (tests/test_resume_continuity.py), and its row is logged when the evaluation comes back."""
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer

    trainer = Trainer(load_config("probe", [f"run_dir={tmp_path}", "log.checkpoint_interval=1000", *FAST]))
    c = trainer.counters
    c.env_steps, c.next_checkpoint = 999, 1000
    assert not trainer.checkpoint_due()
    trainer._awaiting.append((1000, 0, 0.0, {}, trainer.evaluation_settings()))  # asked at step 1000, being played
    c.env_steps = 1000
    assert trainer.checkpoint_due() and trainer._awaiting
    trainer.log_evaluations([(1000, 42.0, 0.0, 0)])
    assert trainer.log.rows[-1]["env_steps"] == 1000 and trainer.log.rows[-1]["eval_return_mean"] == 42.0


def test_evaluations_falling_behind_the_learner_are_a_note_once(tmp_path, probe_registered, capsys):
    """Four evaluations waiting for the evaluation process, once one came back (not while it starts), are one note
    naming the setting to raise (a GPU learner on Atari asks faster than one process plays the games)."""
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer

    class Playing:  # the background evaluator: asked, nothing comes back
        blocking = False

        def submit(self, tag, seed):
            pass

    trainer = Trainer(load_config("probe", [f"run_dir={tmp_path}", "eval.interval=100", *FAST]))
    trainer.evaluator, c = Playing(), trainer.counters
    for c.env_steps in (100, 200, 300, 400):  # still starting: none came back
        trainer.ask_evaluation({})
    assert "note" not in capsys.readouterr().err
    trainer.log_evaluations([(100, 1.0, 0.0, 0)])
    for c.env_steps in (500, 600, 700):
        trainer.ask_evaluation({})
    err = capsys.readouterr().err
    assert err == ("note: 4 greedy evaluations are waiting for the evaluation process at 500 env steps (it plays them "
                   "slower than the learner asks, one each eval.interval=100 steps): their rows come late, the last ones "
                   "at the end of the run; raise eval.interval\n"), err


@pytest.mark.parametrize("algo, preset", [("vracer", "pendulum"), ("acer", "cartpole")])
def test_nan_behaviour_statistics_end_the_update_with_one_clear_error_before_any_step(tmp_path, algo, preset):
    """A drawn batch whose stored behaviour statistics (the importance weights' denominators) are NaN: the update
    raises one TrainingError naming the non-finite loss terms, once the gradient is computed (V-RACER's written out,
    ACER's by autograd) and before the optimiser moves any parameter."""
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer, TrainingError

    trainer = Trainer(load_config(algo, [f"preset={preset}", "collector.workers=0", "replay.min_size=300",
                                         f"run_dir={tmp_path}/run", "log.progress=false", "eval.background=false"]))
    trainer.fill_replay(400)
    batch = trainer.draw_batch(next(s for s in trainer.loss.update_plan(trainer.rng) if s < 1.0))
    behaviour = batch.get("behaviour")
    for key in behaviour.keys(True, True):
        if behaviour.get(key).is_floating_point():
            behaviour.get(key).fill_(float("nan"))
    before = [p.detach().clone() for p in trainer.params]
    with pytest.raises(TrainingError, match=r"non-finite loss at update 0 \(loss_.*\); lower optim.lr"):
        trainer.update(batch)
    assert all(torch.equal(p, b) for p, b in zip(trainer.params, before))


def test_a_non_finite_priority_ends_the_update_with_one_clear_error_before_the_tree_or_any_step(tmp_path):
    """A prioritized replay's new priorities (the loss's per-window mean |TD error|) with a NaN among finite losses: the
    update raises one TrainingError naming ``priority`` before the optimiser step and before the sum tree takes it
    (a NaN there would skew every later draw: the tree's sums, the draw's search)."""
    from acer_torchrl.config import load_config
    from acer_torchrl.objectives.names import PRIORITY_KEY
    from acer_torchrl.trainer import Trainer, TrainingError

    trainer = Trainer(load_config("reactor", ["preset=cartpole", "replay.prioritized=true", "collector.workers=0",
                                              "replay.min_size=300", f"run_dir={tmp_path}/run", "log.progress=false",
                                              "eval.background=false"]))
    trainer.fill_replay(400)
    batch = trainer.draw_batch(0.0)
    forward_backward = trainer.loss.forward_backward

    def nan_priority(td, params):
        out = forward_backward(td, params)
        out.get(PRIORITY_KEY)[0] = float("nan")
        return out

    trainer.loss.forward_backward = nan_priority
    before = [p.detach().clone() for p in trainer.params]
    tree = trainer.replay.priorities.priority.clone()
    with pytest.raises(TrainingError, match=r"non-finite loss at update 0 \(priority\); lower optim.lr"):
        trainer.update(batch)
    assert all(torch.equal(p, b) for p, b in zip(trainer.params, before))
    assert torch.equal(trainer.replay.priorities.priority, tree)


@pytest.mark.parametrize("max_norm", [0.5, math.inf])
def test_gradients_clipped_at_max_grad_norm_and_the_norm_before_clipping_returned(tmp_path, probe_registered, max_norm):
    from acer_torchrl.config import load_config
    from acer_torchrl.trainer import Trainer

    trainer = Trainer(load_config("probe", [f"run_dir={tmp_path}", f"optim.max_grad_norm={max_norm}", *FAST]))
    g = torch.Generator().manual_seed(0)
    for p in trainer.params:
        p.grad = torch.randn(p.shape, generator=g)
    before = [p.grad.clone() for p in trainer.params]
    norm = torch.cat([b.reshape(-1) for b in before]).norm()
    reference = [torch.nn.Parameter(torch.zeros_like(b)) for b in before]
    for r, b in zip(reference, before):
        r.grad = b.clone()
    reference_norm = torch.nn.utils.clip_grad_norm_(reference, max_norm)
    clipped = trainer.clip_gradients()
    torch.testing.assert_close(clipped, norm)
    torch.testing.assert_close(clipped, reference_norm, rtol=0, atol=0)  # torch's own, to the bit
    factor = min(1.0, max_norm / float(norm))
    for p, b, r in zip(trainer.params, before, reference):
        torch.testing.assert_close(p.grad, b * factor)
        torch.testing.assert_close(p.grad, r.grad, rtol=0, atol=0)
    assert factor < 1.0 or max_norm == math.inf


@pytest.mark.integration
def test_progress_bar_names_the_evaluation_that_follows_its_100_percent(tmp_path, probe_registered, capsys,
                                                                         monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the bar is drawn on a terminal only
    run("probe", [f"run_dir={tmp_path}", "total_frames=64", "collector.workers=0", *FAST, "log.progress=true"])
    bar = capsys.readouterr().err
    assert "greedy evaluation (1 episodes): 100%" in bar, bar


@pytest.mark.integration
def test_the_final_evaluations_note_goes_to_stderr_with_the_other_notes(tmp_path, probe_registered, capsys,
                                                                         monkeypatch):
    """A run whose last step has no evaluation yet says so before the final one: on stderr, where every other note
    goes (stdout holds the results)."""
    from acer_torchrl.trainer import Trainer

    monkeypatch.setattr(Trainer, "_final_window_due", lambda *_: False)  # no evaluation before the run's end
    run("probe", [f"run_dir={tmp_path}", "total_frames=64", "collector.workers=0", *FAST, "log.progress=true",
                  "eval.interval=1000"])
    out, err = capsys.readouterr()
    assert "final greedy evaluation (1 episodes)..." in err and "final greedy evaluation" not in out, (out, err)


@pytest.mark.integration
def test_corrupt_checkpoint_is_one_clear_error(tmp_path, probe_registered):
    run("probe", [f"run_dir={tmp_path}", "total_frames=64", "collector.workers=0", *FAST])
    (tmp_path / "checkpoint" / "state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="is corrupt: state.pt holds 16 bytes") as err:
        run("probe", [f"resume={tmp_path}", "total_frames=128"])
    assert "\n" not in str(err.value)


@pytest.mark.integration
def test_checkpoint_of_another_loss_layout_names_the_keys(tmp_path, probe_registered):
    run("probe", [f"run_dir={tmp_path}", "total_frames=64", "collector.workers=0", *FAST])
    path = tmp_path / "checkpoint" / "state.pt"
    state = torch.load(path, weights_only=True)
    state["loss"]["average_network.weight"] = torch.zeros(1)
    dropped = next(iter(state["loss"]))
    del state["loss"][dropped]
    torch.save(state, path)
    write_manifest(path.parent)  # the checkpoint is whole, only its layout is another
    with pytest.raises(CheckpointError, match=f"does not match .*missing {dropped}, unexpected average_network.weight") as err:
        run("probe", [f"resume={tmp_path}", "total_frames=128"])
    assert "\n" not in str(err.value)


@pytest.mark.integration
@pytest.mark.parametrize("damage, message", [
    (lambda data: data[:100], "observation.bin holds 100 bytes"),
    (lambda data: bytes(len(data)), "observation.bin fails its checksum"),
], ids=["truncated", "zeroed"])
def test_damaged_replay_file_is_one_clear_error(tmp_path, probe_registered, damage, message):
    run("probe", [f"run_dir={tmp_path}", "total_frames=64", "collector.workers=0", *FAST])
    observations = tmp_path / "checkpoint" / "replay" / "steps" / "observation.bin"
    observations.write_bytes(damage(observations.read_bytes()))
    with pytest.raises(CheckpointError, match=message) as err:
        run("probe", [f"resume={tmp_path}", "total_frames=128"])
    assert "\n" not in str(err.value)


@pytest.mark.integration
def test_resume_never_unpickles_a_file_planted_in_the_checkpoint(tmp_path, probe_registered):
    run("probe", [f"run_dir={tmp_path}", "total_frames=64", "collector.workers=0", *FAST])
    marker = tmp_path / "pickle-ran"
    # where TorchRL's buffer format reads one
    plant_pickle(tmp_path / "checkpoint" / "replay" / "buffer" / "prefetch.pkl", marker)
    with pytest.raises(CheckpointError, match="replay/buffer/prefetch.pkl is not part of it") as err:
        run("probe", [f"resume={tmp_path}", "total_frames=128"])
    assert "\n" not in str(err.value) and not marker.exists()


@pytest.mark.integration
def test_resume_refuses_run_defining_changes_and_records_the_others(tmp_path, probe_registered):
    run("probe", [f"run_dir={tmp_path}", "total_frames=64", "collector.workers=0", *FAST])
    config = (tmp_path / "config.yaml").read_text()
    for change, fragment in (
        ("env.name=CartPole-v0", "env.name=CartPole-v0 differs from the run's env.name=CartPole-v1"),
        ("env.name=Acrobot-v1", "env.name=Acrobot-v1 differs"),
        ("network.hidden=32", "network.hidden=[32] differs from the run's network.hidden=[16]"),
        ("probe.online_steps=2", "probe.online_steps=2 differs from the run's probe.online_steps=1"),
        ("loss=acer", f"resume={tmp_path} is a probe run, not acer: continue it with "
                      f"{shell_command('recipes/probe.py', f'resume={tmp_path}')}"),
    ):
        with pytest.raises(ConfigError, match=re.escape(fragment)) as err:
            run("probe", [f"resume={tmp_path}", change])
        assert "\n" not in str(err.value) and (tmp_path / "config.yaml").read_text() == config
        assert str(err.value).startswith(f"resume={tmp_path}")  # the run's directory, not "resume=None"
    run("probe", [f"resume={tmp_path}", "total_frames=128", "eval.episodes=2"])
    (record,) = [json.loads(line) for line in (tmp_path / "resumes.jsonl").read_text().splitlines()]
    assert record["changed"] == {"total_frames": {"from": 64, "to": 128}, "eval.episodes": {"from": 1, "to": 2}}
    assert record["env_steps"] >= 64
    assert "total_frames: 128" in (tmp_path / "config.yaml").read_text()


def test_unknown_env_id_stops_before_any_work(tmp_path, probe_registered):
    with pytest.raises(ConfigError, match="unknown env.name 'CartPol-v1'") as err:
        run("probe", [f"run_dir={tmp_path}", "env.name=CartPol-v1"])
    assert "\n" not in str(err.value) and not (tmp_path / "config.yaml").exists()


@pytest.mark.integration
def test_recipe_reports_bad_env_as_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "recipes" / "acer.py"), "env.name=Nope-v0",
                           f"run_dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "unknown env.name 'Nope-v0'" in proc.stderr


@pytest.mark.parametrize("job", ["SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID"], ids=["slurm", "submit.py --local"])
def test_slurm_preemption_signal_waits_for_the_batch_in_hand(monkeypatch, job):
    """In a submitit job (SLURM's, or a local one, which gets the signal 30 s before its time limit), submitit's SIGUSR2
    handler requeues and exits from wherever it lands (inside a loss's forward it met tensordict's context
    managers and the job failed): the run's guard holds it until the loop calls it after the batch in hand, then
    puts submitit's handler back."""
    from acer_torchrl.processes import RunGuard

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv(job, "1")
    calls = []

    def submitit_handler(signum, _frame):
        calls.append(signum)

    previous = signal.signal(signal.SIGUSR2, submitit_handler)
    try:
        guard = RunGuard()
        with guard.holding_requeue():
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.01)
            assert calls == [] and guard.held_requeue is not None
            guard.held_requeue()  # what the loop does after the batch
            assert calls == [signal.SIGUSR2]
        assert signal.getsignal(signal.SIGUSR2) is submitit_handler
    finally:
        signal.signal(signal.SIGUSR2, previous)


class _SignalledRun:
    """A run's step API for :class:`RunGuard`, its second step receiving ``signum`` (if any); records what the guard
    calls in ``calls``, each call prefixed with ``name`` if given (runs sharing one list)."""

    def __init__(self, signum, batches=4, name="", calls=None):
        self.signum, self.batches, self.name = signum, batches, name
        self.calls = [] if calls is None else calls

    def record(self, call):
        self.calls.append(f"{self.name}: {call}" if self.name else call)

    def finished_summary(self):
        return None

    def start(self):
        return iter(range(self.batches))

    def step(self, batch):
        if batch == 1 and self.signum is not None:
            os.kill(os.getpid(), self.signum)
            time.sleep(0.01)
        self.record(f"step {batch}")
        return False

    def checkpoint(self):
        self.record("checkpoint")

    def checkpoint_due(self):
        return False

    def periodic_checkpoint(self):
        self.record("periodic checkpoint")

    def stop_collecting(self):
        self.record("stop_collecting")

    def finish(self):
        self.record("finish")
        return {}

    def stop_early(self):
        self.record("stop_early")
        return f"{self.name or 'at 2 batches'}; continue with: resume"

    def close(self):
        self.record("close")


def test_run_guard_lets_the_step_in_hand_end_before_a_stop_or_a_requeue(monkeypatch):
    """A stop signal during a step ends the run after that step (saved by ``stop_early``, one line, exit 130); under
    SLURM submitit's requeue handler runs after that step too, with a checkpoint first."""
    from acer_torchrl.processes import Interrupted, RunGuard, StopSignals

    stops = StopSignals().install()
    try:
        fake = _SignalledRun(signal.SIGINT)
        with pytest.raises(Interrupted) as stop:
            RunGuard(stops).train(fake)
    finally:
        stops.restore()
    assert fake.calls == ["step 0", "step 1", "stop_early", "close"]
    assert (str(stop.value), stop.value.exit_code) == ("interrupted at 2 batches; continue with: resume", 130)

    monkeypatch.setenv("SLURM_JOB_ID", "1")
    fake = _SignalledRun(signal.SIGUSR2)

    def submitit_requeue(*_):  # submitit's handler: requeue the job, then exit
        fake.calls.append("requeue")
        sys.exit(-1)

    previous = signal.signal(signal.SIGUSR2, submitit_requeue)
    try:
        with pytest.raises(SystemExit):
            RunGuard().train(fake)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert fake.calls == ["step 0", "step 1", "checkpoint", "requeue", "close"]


def test_a_stop_during_the_final_evaluation_lets_the_run_end_finished():
    """A stop that comes while ``finish()`` plays the final evaluation and writes ``summary.json`` waits for it and
    then ends nothing more: the run is finished and says so (before, it said "interrupted" with a resume command)."""
    from acer_torchrl.processes import RunGuard, StopSignals

    class StoppedInFinish(_SignalledRun):
        def finish(self):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            return super().finish()

    stops = StopSignals().install()
    try:
        fake = StoppedInFinish(None, batches=2)
        assert RunGuard(stops).train(fake) == {}
    finally:
        stops.restore()
    assert fake.calls == ["step 0", "step 1", "stop_collecting", "finish", "close"]


def test_a_stop_the_guard_did_not_defer_saves_nothing():
    """A sweep's rank installs the stop signals itself (its guard has none): a stop lands wherever the rank is, inside
    a batch too, so the guard saves nothing (no ``stop_early``: a checkpoint of half a batch would not agree with
    itself) and the runs' latest periodic checkpoints stay."""
    from acer_torchrl.processes import Interrupted, RunGuard, StopSignals

    stops = StopSignals().install()
    try:
        fake = _SignalledRun(signal.SIGTERM)
        with pytest.raises(Interrupted) as stop:
            RunGuard().train(fake)
    finally:
        stops.restore()
    assert fake.calls == ["step 0", "close"]  # cut inside step 1
    assert stop.value.exit_code == 143


def test_a_requeue_handler_that_returns_is_called_once(monkeypatch):
    """In a SLURM job of several tasks submitit's handler requeues from the first task only and returns in the others:
    those checkpoint once, call it once and go on (before, they checkpointed and called it after every batch)."""
    from acer_torchrl.processes import RunGuard

    monkeypatch.setenv("SLURM_JOB_ID", "1")
    fake = _SignalledRun(signal.SIGUSR2)
    previous = signal.signal(signal.SIGUSR2, lambda *_: fake.calls.append("requeue"))
    try:
        RunGuard().train(fake)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert fake.calls == ["step 0", "step 1", "checkpoint", "requeue", "step 2", "step 3", "stop_collecting", "finish",
                          "close"]


def test_a_stop_signal_that_lands_in_a_weakref_callback_is_not_lost(capfd):
    """Python drops an exception raised in a weakref callback (only a traceback on stderr): a stop signal handled
    there must still stop the learner, at the next batch, and print nothing. Before, the learner went on, and a
    sweep's rank told to stop ran on (``test_shared_replay``'s killed-worker test, now and then)."""
    import weakref

    from acer_torchrl.processes import Interrupted, StopSignals

    class Thing:
        pass

    stops = StopSignals().install()
    try:
        thing = Thing()
        ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGTERM))  # the handler runs inside the callback
        del thing
        assert ref() is None and stops.signum == signal.SIGTERM
        with pytest.raises(Interrupted) as stop:
            with stops.deferred():
                pytest.fail("a batch was learned from after the stop")
    finally:
        stops.restore()
    assert stop.value.exit_code == 143
    assert "Traceback" not in capfd.readouterr().err


def test_runs_in_turn_take_a_batch_each_and_all_stop_after_the_batch_in_hand():
    """A shared-replay sweep in one process: runs take a batch each in turn; one that is done leaves the round to the
    others; a stop during one run's step ends every run after that step, each saved by its ``stop_early``."""
    from acer_torchrl.processes import Interrupted, RunGuard, StopSignals

    log = []
    summaries = RunGuard().train_in_turn([_SignalledRun(None, 1, "a", log), _SignalledRun(None, 2, "c", log)])
    assert summaries == [{}, {}]
    assert log == ["a: step 0", "c: step 0", "a: stop_collecting", "c: step 1", "c: stop_collecting",
                   "a: finish", "c: finish", "a: close", "c: close"]

    log = []
    stops = StopSignals().install()
    try:
        with pytest.raises(Interrupted) as stop:
            RunGuard(stops).train_in_turn([_SignalledRun(None, 4, "a", log), _SignalledRun(signal.SIGTERM, 4, "b", log)])
    finally:
        stops.restore()
    assert log == ["a: step 0", "b: step 0", "a: step 1", "b: step 1", "a: stop_early", "b: stop_early",
                   "a: close", "b: close"]
    assert (str(stop.value), stop.value.exit_code) == ("interrupted a; continue with: resume; b; continue with: resume", 143)


@pytest.mark.integration
def test_resuming_a_finished_run_changes_nothing_and_says_how_to_go_on(tmp_path, probe_registered, capsys):
    from acer_torchrl.cli import main

    run("probe", [f"run_dir={tmp_path}", "total_frames=64", "collector.workers=0", *FAST])
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file() and p.name != "run.lock"}
    assert main("probe", [f"resume={tmp_path}", "log.tensorboard=true"]) == 0  # a logger would open an event file
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == (f"{tmp_path} already finished at 64 env steps (total_frames=64); nothing was changed. To train it "
                       f"further: {shell_command('recipes/probe.py', f'resume={tmp_path}')} total_frames=<more than 64>")
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file() and p.name != "run.lock"} == files
    branch = tmp_path.with_name(tmp_path.name + "-copy")  # a copy, the documented way to branch a run: named itself
    shutil.copytree(tmp_path, branch, ignore=shutil.ignore_patterns("run.lock"))
    assert main("probe", [f"resume={branch}"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"{branch} already finished at 64 env steps")


def test_a_dead_helper_ends_the_runs_saved_with_one_line_naming_it(capsys):
    """A dead collector worker (``HelperDied`` from the run's batches, as ``collectors.py`` raises it): every run is
    saved by its ``stop_early``, and the command line ends with one line (what died, where each run stopped, how to
    continue) and exit code 3."""
    from acer_torchrl.cli import with_stop_signals
    from acer_torchrl.processes import HelperDied, RunGuard, died

    class DyingRun(_SignalledRun):
        def start(self):
            yield 0
            raise HelperDied(died("collector worker 1", 4242, -signal.SIGKILL))

    log = []
    runs = [_SignalledRun(None, 4, "a", log), DyingRun(None, 4, "b", log)]
    assert with_stop_signals(lambda _stops: RunGuard().train_in_turn(runs)) == 3
    assert log == ["a: step 0", "b: step 0", "a: step 1", "a: stop_early", "b: stop_early", "a: close", "b: close"]
    assert capsys.readouterr().err == ("collector worker 1 (pid 4242) died (killed by SIGKILL); stopped a; continue "
                                       "with: resume; b; continue with: resume\n")
