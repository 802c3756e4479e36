"""Submit recipe runs to SLURM through submitit, one job or a sweep (job array), and tabulate sweeps.

  python slurm/submit.py acer preset=cartpole seed=1 --partition gpu --time 240 --cpus 8 --gpus 1
  python slurm/submit.py vracer preset=pendulum --sweep "optim.lr=1e-4,3e-4 seed=0,1,2" --wait
  python slurm/submit.py acer preset=cartpole total_frames=2000 --local      # this machine, no SLURM
  python slurm/submit.py tabulate runs/vracer-sweep-InvertedPendulum-v5-s0-20250101-120000
  python slurm/submit.py laser_sweep agents=3 preset=cartpole --cpus 2   # one job, one task per agent
  python slurm/submit.py acer preset=minatar collector.workers=7 --nodes 2 --cpus 2   # collect on 2 nodes

A run with ``--nodes N`` is one job of N x (``collector.workers`` + 1) tasks: task 0 is the learner, every
other task one collector process sending it batches over ``torch.distributed`` (the first node holds the
learner and ``collector.workers`` collectors, every other node ``collector.workers`` + 1 collectors).

The LASER shared-replay sweep (``laser_sweep``, see ``recipes/laser_sweep.py``) is one job with one task
per agent; rank 0 holds the one replay and serves it to the others.

Every run gets a fixed run_dir before submission (``run_dir=`` or ``resume=`` if given, else a new one named as
a recipe names it, :func:`acer_torchrl.rundir.default_run_dir`; for a sweep, ``run_dir=`` names the sweep directory
and each point runs in ``<sweep_dir>/<point>``), so a preempted or requeued job resumes from its checkpoints there
(see ``acer_torchrl/cluster.py``). Before anything is submitted the checks a local run makes come first: the
overrides' configuration, each run_dir's state (a finished run, a run in progress, a name too long), a sweep point
given twice; a scheduler that refuses the job is one line too. With ``--local``, Ctrl-C / SIGTERM stop the jobs as
they stop a recipe: each checkpoints, one line says where, exit code 130 / 143.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

from acer_torchrl.cli import with_stop_signals
from acer_torchrl.cluster import RecipeJob
from acer_torchrl.commands import OneLineErrors, shell_command
from acer_torchrl.config import ConfigError, config_notes, override_value, without_keys
from acer_torchrl.metrics import read_summary
from acer_torchrl.processes import Interrupted
from acer_torchrl.rundir import (SWEEP_FILE, check_dir_name, default_run_dir, lock_run_dir, make_writable_dir,
                                 refuse_an_old_run, shared_replay_sweep)
from acer_torchrl.settings import REGISTRY

TABLE_KEYS = ("env_steps", "eval_return_mean", "wall_time_s")
POINTS_FILE = "points.json"  # a --sweep's points and their run directories, in the sweep directory (``tabulate``)
SHARED_REPLAY_SWEEP = "laser_sweep"
SHARED_REPLAY_SWEEP_KEYS = ("env_steps_total", "best_eval_return_mean", "best_agent", "wall_time_s")


class SubmitError(ValueError):
    """A user mistake on the command line; printed as one line."""


def split_values(text: str) -> list[str]:
    """Split ``a,b,[1,2]`` on the commas outside brackets: ``['a', 'b', '[1,2]']``."""
    values, depth, current = [], 0, ""
    for char in text:
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == "," and depth == 0:
            values.append(current)
            current = ""
        else:
            current += char
    values.append(current)
    return values


def parse_sweep(spec: str) -> list[dict[str, str]]:
    """``"optim.lr=1e-4,3e-4 seed=0,1"`` -> the cross product, one ``{key: value}`` dict per point."""
    axes: dict[str, list[str]] = {}
    for item in spec.split():
        key, sep, values = item.partition("=")
        choices = split_values(values)
        if not sep or not key or any(v == "" for v in choices):
            raise SubmitError(f"--sweep item '{item}' is not key=v1,v2,...")
        if key in axes:
            raise SubmitError(f"--sweep names '{key}' twice")
        axes[key] = choices
    if not axes:
        raise SubmitError("--sweep is empty; give it e.g. \"optim.lr=1e-4,3e-4 seed=0,1\"")
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def point_name(point: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in point.items()).replace("/", "_").replace(" ", "")


def check_config(recipe: str, overrides: list[str]):
    """Build the config here so that a bad override fails now, not after the job has waited in the queue."""
    from acer_torchrl.config import load_config

    return load_config(recipe, overrides)


def say_config_notes(points: list, configs: list) -> None:
    """The ``note:`` lines each run prints at its start (a key given twice, a key its run reads nowhere), here at
    submission, each once: a swept key that has no effect at some point (the table would show points that differ by
    nothing) is said before the jobs wait in the queue, not only in their logs."""
    notes = [note for (_, point_overrides), cfg in zip(points, configs) for note in config_notes(cfg, point_overrides)]
    for note in dict.fromkeys(notes):
        print(note, file=sys.stderr)


def tasks_per_node(args: argparse.Namespace, configs: list) -> int:
    """1, or with ``--nodes`` > 1 the tasks of each node: ``collector.workers`` collectors and the learner's
    task (on the first node; a further collector on the others)."""
    if args.nodes == 1:
        return 1
    workers = {cfg.collector.workers for cfg in configs}
    if len(workers) > 1:
        raise SubmitError(f"--nodes {args.nodes}: the sweep's points need one collector.workers, got {sorted(workers)}")
    if args.local:
        raise SubmitError(f"--nodes {args.nodes} needs SLURM (--local runs on this machine alone)")
    return workers.pop() + 1


def plan_points(overrides: list[str], sweep: str | None) -> list[tuple[dict[str, str], list[str]]]:
    """``[(point, overrides of that point), ...]``, without ``run_dir=`` (one point with no sweep)."""
    for item in overrides:
        if "=" not in item:
            raise SubmitError(f"override '{item}' is not key=value")
    base = without_keys(overrides, "run_dir")
    if sweep is None:
        return [({}, base)]
    points = parse_sweep(sweep)
    clash = sorted(k for k in points[0] if override_value(base, k) is not None)
    if clash:
        raise SubmitError(f"{', '.join(clash)} given both as an override and in --sweep; keep one")
    names = [point_name(point) for point in points]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise SubmitError(f"--sweep gives the point {twice} more than once (two array tasks would share its run_dir); "
                          "list each value once")
    return [(point, base + [f"{k}={v}" for k, v in point.items()]) for point in points]


def plan_runs(top: Path, points: list, sweep: bool) -> list[dict]:
    """Every run's directory (``top``, or for a sweep one per point in it), nothing made yet:
    ``[{"name", "point", "run_dir", "overrides"}, ...]``."""
    runs = []
    for point, point_overrides in points:
        run_dir = top / point_name(point) if sweep else top
        runs.append(
            {"name": run_dir.name, "point": point, "run_dir": str(run_dir), "overrides": point_overrides + [f"run_dir={run_dir}"]}
        )
    return runs


def check_run_dirs(runs: list[dict], configs: list) -> None:
    """The checks a local run makes of its run_dir (:mod:`acer_torchrl.rundir`), before anything is made or submitted:
    a name too long, a directory that holds a run already (unless ``resume=`` or ``overwrite=true``), a resumed run
    that has nothing left to train; each run against its own point's config (a sweep may vary ``total_frames``)."""
    for run, cfg in zip(runs, configs, strict=True):
        check_dir_name(run["run_dir"], "run_dir")
        refuse_an_old_run(Path(run["run_dir"]), resume=bool(cfg.resume), overwrite=cfg.overwrite)
        if cfg.resume:
            refuse_a_finished_run(Path(run["run_dir"]), cfg.total_frames)


