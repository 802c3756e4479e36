"""Command-line entry point shared by every recipe: ``python recipes/<algo>.py [preset=...] [key=value ...]``."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import select
import signal
import sys
import warnings
from collections.abc import Callable

from acer_torchrl.checkpoint import CheckpointError
from acer_torchrl.commands import shell_command
from acer_torchrl.config import ConfigError, config_notes, load_config, override_value
from acer_torchrl.processes import HelperDied, Interrupted, StopSignals
from acer_torchrl.rundir import refuse_sweep_resume

USER_ERRORS = (ConfigError, CheckpointError)


def run(recipe: str, overrides: list[str], stop_signals: StopSignals | None = None, remote=None) -> dict:
    """Build the config of ``recipe`` with ``overrides`` and train; returns the run's summary dict. With
    ``stop_signals`` (installed), SIGINT / SIGTERM checkpoint and raise :class:`~acer_torchrl.processes.Interrupted`;
    ``remote`` (a :class:`~acer_torchrl.collectors.RemoteCollection`): collect on other nodes. A key given in
    ``overrides`` more than once, or that the run reads nowhere, is said in a ``note:`` line on stderr once the run is
    built (a refused run ends with its one error line only)."""
    from acer_torchrl.processes import RunGuard
    from acer_torchrl.trainer import Trainer

    refuse_sweep_resume(override_value(overrides, "resume"))
    cfg = load_config(recipe, overrides)
    trainer = Trainer(cfg, remote)
    for note in config_notes(cfg, overrides):
        print(note, file=sys.stderr)
    return RunGuard(stop_signals).train(trainer)


def help_text(recipe: str, preset: str | None = None) -> str:
    """``--help``: the presets and every key with its value under ``preset`` (None: the default one), read from
    :mod:`acer_torchrl.settings` (which imports no torch, so that it prints at once)."""
    from acer_torchrl.config import Config, flat_settings, set_key, unknown_preset

    settings = importlib.import_module(f"acer_torchrl.settings.{recipe}")
    (section,) = [v for v in vars(settings).values() if dataclasses.is_dataclass(v) and v.__module__ == settings.__name__]
    shown = preset or settings.DEFAULT_PRESET
    if shown not in settings.PRESETS:
        raise unknown_preset(shown, recipe, settings.PRESETS)
    cfg = Config(loss=recipe, preset=shown, algo=section())
    for key, value in settings.PRESETS[shown].items():
        set_key(cfg, key, value)
    keys = "\n".join(f"  {key}={value}" for key, value in flat_settings(cfg).items())
    return (
        f"usage: {shell_command(f'recipes/{recipe}.py')} [preset=NAME] [key=value ...]\n"
        f"presets: {', '.join(settings.PRESETS)} (default {settings.DEFAULT_PRESET})\n"
        f"keys, with their values under preset={shown} (docs/config.md explains each, README.md the ideas):\n{keys}"
    )


def main(recipe: str, argv: list[str] | None = None) -> int:
    """Run a recipe from the command line; user errors end with one line on stderr and exit code 2, SIGINT /
    SIGTERM (at any moment, from here on) with one line and exit code 130 / 143, a collector worker's death with one
    line and exit code 3 (:class:`~acer_torchrl.processes.HelperDied`)."""
    return with_stop_signals(lambda stops: run_from_command_line(recipe, sys.argv[1:] if argv is None else argv, stops))


def with_stop_signals(command: Callable[[StopSignals], int]) -> int:
    """``command``'s exit code, SIGINT / SIGTERM handled from here on by the :class:`StopSignals` it is given: a
    stop ends with its one line on stderr and exit code 130 / 143, as a helper's death does with exit code 3; a
    reader of stdout that went away (``--help | head``) ends it quietly, with the shell's code for a closed pipe
    (141)."""
    stops = StopSignals().install()
    try:
        return command(stops)
    except (Interrupted, HelperDied) as stop:
        print(stop, file=sys.stderr)
        return stop.exit_code
    except BrokenPipeError:
        if not stdout_reader_gone():  # another pipe: a helper's, a real error
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # where Python's flush at exit writes
        return 128 + signal.SIGPIPE
    except Exception as err:  # a signal inside a C extension's import comes back as "ImportError: initialization failed"
        stop = interrupt_behind(err)
        if stop is None:
            raise
        print(stop, file=sys.stderr)
        return stop.exit_code
    finally:
        stops.restore()


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader went away (the kernel flags such a pipe's write end with POLLERR)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (AttributeError, OSError, ValueError):  # no stdout, or one without a file descriptor
        return False
    return any(events & select.POLLERR for _, events in poller.poll(0))


def interrupt_behind(err: BaseException) -> Interrupted | None:
    """The :class:`Interrupted` that ``err`` was raised from (its ``__cause__`` / ``__context__`` chain), if any."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, Interrupted):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def run_from_command_line(recipe: str, argv: list[str], stops: StopSignals) -> int:
    """:func:`main`'s run, its signals handled by ``stops``: the exit code."""
    if any(arg in ("-h", "--help") for arg in argv):
        try:
            print(help_text(recipe, override_value(argv, "preset")))
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from acer_torchrl.trainer import TrainingError  # imports torchrl, which sets its logger to INFO

    quiet_libraries()

    try:
        summary = run(recipe, argv, stop_signals=stops)
    except (*USER_ERRORS, TrainingError) as err:
        print(f"error: {capped(str(err))}", file=sys.stderr)
        return 2
    if summary.get("already_finished"):
        print(f"{summary['run_dir']} already finished at {summary['env_steps']} env steps (total_frames="
              f"{summary['total_frames']}); nothing was changed. To train it further: "
              f"{shell_command(f'recipes/{recipe}.py', 'resume=' + summary['run_dir'])} "
              f"total_frames=<more than {summary['env_steps']}>")
        return 0
    print(
        f"{summary['algorithm']} on {summary['env']}: {summary['env_steps']} env steps, final score "
        f"{summary['eval_return_mean']:.1f} (mean greedy return of the {summary['final_score_evaluations']} "
        f"evaluations from step {summary['final_score_from_step']}; last {summary['eval_return_last']:.1f}), "
        f"{summary['wall_time_s']:.0f} s "
        f"({summary['env_steps_per_s']:.0f} steps/s); run dir {summary['run_dir']}"
    )
    warn_if_diverged(summary)
    return 0


def quiet_libraries() -> None:
    """TorchRL's INFO lines (storage sizes, in every run) off, its warnings kept; call once torchrl is imported
    (the import sets its logger to INFO)."""
    logging.getLogger("torchrl").setLevel(logging.WARNING)


def capped(line: str, most: int = 600) -> str:
    """``line`` cut to ``most`` characters (a value echoed in an error can be anything a user typed or a file held)."""
    return line if len(line) <= most else f"{line[: most - 30]}... ({len(line)} characters in all)"


def warn_if_diverged(summary: dict) -> None:
    """Repeat a divergence or an evaluation that is not finite (summary.json's ``health``) under the final line, where
    it cannot scroll away."""
    health = summary.get("health", {})
    if health.get("status") == "diverged":
        print(
            f"warning: this run diverged at update {health['update']} ({health['statistic']}, see health in "
            "summary.json); lower optim.lr",
            file=sys.stderr,
        )
    elif health.get("status") == "evaluation_not_finite":
        print(f"warning: the greedy evaluation at {health['evaluation']['env_steps']} env steps had a mean return of "
              f"{health['evaluation']['value']} (see health in summary.json): a game's reward was not finite",
              file=sys.stderr)
