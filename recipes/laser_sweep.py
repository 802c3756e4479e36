"""A LASER hyper-parameter sweep whose agents share one experience replay (Schmitt et al. 2020, sec. 5.4-5.5).

    python recipes/laser_sweep.py [agents=3] [mode=local|processes] [sweep.lr_factors=0.5,1,2]
        [sweep.entropy_factors=0.5,1,2] [preset=cartpole] [key=value ...]

Agent i trains with ``optim.lr`` and ``laser.entropy_coeff`` scaled by the factors of
:class:`acer_torchrl.shared_replay.SweepConfig` (9 agents cover the paper's 3 x 3 grid) and seed
``seed + i``; every other key configures all agents (``replay.capacity`` is the one shared replay's).
``loss=vracer`` sweeps V-RACER agents instead (``optim.lr`` and seed only: V-RACER has no entropy cost;
each agent keeps its own stored estimates of every shared step). ``mode=local`` steps all agents in this
process (Ctrl-C / SIGTERM save every agent and print how to resume); ``mode=processes`` runs one process per
agent, rank 0 serving the replay over ``torch.distributed.rpc`` (the layout of a SLURM job with one task per
agent, see :class:`acer_torchrl.shared_replay.SweepTask`). The sweep directory gets each agent's run directory
(``agent<i>/``), ``metrics.csv`` with every agent's greedy return and the pointwise best,
``learning_curves.png`` and ``summary.json``.
"""

import sys
import warnings


def main(argv: list[str]) -> int:
    """The sweep; user errors end with one line and exit code 2, SIGINT / SIGTERM (``mode=local``: every agent
    saved after the batch in hand) with one line and exit code 130 / 143."""
    from acer_torchrl.cli import with_stop_signals

    if any(arg in ("-h", "--help") for arg in argv):  # anywhere on the line, as in the other recipes
        return with_stop_signals(print_help)
    return with_stop_signals(lambda stops: run_sweep_command(argv, stops))


def print_help(_stops) -> int:
    """``--help``: this docstring, its command naming the interpreter that runs (not a bare ``python``)."""
    from acer_torchrl.commands import shell_command

    print(__doc__.strip().replace("python recipes/laser_sweep.py", shell_command("recipes/laser_sweep.py"), 1))
    return 0


def run_sweep_command(argv: list[str], stops) -> int:
    """The sweep of ``argv`` under the installed ``stops`` (:class:`~acer_torchrl.processes.StopSignals`); its
    exit code."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from acer_torchrl.cli import USER_ERRORS, quiet_libraries
    from acer_torchrl.shared_replay import run
    from acer_torchrl.trainer import TrainingError

    quiet_libraries()

    try:
        result = run(argv, stops)
    except (*USER_ERRORS, TrainingError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for agent in result["agents"]:
        entropy = f", entropy {agent['entropy_coeff']:.3g}" if agent["entropy_coeff"] is not None else ""
        print(
            f"agent {agent['agent']}: lr {agent['lr']:.3g}{entropy}: final score {agent['eval_return_mean']:.1f} "
            f"(mean greedy return of the {agent['final_score_evaluations']} evaluations from step "
            f"{agent['final_score_from_step']}) after {agent['env_steps']} env steps"
        )
    print(
        f"best agent {result['best_agent']}: {result['best_eval_return_mean']:.1f}; "
        f"{result['wall_time_s']:.0f} s; sweep dir {result['sweep_dir']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