def refuse_another_sweep(sweep_dir: Path, runs: list[dict]) -> None:
    """A one-line :class:`SubmitError` for a ``--sweep`` into a directory that holds another sweep's
    :data:`POINTS_FILE` (other points or settings): its index would be replaced, and ``tabulate`` would show the new
    points alone beside the old ones' directories. The same sweep again (its points' runs resumed) is accepted."""
    index = sweep_dir / POINTS_FILE
    try:
        before = json.loads(index.read_text())["runs"] if index.is_file() else None
    except (OSError, ValueError, KeyError, TypeError):
        before = None  # unreadable: tabulate says so; the new index replaces it
    if before is None:
        return
    planned = [(run["name"], run["overrides"]) for run in runs]
    if [(run.get("name"), run.get("overrides")) for run in before] != planned:
        raise SubmitError(f"run_dir={sweep_dir} holds another sweep ({POINTS_FILE}: "
                          f"{', '.join(run.get('name', '?') for run in before)}); give another run_dir= for this one")


def refuse_a_finished_run(run_dir: Path, total_frames: int) -> None:
    """A one-line :class:`SubmitError` for ``resume=`` of a run that finished (its ``summary.json``) at ``total_frames``
    or beyond: the job would wait in the queue to train nothing (a local resume says so, and changes nothing)."""
    summary = read_summary(run_dir / "summary.json")
    if summary is not None and summary["env_steps"] >= total_frames:
        raise SubmitError(f"resume={run_dir} already finished at {summary['env_steps']} env steps (total_frames="
                          f"{total_frames}): nothing to submit; to train it further, give total_frames=<more than "
                          f"{summary['env_steps']}>")


