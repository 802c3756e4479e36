"""Real jobs on a real SLURM cluster through submitit (`bash slurm/local_cluster.sh start` gives one).

Without a reachable cluster the tests marked ``slurm`` skip, saying how to start one; under ``CI=true``
they fail instead. The unmarked tests at the end check ``slurm/submit.py``'s parsing without a cluster.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import submitit
from submitit.core.utils import FailedJobError, JobPaths

from acer_torchrl.cluster import RecipeJob, job_rank_info
from acer_torchrl.commands import shell_command

REPO = Path(__file__).resolve().parents[1]
SUBMIT = REPO / "slurm" / "submit.py"
RECIPE = "laser"
# CartPole, one process, small batches: a few seconds of training once torch is imported.
TINY = [
    "preset=cartpole",
    "collector.workers=0",
    "collector.frames_per_batch=32",
    "replay.min_size=64",
    "eval.episodes=1",
    "eval.interval=1000000",
    "log.progress=false",
    "device=cpu",
]
JOB_WAIT_S = 240
ENDED_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE")
ENDED_FOR_S = 10.0  # an ended state must last this long: requeues pass through CANCELLED

slurm = pytest.mark.slurm
uses_cluster = pytest.mark.usefixtures("slurm_cluster")


def executor(tmp_path: Path, **params) -> submitit.AutoExecutor:
    """A SLURM executor running jobs with this interpreter (the venv's) and logs under ``tmp_path``."""
    ex = submitit.AutoExecutor(folder=tmp_path / "logs" / "%j", cluster="slurm")
    # timeout_min >= 50: an interruption counts as a preemption, not as one of max_num_timeout timeouts
    ex.update_parameters(**{"timeout_min": 60, "cpus_per_task": 1, **params})
    return ex


def wait_until(condition, what: str, job=None, timeout_s: float = JOB_WAIT_S):
    """Poll ``condition()`` until it returns a truthy value; fail with the job's stderr tail otherwise."""
    deadline = time.monotonic() + timeout_s
    ended_since = None
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        state = job_state(job.job_id) if job is not None else "RUNNING"
        if state.startswith(ENDED_STATES):
            ended_since = ended_since or time.monotonic()
            if time.monotonic() - ended_since > ENDED_FOR_S:
                pytest.fail(f"job {job.job_id} ended while waiting for {what}: {state}\n{job.stderr()}")
        else:
            ended_since = None
        time.sleep(0.3)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")


def job_state(job_id: str) -> str:
    """The job's state from ``sacct``, asked afresh each time.

    Not ``job.done()``: sacct briefly shows a requeued job as ended (e.g. "CANCELLED by 0"), and submitit's
    watcher never asks again about a job it once saw ended.
    """
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id], capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    return lines[-1].strip() if lines else "UNKNOWN"


def job_nodes(job_id: str) -> str:
    """The nodes SLURM ran the job on, as ``sacct`` lists them (e.g. ``acer-node[1-2]``)."""
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "NodeList", "-j", job_id], capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1].strip()


