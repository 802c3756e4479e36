"""Submit recipe runs to SLURM through submitit, one job or a sweep (job array), and tabulate sweeps.

  python slurm/submit.py acer preset=cartpole seed=1 --partition gpu --time 240 --cpus 8 --gpus 1
  python slurm/submit.py vracer preset=cartpole --sweep "optim.lr=1e-4,3e-4 seed=0,1,2" --wait
  python slurm/submit.py acer preset=cartpole total_frames=2000 --local      # this machine, no SLURM
  python slurm/submit.py tabulate runs/vracer-sweep-20250101-120000
  python slurm/submit.py laser_sweep agents=3 preset=cartpole --cpus 2   # one job, one task per agent
  python slurm/submit.py acer preset=minatar collector.workers=7 --nodes 2 --cpus 2   # collect on 2 nodes

A run with ``--nodes N`` is one job of N x (``collector.workers`` + 1) tasks: task 0 is the learner, every
other task one collector process sending it batches over ``torch.distributed`` (the first node holds the
learner and ``collector.workers`` collectors, every other node ``collector.workers`` + 1 collectors).

The LASER shared-replay sweep (``laser_sweep``, see ``recipes/laser_sweep.py``) is one job with one task
per agent; rank 0 holds the one replay and serves it to the others.

Every run gets a fixed run_dir before submission (``run_dir=`` or ``resume=`` if given, else
``runs/<recipe>-<time>``; for a sweep, ``run_dir=`` names the sweep directory and each point runs in
``<sweep_dir>/<point>``), so a preempted or requeued job resumes from its checkpoints there (see
``acer_torchrl/cluster.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import time
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

from acer_torchrl.algorithms import REGISTRY
from acer_torchrl.cluster import RecipeJob
from acer_torchrl.config import override_value, without_keys

TABLE_KEYS = ("env_steps", "eval_return_mean", "wall_time_s")
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


def fresh_dir(parent: Path, stem: str) -> Path:
    """``parent/stem-<time>``, made now, with a numeric suffix if that name is taken."""
    base = parent / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = base, 0
    while True:
        try:
            path.mkdir(parents=True)
            return path.resolve()
        except FileExistsError:
            i += 1
            path = base.with_name(f"{base.name}-{i}")


def check_config(recipe: str, overrides: list[str]):
    """Build the config here so that a bad override fails now, not after the job has waited in the queue."""
    from acer_torchrl.config import ConfigError, load_config

    try:
        return load_config(recipe, overrides)
    except ConfigError as err:
        raise SubmitError(str(err)) from None


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
    return [(point, base + [f"{k}={v}" for k, v in point.items()]) for point in points]


def plan_runs(recipe: str, given: str | None, points: list, sweep: bool) -> tuple[Path, list[dict]]:
    """Fix (and make) every run directory: ``(top_dir, [{"name", "point", "run_dir", "overrides"}, ...])``.

    One run: ``run_dir=`` or a fresh ``runs/<recipe>-<time>``. A sweep: ``run_dir=`` or a fresh
    ``runs/<recipe>-sweep-<time>`` holds one directory per point.
    """
    top = Path(given).resolve() if given else fresh_dir(Path("runs"), f"{recipe}-sweep" if sweep else recipe)
    top.mkdir(parents=True, exist_ok=True)
    runs = []
    for point, point_overrides in points:
        run_dir = top / point_name(point) if sweep else top
        runs.append(
            {"name": run_dir.name, "point": point, "run_dir": str(run_dir), "overrides": point_overrides + [f"run_dir={run_dir}"]}
        )
    return top, runs


def make_executor(args: argparse.Namespace, folder: Path) -> submitit.AutoExecutor:
    if args.local:
        executor = submitit.AutoExecutor(folder=folder / "%j", cluster="local")
    else:
        executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm", slurm_max_num_timeout=args.max_timeouts)
    params = {"name": args.recipe, "timeout_min": args.time, "cpus_per_task": args.cpus, "nodes": 1, "tasks_per_node": 1}
    if args.gpus:
        params["gpus_per_node"] = args.gpus
    if args.partition:
        params["slurm_partition"] = args.partition
    executor.update_parameters(**params)
    return executor


def error_line(err: Exception) -> str:
    """The exception line of a job's error (submitit puts the job's traceback between dashed rules)."""
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
        keys = SHARED_REPLAY_SWEEP_KEYS if "agents" in summary else TABLE_KEYS
        figures = ", ".join(f"{k}={summary.get(k)}" for k in keys)
        print(f"job {job.job_id} ({run['name']}) done: {figures}")
    return 1 if failed else 0


def tabulate(sweep_dir: Path) -> str:
    """A text table of the sweep's points and their ``summary.json`` figures (``-`` where not finished)."""
    index = sweep_dir / "sweep.json"
    if index.is_file():
        run_dirs = [Path(r["run_dir"]) for r in json.loads(index.read_text())["runs"]]
    else:
        run_dirs = sorted(p.parent for p in sweep_dir.glob("*/summary.json"))
    if not run_dirs:
        raise SubmitError(f"{sweep_dir}: no sweep.json and no */summary.json (not a sweep directory?)")
    rows = [("point", *TABLE_KEYS)]
    for run_dir in run_dirs:
        path = run_dir / "summary.json"
        summary = json.loads(path.read_text()) if path.is_file() else {}
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
    parser = argparse.ArgumentParser(
        prog="python slurm/submit.py",
        description="Submit a recipe run (or a sweep of them) through submitit. "
        "`python slurm/submit.py tabulate SWEEP_DIR` prints a sweep's results.",
    )
    # a recipe's name, or its path as the local commands give it (recipes/acer.py)
    parser.add_argument("recipe", choices=sorted([*REGISTRY, SHARED_REPLAY_SWEEP]), type=recipe_name)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides, e.g. preset=cartpole seed=1")
    parser.add_argument("--partition", help="SLURM partition (default: the cluster's default)")
    parser.add_argument("--time", type=int, default=240, help="time limit per job in minutes (default 240)")
    parser.add_argument("--cpus", type=int, default=1, help="CPUs per job (default 1)")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per job (default 0)")
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
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["tabulate"]:
            if len(argv) != 2:
                raise SubmitError("usage: python slurm/submit.py tabulate SWEEP_DIR")
            print(tabulate(Path(argv[1])))
            return 0
        args = build_parser().parse_intermixed_args(argv)
        if args.time < 1 or args.cpus < 1 or args.nodes < 1 or args.gpus < 0 or args.max_timeouts < 0:
            raise SubmitError("--time, --cpus and --nodes must be >= 1, --gpus and --max-timeouts >= 0")
        return submit(args)
    except SubmitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def require_sbatch(args: argparse.Namespace) -> None:
    """Called once the arguments are checked, so that their mistakes are reported on machines without SLURM too."""
    if not args.local and shutil.which("sbatch") is None:
        raise SubmitError(
            "no SLURM here (sbatch not found): use --local, or start a test cluster with "
            "`bash slurm/local_cluster.sh start`"
        )