def make_run_dirs(runs: list[dict]) -> None:
    """Make every run's directory, checked writable and not in use by another run (its lock taken and let go)."""
    for run in runs:
        path = make_writable_dir(Path(run["run_dir"]), "run_dir")
        lock_run_dir(path, "run_dir").close()


def make_executor(args: argparse.Namespace, folder: Path) -> submitit.AutoExecutor:
    if args.local:
        executor = submitit.AutoExecutor(folder=folder / "%j", cluster="local", local_max_num_timeout=args.max_timeouts)
    else:
        executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm", slurm_max_num_timeout=args.max_timeouts)
    params = {"name": args.recipe, "timeout_min": args.time, "cpus_per_task": args.cpus, "nodes": 1, "tasks_per_node": 1}
    gpus, indices = (args.gpus, None) if not args.local or args.gpus is not None else local_gpus()
    if gpus:  # (submitit's local jobs see CUDA_VISIBLE_DEVICES="" unless given GPUs)
        params["gpus_per_node"] = gpus
    if args.partition:
        params["slurm_partition"] = args.partition
    executor.update_parameters(**params)
    if indices and indices != tuple(range(len(indices))):  # the GPUs CUDA_VISIBLE_DEVICES gave this process, not 0..
        executor._executor.update_parameters(visible_gpus=indices)  # (AutoExecutor passes on only local_setup)
    return executor


def local_gpus() -> tuple[int, tuple[int, ...]]:
    """The GPUs this process sees, by index (its ``CUDA_VISIBLE_DEVICES`` when that lists indices): what a
    ``--local`` job sees too, as a recipe run here would."""
    import torch

    count = torch.cuda.device_count()
    listed = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    indices = tuple(int(d) for d in listed) if listed and all(d.isdigit() for d in listed) else tuple(range(count))
    return count, indices[:count]