def expanded_hostnames(nodelist: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.fixture
def two_nodes(slurm_cluster) -> None:
    """A cluster of two nodes or more (`bash slurm/local_cluster.sh start --nodes 2`, as CI starts it); skip
    with that hint where it has one, fail under CI=true."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=30)
    if len(set(out.stdout.split())) >= 2:
        return
    message = "the SLURM cluster has one node; start two with `bash slurm/local_cluster.sh start --nodes 2`"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {message}", pytrace=False)
    pytest.skip(message)


def read_counters(run_dir: Path) -> dict | None:
    """The latest checkpoint's counters (None while there is none, or while it is being swapped in)."""
    for name in ("checkpoint", "checkpoint.old"):
        try:
            return json.loads((run_dir / name / "counters.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue
    return None


def snapshot_checkpoint(run_dir: Path, dest: Path) -> dict:
    """Copy the latest complete checkpoint to ``dest``, retrying while the trainer swaps one in: a copy taken across
    a swap mixes the files of two checkpoints (a CI run's did), which their manifest finds."""
    from acer_torchrl.checkpoint import CheckpointError, verify_manifest

    def copy() -> dict | None:
        shutil.rmtree(dest, ignore_errors=True)
        try:
            shutil.copytree(run_dir / "checkpoint", dest)
            verify_manifest(dest)
            return json.loads((dest / "counters.json").read_text())
        except (FileNotFoundError, shutil.Error, json.JSONDecodeError, CheckpointError):
            return None

    return wait_until(copy, f"a checkpoint to copy in {run_dir}")


def replay_column(checkpoint_dir: Path, key: str, capacity: int):
    from acer_torchrl.replay import EpisodeReplay

    replay = EpisodeReplay(capacity)
    replay.load(checkpoint_dir / "replay")
    return replay.column(key, alive_only=False)


@slurm
@uses_cluster
def test_short_run_returns_its_summary(tmp_path):
    run_dir = tmp_path / "run"
    job = executor(tmp_path).submit(RecipeJob(), RECIPE, TINY + ["total_frames=128", f"run_dir={run_dir}"])
    summary = job.result()
    assert summary["env_steps"] >= 128 and summary["restarts"] == 0
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    wait_until(lambda: job.get_info().get("State") == "COMPLETED", "sacct to show COMPLETED", timeout_s=30)


@slurm
@uses_cluster
def test_two_point_sweep_and_table(tmp_path):
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, str(SUBMIT), RECIPE, *TINY, "total_frames=96", f"run_dir={sweep_dir}"]
    out = subprocess.run(
        cmd + ["--sweep", "seed=0,1", "--time", "60", "--wait"], capture_output=True, text=True, timeout=JOB_WAIT_S
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" done: env_steps=") == 2, out.stdout
    for seed in (0, 1):
        summary = json.loads((sweep_dir / f"seed={seed}" / "summary.json").read_text())
        assert summary["seed"] == seed and summary["env_steps"] >= 96
    table = subprocess.run(
        [sys.executable, str(SUBMIT), "tabulate", str(sweep_dir)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert table[0].split() == ["point", "env_steps", "eval_return_mean", "wall_time_s"]
    assert [row.split()[0] for row in table[1:]] == ["seed=0", "seed=1"]


@slurm
@uses_cluster
def test_two_task_job_sees_ranks_0_and_1(tmp_path):
    job = executor(tmp_path, tasks_per_node=2).submit(job_rank_info)
    results = job.results()
    assert sorted(r[0] for r in results) == [0, 1]
    assert {r[1:] for r in results} == {results[0][1:]}  # same world size, master address and port
    assert results[0][1] == 2 and 20000 <= results[0][3] <= 60000


@slurm
@uses_cluster
def test_interrupted_run_resumes_from_its_checkpoint(tmp_path):
    """External ``scontrol requeue`` then submitit's preemption signal, with collector worker processes:
    the run ends with every step and with the replay it had at the checkpoints it resumed from."""
    run_dir, total, capacity = tmp_path / "run", 20000, 20480
    # two collector worker processes: they must survive the signals SLURM and submitit send to the job
    overrides = TINY + ["collector.workers=2", f"total_frames={total}", f"replay.capacity={capacity}",
                        "log.checkpoint_interval=256", f"run_dir={run_dir}"]
    job = executor(tmp_path, cpus_per_task=2).submit(RecipeJob(), RECIPE, overrides)

    wait_until(lambda: (read_counters(run_dir) or {}).get("env_steps", 0) >= 64, "a first checkpoint", job)
    before_requeue = snapshot_checkpoint(run_dir, tmp_path / "ckpt0")
    subprocess.run(["scontrol", "requeue", job.job_id], check=True)
    wait_until(lambda: (read_counters(run_dir) or {}).get("restarts") == 1, "a checkpoint after the requeue", job)
    before_signal = snapshot_checkpoint(run_dir, tmp_path / "ckpt1")
    assert before_signal["env_steps"] < total, "the run ended before it could be interrupted; raise total"
    job._interrupt()  # submitit's preemption: SIGTERM then USR2 -> RecipeJob.checkpoint -> requeue

    wait_until(job.paths.result_pickle.exists, "the requeued job's result", job)  # see job_state
    summary = job.result()
    assert summary["restarts"] == 2
    assert summary["env_steps"] >= total and summary["env_steps"] - total < 32  # one batch of slack
    final = run_dir / "checkpoint"
    for snap, counters in ((tmp_path / "ckpt0", before_requeue), (tmp_path / "ckpt1", before_signal)):
        for key in ("observation", "action"):
            kept = replay_column(snap, key, capacity)
            assert kept.shape[0] == counters["env_steps"]
            assert (replay_column(final, key, capacity)[: kept.shape[0]] == kept).all()
    assert replay_column(final, "observation", capacity).shape[0] == summary["env_steps"]


def sweep_job_resumes_after_requeue(tmp_path: Path, nodes: int) -> None:
    """``submit.py laser_sweep --nodes N``: one job, one task per agent (rank 0 serves the replay, only it
    reports); after an external requeue every agent resumes from its checkpoint, agent 0's bringing the
    replay back. With two nodes the agents run one a node and reach rank 0's replay over the network."""
    # long enough that the requeue lands mid-run: at 2 048 steps a sweep could finish first (~4 s), and a finished
    # agent resumed changes nothing (no restart recorded)
    sweep_dir, total = tmp_path / "sweep", 16384
    overrides = [o for o in TINY if not o.startswith("collector.frames_per_batch")]
    cmd = [sys.executable, str(SUBMIT), "laser_sweep", "agents=2", *overrides, "collector.frames_per_batch=64",
           f"total_frames={total}", "log.checkpoint_interval=128", f"run_dir={sweep_dir}", "--time", "60",
           "--nodes", str(nodes)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    job_id = out.split()[1]
    job = submitit.SlurmJob(folder=sweep_dir / "submitit" / "%j", job_id=job_id, tasks=(0, 1))

    agents = [sweep_dir / "agent0", sweep_dir / "agent1"]
    wait_until(lambda: all((read_counters(a) or {}).get("env_steps", 0) >= 128 for a in agents), "both agents' checkpoints", job)
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    assert all((read_counters(a) or {}).get("env_steps", 0) < total for a in agents), "ended before the requeue; raise total"
    wait_until(lambda: all((read_counters(a) or {}).get("restarts") == 1 for a in agents), "checkpoints after the requeue", job)
    pickles = [JobPaths(job.paths.folder, job_id, task_id=rank).result_pickle for rank in (0, 1)]
    wait_until(lambda: all(p.exists() for p in pickles), "both tasks' results", job)  # not job.done(): see job_state

    results = job.results()
    assert results[1] is None, "only rank 0 reports the sweep"
    summary = results[0]
    assert [a["env_steps"] for a in summary["agents"]] == [total, total]
    assert summary["shared_replay"]["stored_steps_by_agent"][0] > 128 and summary["shared_replay"]["stored_steps_by_agent"][1] > 128
    # (cross-agent sampling and the checkpointed sample counts are tested in test_shared_replay.py)
    assert json.loads((sweep_dir / "summary.json").read_text())["env_steps_total"] == 2 * total
    assert load_submit().wait_and_report([job], [{"name": "sweep"}]) == 0  # what --wait prints
    assert len(expanded_hostnames(job_nodes(job_id))) == nodes


@slurm
@uses_cluster
def test_shared_replay_sweep_job_resumes_after_requeue(tmp_path):
    sweep_job_resumes_after_requeue(tmp_path, nodes=1)


@slurm
@pytest.mark.usefixtures("two_nodes")
def test_shared_replay_sweep_across_two_nodes_resumes_after_requeue(tmp_path):
    sweep_job_resumes_after_requeue(tmp_path, nodes=2)


@slurm
@pytest.mark.usefixtures("two_nodes")
def test_a_run_collects_on_both_nodes_of_a_two_node_job_and_resumes_after_requeue_and_preemption(tmp_path):
    """``submit.py <recipe> --nodes 2`` with ``collector.workers=1``: two tasks a node, the learner (rank 0)
    and collector rank 1 on the first node, collector ranks 2 and 3 on the second, sending their batches to
    the learner over torch.distributed; after an external requeue all four tasks restart, the learner from
    its checkpoint, then again after submitit's preemption signal (which rank 0, the learner, must still
    handle), and the replay holds trajectories of all three collector ranks."""
    from acer_torchrl.collectors import REMOTE_TRAJ_STRIDE

    run_dir, total, capacity = tmp_path / "run", 16384, 20480
    overrides = [o for o in TINY if not o.startswith("collector.workers")]
    cmd = [sys.executable, str(SUBMIT), RECIPE, *overrides, "collector.workers=1", f"total_frames={total}",
           f"replay.capacity={capacity}", "log.checkpoint_interval=256", f"run_dir={run_dir}", "--time", "60",
           "--nodes", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    job_id = next(line.split()[1] for line in out.splitlines() if line.startswith("job "))
    job = submitit.SlurmJob(folder=run_dir / "submitit" / "%j", job_id=job_id, tasks=(0, 1, 2, 3))

    wait_until(lambda: (read_counters(run_dir) or {}).get("env_steps", 0) >= 256, "a first checkpoint", job)
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    wait_until(lambda: (read_counters(run_dir) or {}).get("restarts") == 1, "a checkpoint after the requeue", job)
    assert read_counters(run_dir)["env_steps"] < total, "the run ended before it could be interrupted; raise total"
    job._interrupt()  # submitit's preemption: SIGTERM then USR2 -> RecipeJob.checkpoint on rank 0 -> requeue
    pickles = [JobPaths(job.paths.folder, job_id, task_id=rank).result_pickle for rank in range(4)]
    wait_until(lambda: all(p.exists() for p in pickles), "the requeued tasks' results", job)  # see job_state
    wait_until(lambda: job_state(job_id) == "COMPLETED", "sacct to show COMPLETED", timeout_s=60)  # no task failed

    summary = job.results()[0]
    assert summary["restarts"] == 2 and total <= summary["env_steps"] < total + 3 * 32  # a batch in flight a rank
    traj_ids = replay_column(run_dir / "checkpoint", ("collector", "traj_ids"), capacity)
    assert set((traj_ids // REMOTE_TRAJ_STRIDE).tolist()) == {1, 2, 3}
    logs = {rank: JobPaths(run_dir / "submitit" / "%j", job_id, task_id=rank).stdout.read_text() for rank in range(4)}
    first, second = expanded_hostnames(job_nodes(job_id))
    assert [f"hostname={first}" in logs[r] for r in range(4)] == [True, True, False, False], logs
    assert all(f"hostname={second}" in logs[r] for r in (2, 3)), logs


@slurm
@uses_cluster
def test_bad_override_surfaces_as_failed_job(tmp_path, capsys):
    job = executor(tmp_path).submit(RecipeJob(), RECIPE, ["optim.lrr=1", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(FailedJobError, match="optim.lrr"):
        job.result()
    # slurm/submit.py --wait reports it as one line naming the key
    assert load_submit().wait_and_report([job], [{"name": "bad"}]) == 1
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "FAILED: acer_torchrl.validation.ConfigError:" in line and "optim.lrr" in line


# ---------------------------------------------------------------- without a cluster
def test_checkpoint_requeues_with_resume_once_a_checkpoint_exists(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    overrides = ["seed=1", f"run_dir={run_dir}", "resume=/elsewhere"]
    job = RecipeJob()
    assert job.checkpoint(RECIPE, overrides).args == (RECIPE, overrides)  # nothing to resume yet
    (run_dir / "checkpoint").mkdir(parents=True)
    (run_dir / "checkpoint" / "counters.json").write_text("{}")
    assert job.checkpoint(RECIPE, overrides).args == (RECIPE, ["seed=1", f"run_dir={run_dir}", f"resume={run_dir}"])
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    with pytest.raises(ValueError, match="run_dir=<path> fixed before submission"):
        job(RECIPE, ["seed=1"])


def load_submit():
    spec = importlib.util.spec_from_file_location("acer_submit", SUBMIT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweep_is_the_cross_product():
    submit = load_submit()
    points = submit.parse_sweep("optim.lr=1e-4,3e-4 seed=0,1,2 network.hidden=[64,64]")
    assert len(points) == 6 and points[0] == {"optim.lr": "1e-4", "seed": "0", "network.hidden": "[64,64]"}
    for bad in ("seed", "seed=0, seed=1", "seed=0 seed=1", ""):
        with pytest.raises(submit.SubmitError):
            submit.parse_sweep(bad)


def test_each_sweep_point_is_checked_against_its_own_total_frames(tmp_path):
    """``resume=`` of a sweep over ``total_frames``: a point finished at its own length is refused even where the
    first point still has steps to train (before, every point was checked against the first point's length)."""
    from types import SimpleNamespace

    submit = load_submit()
    runs = []
    for name in ("long", "short"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"env_steps": 2048, "run_dir": str(tmp_path / name)}))
        runs.append({"run_dir": str(tmp_path / name)})
    configs = [SimpleNamespace(resume=str(tmp_path), overwrite=False, total_frames=frames) for frames in (4096, 2048)]
    with pytest.raises(submit.SubmitError, match=r"short already finished at 2048 env steps \(total_frames=2048\)"):
        submit.check_run_dirs(runs, configs)
    submit.check_run_dirs(runs[:1], configs[:1])


@pytest.mark.integration
def test_submit_rejects_user_mistakes_in_one_line(tmp_path):
    from acer_torchrl.config import dump_yaml, load_config

    done = tmp_path / "old" / "done"  # a finished run (not a point of tmp_path, the tabulate case's "sweep")
    done.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps({"env_steps": 2048, "run_dir": str(done)}))
    dump_yaml(load_config(RECIPE, [*TINY, "total_frames=2000"]), done / "config.yaml")
    for args, message in (
        # the checks a local run makes of its run_dir, before the job waits in the queue
        ([RECIPE, f"run_dir={done}"], f"run_dir={done} already holds a run"),
        ([RECIPE, f"resume={done}", "total_frames=2048"], f"resume={done} already finished at 2048 env steps "
                                                           "(total_frames=2048): nothing to submit"),
        ([RECIPE, f"run_dir={tmp_path / ('r' * 300)}"], "a part of that path is 300 bytes long"),
        ([RECIPE, f"run_dir={tmp_path / 'f'}", "--sweep", "seed=0,1,1"], "gives the point seed=1 more than once"),
        ([RECIPE, "optim.lrr=1", f"run_dir={tmp_path / 'a'}", "--local"], "optim.lrr"),
        ([RECIPE, "seed=1", f"run_dir={tmp_path / 'b'}", "--sweep", "seed=2,3"], "both as an override"),
        ([RECIPE, "seed", "--local"], "not key=value"),
        (["tabulate", str(tmp_path)], "not a sweep directory"),
        ([RECIPE, "seed=1", "--nodes", "2", f"run_dir={tmp_path / 'd'}", "--local"], "--nodes 2 needs SLURM"),
        ([RECIPE, f"run_dir={tmp_path / 'e'}", "--nodes", "2", "--sweep", "collector.workers=1,2"], "one collector.workers"),
        (["laser_sweep", "agents=3", "--nodes", "2", f"run_dir={tmp_path / 'c'}"], "do not spread evenly"),
        ([RECIPE, "seed=1", "--nodes", "0"], "--nodes must be >= 1"),
        # argparse's own errors: one line too (before, its usage block first)
        (["acerr", "seed=1"], "argument recipe: invalid choice: 'acerr'"),
        ([RECIPE, "seed=1", "--cpus", "two"], "argument --cpus: invalid int value: 'two'"),
    ):
        out = run_submit_without_sbatch(args)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and message in out.stderr, out.stderr


def run_submit_without_sbatch(args: list[str], bin_dir: Path | None = None) -> subprocess.CompletedProcess:
    """``slurm/submit.py`` as on a machine with no SLURM installed (``PATH`` holds only the interpreter's folder, and
    ``bin_dir`` when given)."""
    env = {**os.environ, "PATH": os.pathsep.join(str(d) for d in (bin_dir, Path(sys.executable).parent) if d)}
    return subprocess.run([sys.executable, str(SUBMIT), *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.integration
def test_a_submission_the_scheduler_refuses_is_one_line(tmp_path):
    sbatch = tmp_path / "bin" / "sbatch"  # answers as SLURM's does to --partition nope
    sbatch.parent.mkdir()
    sbatch.write_text("#!/bin/sh\necho 'sbatch: error: invalid partition specified: nope' >&2\n"
                      "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\nexit 1\n")
    (sbatch.parent / "srun").write_text("#!/bin/sh\n")  # submitit looks for it
    for tool in sbatch.parent.iterdir():
        tool.chmod(0o755)
    out = run_submit_without_sbatch([RECIPE, *TINY, f"run_dir={tmp_path / 'run'}", "--partition", "nope"], sbatch.parent)
    assert out.returncode == 2 and out.stderr == ("error: the scheduler refused the job: sbatch: error: Batch job "
                                                  "submission failed: Invalid partition name specified\n"), out.stderr


@pytest.mark.integration
def test_ctrl_c_on_a_local_job_checkpoints_it_and_ends_with_one_line(tmp_path):
    """``--local``: Ctrl-C reaches submit.py, submitit's job controller and the job's task (one process group); the
    task checkpoints, the controller leaves it to, and submit.py says where it stopped, exit code 130."""
    from process_group import signal_group, wait_for

    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(SUBMIT), RECIPE, *TINY, "total_frames=1000000", "log.checkpoint_interval=64",
                             f"run_dir={run_dir}", "--local"],
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: (run_dir / "checkpoint" / "counters.json").exists(), proc, 180)
    returncode, output, _ = signal_group(proc, signal.SIGINT)
    steps = json.loads((run_dir / "checkpoint" / "counters.json").read_text())["env_steps"]
    assert returncode == 130 and "Traceback" not in output, output
    resume = shell_command(f"recipes/{RECIPE}.py", f"resume={run_dir}")  # the job's interpreter: this one
    assert output.strip().splitlines()[-1].endswith(f"({run_dir.name}) interrupted at {steps} env steps; continue with: "
                                                    f"{resume}"), output
    (job_log,) = (run_dir / "submitit").glob("*/*_log.err")
    assert "Traceback" not in job_log.read_text() and "leaked" not in job_log.read_text()
    assert [p.name for p in (run_dir / "submitit").iterdir()] == [job_log.parent.name]  # no empty "%j" of submitit's


class Submitted(Exception):
    """A submission reached the executor: every check before it passed."""


@pytest.fixture
def unsubmitted(monkeypatch):
    """submit.py with an executor that raises :class:`Submitted` instead of submitting; (the module, the class)."""
    submit = load_submit()

    def submitted(args, folder):
        raise Submitted

    monkeypatch.setattr(submit, "make_executor", submitted)
    return submit, Submitted


def test_the_docstring_examples_pass_every_check_before_submission(tmp_path, monkeypatch, unsubmitted):
    submit, _ = unsubmitted
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    examples = [shlex.split(line, comments=True)[2:] for line in submit.__doc__.splitlines()
                if line.strip().startswith("python slurm/submit.py") and " tabulate " not in line]
    assert len(examples) == 5
    for argv in examples:
        with pytest.raises(Submitted):
            submit.main(argv)


def test_a_swept_key_with_no_effect_is_said_at_submission(tmp_path, unsubmitted, capsys):
    """A point where a swept key has no effect (LASER's kl_samples without its trust region) trains the same as
    its neighbour: the run's ``note:`` line is printed by submit.py, once, not only into each job's log."""
    submit, Submitted = unsubmitted
    with pytest.raises(Submitted):
        submit.main(["laser", "preset=cartpole", "laser.trust_region=false", f"run_dir={tmp_path / 'sweep'}",
                     "--sweep", "laser.kl_samples=1,4", "--local"])
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    assert notes == ["note: laser.kl_samples=1 has no effect with laser.trust_region=false",
                     "note: laser.kl_samples=4 has no effect with laser.trust_region=false"]


def test_a_sweep_into_another_sweeps_directory_is_refused(tmp_path, unsubmitted, capsys):
    """``--sweep`` into a directory whose ``points.json`` lists other points: refused in one line (it would replace
    the index, and the table would show the new points alone); the same sweep again reaches the executor."""
    submit, Submitted = unsubmitted
    sweep_dir = tmp_path / "sweep"
    argv = ["acer", "preset=cartpole", f"run_dir={sweep_dir}", "--sweep", "seed=0,1", "--local"]
    with pytest.raises(Submitted):
        submit.main(argv)
    points = submit.plan_points(argv[1:3], "seed=0,1")
    (sweep_dir / submit.POINTS_FILE).write_text(json.dumps({"runs": submit.plan_runs(sweep_dir.resolve(), points, True)}))
    with pytest.raises(Submitted):
        submit.main(argv)
    assert submit.main([*argv[:-2], "seed=5", "--local"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: run_dir={sweep_dir.resolve()} holds another sweep (points.json: seed=0, seed=1); give another "
        "run_dir= for this one")


@pytest.mark.integration
@pytest.mark.parametrize("tools, missing", [((), "sbatch and srun"), (("sbatch",), "srun")], ids=["none", "no-srun"])
def test_submit_without_slurm_says_so_in_one_line_after_checking_the_arguments(tmp_path, tools, missing):
    """No SLURM, or part of it (sbatch without the srun submitit detects a cluster by: its RuntimeError traceback)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    out = run_submit_without_sbatch([RECIPE, "preset=cartpole", f"run_dir={tmp_path / 'run'}"], bin_dir)
    assert out.returncode == 2 and out.stderr == f"error: no SLURM here ({missing} not found): use --local, or start a " \
                                                 "test cluster with `bash slurm/local_cluster.sh start`\n", out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("index", ["points.json", "sweep.json"], ids=["points.json", "sweep.json of older versions"])
def test_tabulate_lists_points_with_and_without_summary(tmp_path, index):
    submit = load_submit()
    runs = []
    finished = {"env_steps": 100, "eval_return_mean": 9.5, "wall_time_s": 3.25, "run_dir": "."}
    for name, summary in (("seed=0", json.dumps(finished)), ("seed=1", None), ("seed=2", json.dumps(finished)[:30])):
        (tmp_path / name).mkdir()
        if summary:
            (tmp_path / name / "summary.json").write_text(summary)
        runs.append({"run_dir": str(tmp_path / name)})
    (tmp_path / index).write_text(json.dumps({"runs": runs}))
    rows = [row.split() for row in submit.tabulate(tmp_path).splitlines()]
    assert rows[1:] == [["seed=0", "100", "9.50", "3.25"], ["seed=1", "-", "-", "-"], ["seed=2", "-", "-", "-"]]
    # a copy of the sweep (to branch it) reads its own points, not those of the directory it was made in
    copy = tmp_path.with_name(tmp_path.name + "-copy")
    shutil.copytree(tmp_path, copy)
    (copy / "seed=0" / "summary.json").write_text(json.dumps({**finished, "env_steps": 200}))
    assert [row.split()[:2] for row in submit.tabulate(copy).splitlines()][1] == ["seed=0", "200"]
    (tmp_path / index).write_text('{"runs": [')  # damaged
    if index == "points.json":
        with pytest.raises(submit.SubmitError, match=r"points.json: not a readable list of the sweep's runs"):
            submit.tabulate(tmp_path)


def test_a_point_of_a_submitted_sweep_resumes_an_agent_of_a_shared_replay_sweep_is_refused(tmp_path):
    """A requeued point of ``submit.py --sweep`` resumes with ``resume=<sweep dir>/<point>`` (the sweep's index,
    ``points.json``, or the ``sweep.json`` that older versions wrote, lists its runs); an agent of a shared-replay
    sweep resumed alone is refused, its sweep named."""
    from acer_torchrl.config import ConfigError
    from acer_torchrl.rundir import refuse_sweep_resume
    from acer_torchrl.shared_replay import SweepConfig
    from acer_torchrl.shared_replay.sweep import record_sweep_start

    for index in ("points.json", "sweep.json"):
        submitted = tmp_path / index.replace(".", "-")
        (submitted / "seed=0").mkdir(parents=True)
        (submitted / index).write_text(json.dumps({"recipe": "acer", "runs": [{"run_dir": str(submitted / "seed=0")}]}))
        refuse_sweep_resume(str(submitted / "seed=0"))
    shared = tmp_path / "shared"
    shared.mkdir()
    record_sweep_start(SweepConfig(agents=2), shared, ["agents=2", f"run_dir={shared}"])
    with pytest.raises(ConfigError, match=r"is an agent of the shared-replay sweep .*laser_sweep.py resume="):
        refuse_sweep_resume(str(shared / "agent1"))


def test_sweep_job_resumes_only_once_every_agent_has_a_checkpoint(tmp_path):
    from acer_torchrl.shared_replay import SweepConfig, SweepTask, sweep_resume_argv
    from acer_torchrl.shared_replay.sweep import record_sweep_start

    argv = ["agents=2", "preset=cartpole", f"run_dir={tmp_path}"]
    assert sweep_resume_argv(argv) == argv
    record_sweep_start(SweepConfig(agents=2), tmp_path, argv)  # as the sweep does once its agents claimed their dirs
    for i in range(2):
        (tmp_path / f"agent{i}" / "checkpoint").mkdir(parents=True)
        (tmp_path / f"agent{i}" / "checkpoint" / "counters.json").write_text("{}" if i == 0 else "")
        expected = argv if i == 0 else ["agents=2", "preset=cartpole", f"resume={tmp_path}"]
        assert sweep_resume_argv(argv) == expected
    assert SweepTask().checkpoint(argv).args == (["agents=2", "preset=cartpole", f"resume={tmp_path}"],)
    assert sweep_resume_argv(["agents=2", f"resume={tmp_path}"]) == ["agents=2", f"resume={tmp_path}"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["laser_sweep", "agents=2", "--sweep", "seed=0,1"], "one task per agent"),
        (["laser_sweep", "agents=2", "--local"], "mode=processes"),
        (["laser_sweep", "agents=2", "sweep.bogus=1"], "sweep.bogus"),
        (["laser_sweep", "agents=2", "optim.lrr=1"], "optim.lrr"),
    ],
)
def test_shared_replay_sweep_submission_errors(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)  # the checks come before any submission
    assert load_submit().main(argv) == 2
    assert message in capsys.readouterr().err


def test_shared_replay_sweep_submission_refuses_a_directory_holding_finished_agents(tmp_path, capsys, monkeypatch):
    """As ``recipes/laser_sweep.py`` refuses it at its start: before any submission, not once the job left the
    queue."""
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    for i in range(2):
        (tmp_path / f"agent{i}").mkdir()
        (tmp_path / f"agent{i}" / "summary.json").write_text("{}")
    assert load_submit().main(["laser_sweep", "agents=2", "preset=cartpole", f"run_dir={tmp_path}"]) == 2
    assert f"run_dir={tmp_path / 'agent0'} already holds a run" in capsys.readouterr().err


@pytest.mark.parametrize("listed, visible", [(None, None), ("2,3", (2, 3))])
def test_a_local_job_sees_the_gpus_this_machine_shows_unless_gpus_is_given(tmp_path, monkeypatch, listed, visible):
    """submitit's local jobs get ``CUDA_VISIBLE_DEVICES`` from their GPU count alone (none: ``""``, so that
    ``device=auto`` trained on the CPU); ``--local`` gives them the GPUs this process sees, as a recipe run here."""
    import argparse

    submit = load_submit()
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    if listed is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", listed)
    args = argparse.Namespace(local=True, max_timeouts=3, recipe="acer", time=5, cpus=1, gpus=None, partition=None)
    parameters = submit.make_executor(args, tmp_path)._executor.parameters
    assert parameters["gpus_per_node"] == 2 and parameters.get("visible_gpus") == visible
    args.gpus = 0
    assert "gpus_per_node" not in submit.make_executor(args, tmp_path)._executor.parameters


def test_a_job_that_ended_without_a_result_is_reported_by_its_state():
    """submitit's error for a job killed from outside (out of memory, ``scancel``) holds its state, then its log:
    the one line gives the state, not the log's last line."""
    from submitit.core.utils import UncompletedJobError

    err = UncompletedJobError("Job 42 (task: 0) with path /x/42_0_result.pkl\nhas not produced any output (state: "
                              "OUT_OF_MEMORY)\nError stream produced:\n" + "-" * 40 + "\nwarnings.warn('resource_tracker')")
    assert load_submit().error_line(err) == "ended without a result (state: OUT_OF_MEMORY)"