def submit(args: argparse.Namespace) -> int:
    if args.recipe == SHARED_REPLAY_SWEEP:
        return submit_shared_replay_sweep(args)
    points = plan_points(args.overrides, args.sweep)
    tasks = tasks_per_node(args, [check_config(args.recipe, point_overrides) for _, point_overrides in points])
    require_sbatch(args)
    # resume=<run_dir> continues that run in place
    given_dir = override_value(args.overrides, "run_dir") or override_value(args.overrides, "resume")
    top_dir, runs = plan_runs(args.recipe, given_dir, points, args.sweep is not None)
    warn_short_time(args)
    executor = make_executor(args, (args.logs or top_dir / "submitit").resolve())
    executor.update_parameters(nodes=args.nodes, tasks_per_node=tasks)
    if args.nodes > 1:
        print(f"{args.nodes} nodes x {tasks} tasks a job: the learner and {tasks - 1} collector processes on the first "
              f"node, {tasks} collector processes on each other")
    if len(runs) == 1:
        jobs = [executor.submit(RecipeJob(), args.recipe, runs[0]["overrides"])]
    else:
        with executor.batch():
            jobs = [executor.submit(RecipeJob(), args.recipe, run["overrides"]) for run in runs]
    for job, run in zip(jobs, runs):
        run["job_id"] = job.job_id
        print(f"job {job.job_id}  run_dir {run['run_dir']}  log {job.paths.stdout}")
    if args.sweep:
        (top_dir / "sweep.json").write_text(json.dumps({"recipe": args.recipe, "sweep": args.sweep, "runs": runs}, indent=2))
        print(f"sweep dir {top_dir}  (table: python slurm/submit.py tabulate {top_dir})")
    if not (args.wait or args.local):
        return 0
    status = wait_and_report(jobs, runs)
    if args.sweep:
        print(tabulate(top_dir))
    return status


def warn_short_time(args: argparse.Namespace) -> None:
    if not args.local and args.time < 50:
        print(
            f"note: with --time under 50 min submitit counts every preemption as a timeout; a job is "
            f"requeued at most --max-timeouts={args.max_timeouts} times"
        )


def submit_shared_replay_sweep(args: argparse.Namespace) -> int:
    """A LASER sweep sharing one replay: one job whose ``agents`` tasks run one agent each
    (:class:`acer_torchrl.shared_replay.SweepTask`, requeued and resumed like a recipe run)."""
    from acer_torchrl.config import ConfigError
    from acer_torchrl.shared_replay import SweepTask, parse_sweep_args

    if args.sweep or args.local:
        raise SubmitError(
            "laser_sweep is one job with one task per agent: set its grid with agents= and sweep.lr_factors= / "
            "sweep.entropy_factors= (no --sweep); without SLURM run recipes/laser_sweep.py mode=processes"
        )
    plan_points(args.overrides, None)  # every override is key=value
    try:
        sweep, agent_overrides = parse_sweep_args(args.overrides)
    except ConfigError as err:
        raise SubmitError(str(err)) from None
    check_config("laser", without_keys(agent_overrides, "resume"))
    if sweep.agents % args.nodes:
        raise SubmitError(f"agents={sweep.agents} do not spread evenly over --nodes {args.nodes}")
    require_sbatch(args)
    given_dir = override_value(args.overrides, "resume") or override_value(args.overrides, "run_dir")
    sweep_dir = Path(given_dir).resolve() if given_dir else fresh_dir(Path("runs"), SHARED_REPLAY_SWEEP)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    argv = without_keys(args.overrides, "run_dir", "resume")
    argv.append(f"resume={sweep_dir}" if override_value(args.overrides, "resume") else f"run_dir={sweep_dir}")
    warn_short_time(args)
    executor = make_executor(args, (args.logs or sweep_dir / "submitit").resolve())
    # the ranks run across the nodes (rank 0, on the first node, serves the replay); each agent finds rank 0
    # by the first node's name (submitit's master address)
    executor.update_parameters(nodes=args.nodes, tasks_per_node=sweep.agents // args.nodes)
    job = executor.submit(SweepTask(), argv)
    print(f"job {job.job_id}  {sweep.agents} tasks on {args.nodes} node(s)  sweep dir {sweep_dir}  log {job.paths.stdout}")
    if not args.wait:
        return 0
    return wait_and_report([job], [{"name": sweep_dir.name}])


if __name__ == "__main__":
    sys.exit(main())