def error_line(err: Exception) -> str:
    """The exception line of a job's error (submitit puts the job's traceback between dashed rules); for a job that
    ended without a result (killed: out of memory, ``scancel``, a node failure), its state."""
    ended = re.search(r"has not produced any output \(state: ([^)]*)\)", str(err))
    if ended:
        return f"ended without a result (state: {ended.group(1)})"
    parts = str(err).split("-" * 22)
    lines = [line.strip() for line in (parts[1] if len(parts) > 2 else str(err)).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def wait_and_report(jobs: list, runs: list[dict]) -> int:
    failed = 0
    for job, run in zip(jobs, runs):
        try:
            summary = job.results()[0]  # a multi-task job (laser_sweep, --nodes N): rank 0 reports
        except (FailedJobError, UncompletedJobError) as err:
            failed += 1
            print(f"job {job.job_id} ({run['name']}) FAILED: {error_line(err)}; log {job.paths.stderr}")
            continue
        if "interrupted" in summary:  # a local job stopped by a signal of its own
            failed += 1
            print(f"job {job.job_id} ({run['name']}) {summary['interrupted']}")
            continue
        keys = SHARED_REPLAY_SWEEP_KEYS if "agents" in summary else TABLE_KEYS
        figures = ", ".join(f"{k}={summary.get(k)}" for k in keys)
        print(f"job {job.job_id} ({run['name']}) done: {figures}")
    return 1 if failed else 0


def indexed_points(sweep_dir: Path) -> list[Path] | None:
    """The run directories :data:`POINTS_FILE` lists (in ``sweep.json`` before it had that name, which a shared-replay
    sweep's holds its keys in), each in ``sweep_dir`` by its name: a sweep copied or moved elsewhere reads its own
    points, not those of the directory it was made in; None when there is none; a one-line :class:`SubmitError`
    when it cannot be read."""
    for name in (POINTS_FILE, SWEEP_FILE):
        index = sweep_dir / name
        if not index.is_file() or (name == SWEEP_FILE and shared_replay_sweep(sweep_dir)):  # laser_sweep's keys
            continue
        try:
            return [sweep_dir / Path(run["run_dir"]).name for run in json.loads(index.read_text())["runs"]]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise SubmitError(f"{index}: not a readable list of the sweep's runs ({type(err).__name__}: {err})") from None
    return None


def tabulate(sweep_dir: Path) -> str:
    """A text table of the sweep's points and their ``summary.json`` figures (``-`` where not finished, also when
    resumed to train further, or unreadable: a resume of that point writes it again)."""
    run_dirs = indexed_points(sweep_dir)
    if run_dirs is None:  # a shared-replay sweep: its agents' run directories
        run_dirs = sorted(p.parent for p in sweep_dir.glob("*/config.yaml"))
    if not run_dirs:
        raise SubmitError(f"{sweep_dir}: no {POINTS_FILE} and no */config.yaml (not a sweep directory?)")
    rows = [("point", *TABLE_KEYS)]
    for run_dir in run_dirs:
        path = run_dir / "summary.json"
        summary = read_summary(path) or {}  # a point not finished, or its summary.json damaged
        rows.append((run_dir.name, *(_cell(summary.get(k)) for k in TABLE_KEYS)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def recipe_name(given: str) -> str:
    """``acer`` for ``acer``, ``recipes/acer.py`` or ``acer.py``."""
    return Path(given).stem if given.endswith(".py") else given


def build_parser() -> argparse.ArgumentParser:
    prog = shell_command("slurm/submit.py")
    parser = OneLineErrors(
        prog=prog,
        description=f"Submit a recipe run (or a sweep of them) through submitit. `{prog} tabulate SWEEP_DIR` prints a "
        "sweep's results.",
    )
    # a recipe's name, or its path as the local commands give it (recipes/acer.py)
    parser.add_argument("recipe", choices=sorted([*REGISTRY, SHARED_REPLAY_SWEEP]), type=recipe_name)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides, e.g. preset=cartpole seed=1")
    parser.add_argument("--partition", help="SLURM partition (default: the cluster's default)")
    parser.add_argument("--time", type=int, default=240, help="time limit per job in minutes (default 240)")
    parser.add_argument("--cpus", type=int, default=1, help="CPUs per job (default 1)")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs per job (default 0; with --local, every GPU this machine shows)")
    parser.add_argument("--nodes", type=int, default=1,
                        help="nodes of a job: a run collects on all of them (collector.workers + 1 tasks a node), "
                             "a laser_sweep spreads its agents evenly over them (default 1)")
    parser.add_argument("--sweep", help='cross product as a job array, e.g. "optim.lr=1e-4,3e-4 seed=0,1,2"')
    parser.add_argument("--local", action="store_true", help="run the jobs on this machine (no SLURM); implies --wait")
    parser.add_argument("--logs", type=Path, help="submitit log folder (default <run or sweep dir>/submitit)")
    parser.add_argument("--wait", action="store_true", help="wait for the jobs and print their results")
    parser.add_argument(
        "--max-timeouts",
        type=int,
        default=3,
        help="how often a job that reaches --time is requeued to continue from its checkpoint (default 3)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line; mistakes end with one line and exit code 2, SIGINT / SIGTERM with one line and exit code 130 /
    143 (:func:`acer_torchrl.cli.with_stop_signals`)."""
    argv = sys.argv[1:] if argv is None else argv
    return with_stop_signals(lambda _stops: checked_main(argv))


def checked_main(argv: list[str]) -> int:
    """:func:`main`'s work, its mistakes one line each."""
    try:
        if argv[:1] == ["tabulate"]:
            if len(argv) != 2:
                raise SubmitError(f"usage: {shell_command('slurm/submit.py', 'tabulate')} SWEEP_DIR")
            print(tabulate(Path(argv[1])))
            return 0
        args = build_parser().parse_intermixed_args(argv)
        if args.time < 1 or args.cpus < 1 or args.nodes < 1 or (args.gpus or 0) < 0 or args.max_timeouts < 0:
            raise SubmitError("--time, --cpus and --nodes must be >= 1, --gpus and --max-timeouts >= 0")
        return submit(args)
    except (SubmitError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


SLURM_TOOLS = ("sbatch", "srun")  # what submitit submits with, and how it tells a SLURM cluster


def require_slurm(args: argparse.Namespace) -> None:
    """Called once the arguments are checked, so that their mistakes are reported on machines without SLURM too."""
    missing = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
    if not args.local and missing:
        raise SubmitError(
            f"no SLURM here ({' and '.join(missing)} not found): use --local, or start a test cluster with "
            "`bash slurm/local_cluster.sh start`"
        )


def submit(args: argparse.Namespace) -> int:
    if args.recipe == SHARED_REPLAY_SWEEP:
        return submit_shared_replay_sweep(args)
    points = plan_points(args.overrides, args.sweep)
    configs = [check_config(args.recipe, point_overrides) for _, point_overrides in points]
    say_config_notes(points, configs)
    tasks = tasks_per_node(args, configs)
    # resume=<run_dir> continues that run in place
    given_dir = override_value(args.overrides, "run_dir") or override_value(args.overrides, "resume")
    if given_dir:
        check_dir_name(given_dir, "run_dir")
        top_dir = Path(given_dir).resolve()
        planned = plan_runs(top_dir, points, args.sweep is not None)
        check_run_dirs(planned, configs)
        if args.sweep:
            refuse_another_sweep(top_dir, planned)
    require_slurm(args)
    if not given_dir:
        top_dir = default_run_dir(configs[0], sweep=args.sweep is not None).resolve()
    runs = plan_runs(top_dir, points, args.sweep is not None)
    make_run_dirs(runs)
    warn_short_time(args)
    logs = (args.logs or top_dir / "submitit").resolve()
    executor = make_executor(args, logs)
    executor.update_parameters(nodes=args.nodes, tasks_per_node=tasks)
    if args.nodes > 1:
        print(f"{args.nodes} nodes x {tasks} tasks a job: the learner and {tasks - 1} collector processes on the first "
              f"node, {tasks} collector processes on each other")
    with scheduler_refusal_in_one_line(), local_jobs_leave_ctrl_c_to_their_task(args):
        if len(runs) == 1:
            jobs = [executor.submit(RecipeJob(), args.recipe, runs[0]["overrides"])]
        else:
            with executor.batch():
                jobs = [executor.submit(RecipeJob(), args.recipe, run["overrides"]) for run in runs]
    for job, run in zip(jobs, runs):
        run["job_id"] = job.job_id
        print(f"job {job.job_id}  run_dir {run['run_dir']}  log {job.paths.stdout}")
    if args.sweep:
        (top_dir / POINTS_FILE).write_text(json.dumps({"recipe": args.recipe, "sweep": args.sweep, "runs": runs}, indent=2))
        print(f"sweep dir {top_dir}  (table: {shell_command('slurm/submit.py', 'tabulate', str(top_dir))})")
    if not (args.wait or args.local):
        return 0
    try:
        status = wait_stopping_with_the_jobs(args, jobs, runs)
    finally:
        drop_the_local_controllers_folder(logs)
    if args.sweep:
        print(tabulate(top_dir))
    return status


def drop_the_local_controllers_folder(logs: Path) -> None:
    """submitit's local job controller makes ``<logs>/%j`` itself (the folder's pattern taken as a name) and leaves
    it empty beside the jobs' own ``<logs>/<job id>/``: removed once the jobs ended (if it is there and empty)."""
    with contextlib.suppress(OSError):
        (logs / "%j").rmdir()


@contextlib.contextmanager
def scheduler_refusal_in_one_line():
    """A submission that the scheduler refuses (``sbatch: error: invalid partition specified``): submitit prints
    sbatch's words and raises them in a traceback; one :class:`SubmitError` line with sbatch's last instead."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            yield
    except FailedJobError as err:
        lines = [line.strip() for line in (str(err) or said.getvalue()).splitlines() if line.strip()]
        raise SubmitError(f"the scheduler refused the job: {lines[-1] if lines else 'it gave no reason'}") from None
    except BaseException:
        sys.stderr.write(said.getvalue())
        raise
    sys.stderr.write(said.getvalue())


@contextlib.contextmanager
def local_jobs_leave_ctrl_c_to_their_task(args: argparse.Namespace):
    """``--local``: the jobs start with SIGINT ignored (inherited by submitit's job controller and its task). The
    controller would otherwise take Ctrl-C too and kill the task a second later, before its checkpoint; the task
    handles it itself (:class:`acer_torchrl.cluster.RecipeJob`)."""
    if not args.local:
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def wait_stopping_with_the_jobs(args: argparse.Namespace, jobs: list, runs: list[dict]) -> int:
    """:func:`wait_and_report`; SIGINT / SIGTERM (:class:`Interrupted`) while waiting: with ``--local`` the jobs stop
    too (the signal reaches them from the terminal, or from here through their controller) and one line says where
    each stopped; under SLURM the jobs go on and the line says so."""
    try:
        return wait_and_report(jobs, runs)
    except Interrupted as stop:
        if not args.local:
            ids = ", ".join(job.job_id for job in jobs)
            raise Interrupted(stop.signum, f"stopped waiting; the jobs go on in SLURM ({ids}): squeue lists them, "
                                           "scancel stops them") from None
        for job in jobs:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(job.job_id), signal.SIGTERM)  # a local job's id is its controller's pid; it tells the task
        raise Interrupted(stop.signum, "; ".join(stopped_job_line(job, run) for job, run in zip(jobs, runs))) from None


def stopped_job_line(job, run: dict) -> str:
    """Where a stopped local job ended: its own stop line, or that it finished or failed first."""
    try:
        result = job.results()[0]
    except (FailedJobError, UncompletedJobError):
        return f"job {job.job_id} ({run['name']}) ended without a result; log {job.paths.stderr}"
    return f"job {job.job_id} ({run['name']}) {result.get('interrupted', 'had finished')}"


def warn_short_time(args: argparse.Namespace) -> None:
    """submitit counts a preemption as a timeout once the job has run ``min(0.8 T, T - 10 min)`` of its ``--time`` T
    (``JobEnvironment``'s ``has_timed_out``): from the start at 10 min or less."""
    if not args.local and args.time <= 10:
        print(
            f"note: with --time of 10 min or less submitit counts every preemption as a timeout; a job is "
            f"requeued at most --max-timeouts={args.max_timeouts} times"
        )


def submit_shared_replay_sweep(args: argparse.Namespace) -> int:
    """A LASER sweep sharing one replay: one job whose ``agents`` tasks run one agent each
    (:class:`acer_torchrl.shared_replay.SweepTask`, requeued and resumed like a recipe run)."""
    from acer_torchrl.shared_replay import SweepTask, parse_sweep_args
    from acer_torchrl.shared_replay.sweep import agent_configs

    if args.sweep or args.local:
        raise SubmitError(
            "laser_sweep is one job with one task per agent: set its grid with agents= and sweep.lr_factors= / "
            "sweep.entropy_factors= (no --sweep); without SLURM run "
            f"{shell_command('recipes/laser_sweep.py', 'mode=processes')}"
        )
    plan_points(args.overrides, None)  # every override is key=value
    sweep, agent_overrides = parse_sweep_args(args.overrides)
    agent_cfg = check_config("laser", without_keys(agent_overrides, "resume"))
    if sweep.agents % args.nodes:
        raise SubmitError(f"agents={sweep.agents} do not spread evenly over --nodes {args.nodes}")
    require_slurm(args)
    given_dir = override_value(args.overrides, "resume") or override_value(args.overrides, "run_dir")
    if given_dir:
        check_dir_name(given_dir, "run_dir")
    sweep_dir = Path(given_dir).resolve() if given_dir else default_run_dir(agent_cfg, sweep=True).resolve()
    make_writable_dir(sweep_dir, "run_dir")
    where = f"resume={sweep_dir}" if override_value(args.overrides, "resume") else f"run_dir={sweep_dir}"
    argv = [*without_keys(args.overrides, "run_dir", "resume"), where]
    # the agents' run dirs, checked as the sweep checks them at its start
    for cfg in agent_configs(sweep, [*without_keys(agent_overrides, "run_dir", "resume"), where])[1]:
        refuse_an_old_run(Path(cfg.run_dir), resume=bool(cfg.resume), overwrite=cfg.overwrite)
    warn_short_time(args)
    executor = make_executor(args, (args.logs or sweep_dir / "submitit").resolve())
    # the ranks run across the nodes (rank 0, on the first node, serves the replay); each agent finds rank 0
    # by the first node's name (submitit's master address)
    executor.update_parameters(nodes=args.nodes, tasks_per_node=sweep.agents // args.nodes)
    with scheduler_refusal_in_one_line():
        job = executor.submit(SweepTask(), argv)
    print(f"job {job.job_id}  {sweep.agents} tasks on {args.nodes} node(s)  sweep dir {sweep_dir}  log {job.paths.stdout}")
    if not args.wait:
        return 0
    return wait_and_report([job], [{"name": sweep_dir.name}])


if __name__ == "__main__":
    sys.exit(main())
