"""The one training loop shared by every loss.

collect (asynchronous workers) -> store in the episode replay -> for each planned gradient step: draw a
batch (online windows and/or replayed sequences), refresh the recurrent state, the agent's ``before_update``
(V-RACER's targets), loss, clip, step, update target / average networks, the agent's ``after_update`` -> push
weights to the workers -> evaluate, log, checkpoint.
The workers keep collecting while the learner trains (``MultiAsyncCollector``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import json
import math
import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.modules import set_recurrent_mode
from tqdm import tqdm

from acer_torchrl.agent import Agent
from acer_torchrl.checkpoint import CheckpointError, load_checkpoint, load_weights, save_checkpoint
from acer_torchrl.collectors import RemoteCollection, copy_weights_, make_collector, make_remote_collector
from acer_torchrl.commands import shell_command
from acer_torchrl.config import (Config, ConfigError, differing_settings, dump_yaml, edited_settings, resume_changes,
                                 trained_settings)
from acer_torchrl.envs import env_info, make_env_fn, stacked_frames
from acer_torchrl.evaluation import BackgroundEvaluator, InlineEvaluator, evaluation_env_config, evaluation_seed
from acer_torchrl.health import Health, ReLUActivity, most_dead_layer
from acer_torchrl.metrics import (MetricsLog, final_score, final_window_steps, make_loggers, os_reason,
                                  read_summary, save_learning_curve, window_games_cut, window_settings,
                                  write_summary)
from acer_torchrl.objectives.common import objective
from acer_torchrl.objectives.names import BEHAVIOUR, PRIORITY_KEY, PRIORITY_WEIGHT_KEY
from acer_torchrl.optim import DirectStep, make_optimiser, optimiser_name, optimiser_settings
from acer_torchrl.processes import HelperDied, RunGuard, StopSignals
from acer_torchrl.priority_tree import SequencePriorities
from acer_torchrl.provenance import contributing, file_sha256, record_segment, segments, started_from, summarize
from acer_torchrl.replay import EpisodeReplay, OnlineWindows, Replay, unprioritized
from acer_torchrl.rundir import default_run_dir, drop_old_run, prepare_run_dir, restore_old_run
from acer_torchrl.settings import fresh_windows, get_algorithm

EVALUATIONS_BEHIND = 4  # this many evaluations waiting for the evaluation process: a note (Trainer.ask_evaluation)


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. non-finite loss); the CLI prints its message as one line."""


@dataclass
class Counters:
    env_steps: int = 0
    updates: int = 0
    episodes: int = 0
    wall_time_s: float = 0.0
    learner_cpu_s: float = 0.0  # CPU time of the learner's process (all its threads) in the collection phases
    restarts: int = 0
    next_eval: int = 0
    next_checkpoint: int = 0
    rng: dict = field(default_factory=dict)
    health: dict = field(default_factory=dict)  # Health.state(): the divergence watch


def resolve_device(name: str) -> torch.device:
    """``auto``: a GPU when torch sees one; the tasks of a SLURM job sharing a node take its GPUs in turn
    by their local rank (``SLURM_LOCALID``), so that two agents of a sweep do not share ``cuda:0``."""
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", int(os.environ.get("SLURM_LOCALID", "0")) % torch.cuda.device_count())
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TrainingError(f"device={name} but no CUDA device is visible; use device=cpu or device=auto")
    return torch.device(name)


def available_cores() -> int:
    """The cores this process may use: SLURM's share for the task (``SLURM_CPUS_PER_TASK``) inside a job,
    else the CPU affinity (a container's or ``taskset``'s limit), else the machine's count."""
    if os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return int(os.environ["SLURM_CPUS_PER_TASK"])
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def learner_threads(cfg: Config, remote_collection: bool = False) -> int:
    """``cfg.threads``, or (0) the cores the collector workers leave free, at least one (all of the task's
    cores when the collectors are a multi-node job's other tasks)."""
    return cfg.threads or max(1, available_cores() - (0 if remote_collection else cfg.collector.workers))


def _listed(names: list[str], most: int = 4) -> str:
    """``a, b, c`` (or ``none``), the first ``most`` names and how many more."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more if names else "none"


class Trainer:
    """Owns the run: agent, optimiser, replay, collector, counters and the run directory."""

    def __init__(self, cfg: Config, remote: RemoteCollection | None = None):
        self.cfg = cfg
        self.remote = remote  # collector processes on other nodes (a multi-node job) instead of local workers
        self.device = resolve_device(cfg.device)
        run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)
        # locked for the life of this trainer (close()): a second run into the same directory is refused
        self.run_dir, self._run_lock = prepare_run_dir(run_dir, resume=bool(cfg.resume), overwrite=cfg.overwrite)
        cfg.run_dir = str(self.run_dir)
        try:
            self._build(cfg)
        except BaseException:  # refused: the directory is free again at once (not when this object is collected),
            restore_old_run(self.run_dir)  # and an overwritten run is back as it was
            self._run_lock.close()
            raise
        drop_old_run(self.run_dir)
        # (a finished run resumed trains nothing and writes no file, unless it plays evaluations its checkpoint kept)
        if self.counters.env_steps < cfg.total_frames or self._asked_again:
            self.log.loggers = make_loggers(self.run_dir, cfg.log.tensorboard, cfg.log.wandb,
                                            resumed_at=self._rows_again_from())
            # the code, packages and machine it trains on (from weights: those of the run they were cut from first)
            record_segment(self.run_dir, self.counters.env_steps, self._inherited)
            # a finished run resumed to train further is not finished any more: its summary comes at its new end
            (self.run_dir / "summary.json").unlink(missing_ok=True)
        self.record_config()

    def _build(self, cfg: Config) -> None:
        """The agent, optimiser, replay and counters, from the checkpoint (``resume``) or ``init_from``'s weights;
        a one-line error where they do not fit the run (:meth:`__init__` puts back what it set aside)."""
        torch.set_num_threads(learner_threads(cfg, remote_collection=self.remote is not None))
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.info = env_info(cfg.env)
        self.agent: Agent = get_algorithm(cfg.loss).build(cfg, self.info)
        # collectors and evaluation act on CPU: with a GPU learner they get a CPU copy, copied into after updates
        self.acting = self.agent.policy if self.device.type == "cpu" else copy.deepcopy(self.agent.policy)
        self.loss = self.agent.loss.to(self.device)
        params = [p for p in self.loss.parameters() if p.requires_grad]
        self.optimizer = make_optimiser(params, cfg.optim)
        self.direct_step = DirectStep(self.optimizer)  # clipping and the step: torch's kernels without their Python
        self.params = params
        self.replay: Replay = self.make_replay()
        self.online = OnlineWindows(cfg.replay.seq_len)
        # replay.prefetch: one thread that draws an update plan's next batch while the update in hand runs
        self._drawer = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="draw-ahead")
                        if self.draws_ahead() else None)
        self.counters = Counters(next_eval=cfg.eval.interval, next_checkpoint=cfg.log.checkpoint_interval)
        self.log = MetricsLog(self.run_dir)  # its TensorBoard / W&B loggers: once a resume is known (below)
        self.health = Health(self.agent.value_keys, gamma=cfg.gamma,
                             num_actions=self.info.num_actions if self.info.discrete else None)
        self.activity = ReLUActivity(self.agent.policy)  # a dead network (acer_torchrl.health), watched once a row
        self.evaluator: BackgroundEvaluator | InlineEvaluator | None = None  # from start() to close()
        self._collector = None  # from start() to stop_collecting()
        self._bar = None  # the progress bar, while the clock runs
        # rows waiting for their evaluation: (env_steps, updates, wall_s, metrics, evaluation_settings())
        self._awaiting: deque = deque()
        self._said_games_cut = False  # the note on evaluation games cut at eval.max_steps (once a segment)
        self._said_behind = False  # the note on evaluations falling behind the learner (once a segment)
        self._one_came_back = False  # an evaluation came back in this segment (the evaluation process is up)
        # a resume's: the evaluations its checkpoint kept unfinished, asked again by start()
        self._asked_again: list[dict] = []
        self._saved_steps: int | None = None  # env steps of the run's latest checkpoint (None: none yet)
        self._trained_with: dict = {}  # the settings the resumed checkpoint was trained with
        self._inherited: dict | None = None  # init_from: the weights file, its SHA-256, the run it was cut from
        # the statistics of the updates and the finished episodes since the last metrics row (a resume's: its
        # checkpoint's), averaged into the next row
        self._window: dict[str, list[float]] = {}
        self._returns: list[float] = []
        if cfg.resume:
            self._resume()
        elif cfg.init_from:
            self._start_from_weights(Path(cfg.init_from))
        self.check_an_update_comes()

    def make_replay(self) -> Replay:
        """The replay this run stores its experience in. A shared-replay sweep overrides it to hand every
        agent a view of one common replay (:mod:`acer_torchrl.shared_replay`)."""
        cfg = self.cfg.replay
        scratch = self.run_dir / "replay_storage" if cfg.memmap else None
        priorities = (SequencePriorities(cfg.capacity, cfg.priority_block, cfg.priority_uniform)
                      if cfg.prioritized else None)
        return EpisodeReplay(cfg.capacity, scratch_dir=scratch, seed=self.cfg.seed,
                             frame_stack=stacked_frames(self.cfg.env), priorities=priorities)

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        return {
            "loss": self.loss.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            # each GPU's generator (dropout-free losses still sample on the learner's device: SDN, KL draws)
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            # a target network's copy schedule (TorchRL's HardUpdate counts its steps) survives a restart
            "updater_counters": [int(getattr(u, "counter", 0)) for u in self.agent.updaters],
            **({"estimates": self.agent.estimates.state_dict()} if self.agent.estimates is not None else {}),
            # the freshest collected windows an update mixes in (replay.py OnlineWindows)
            "online": self.online.state(),
            # the evaluations still being played, each with its row and the weights it was asked on: a resume asks
            # for them again (a checkpoint does not wait for them)
            "evaluations_unfinished": self.unfinished_evaluations(),
            # the next metrics row's statistics so far: the updates' and the finished episodes' since the last row
            "metrics_window": {"updates": {k: torch.tensor(v, dtype=torch.float64) for k, v in self._window.items()},
                               "returns": torch.tensor(self._returns, dtype=torch.float64)},
            # the settings it was trained with: a resume from a config.yaml edited by hand is refused (a run-defining
            # key) or records the edit as a change (an applied one)
            "settings": trained_settings(self.cfg),
        }

    def unfinished_evaluations(self) -> list[dict]:
        """The rows waiting for their evaluation, each with the weights the evaluation was asked on (call after
        :meth:`log_evaluations` of the evaluator's finished ones: every row left waits for an unfinished one)."""
        weights = {tag: w for tag, _, w in self.evaluator.unfinished()} if self.evaluator is not None else {}
        return [{"env_steps": steps, "updates": updates, "wall_time_s": wall, "metrics": metrics, "settings": settings,
                 "weights": weights[steps]} for steps, updates, wall, metrics, settings in self._awaiting]

    def _resume(self) -> None:
        state, counters = load_checkpoint(self.run_dir, self.replay, check=self._refuse_edited_settings)
        self.load_learner(state, f"checkpoint in {self.run_dir}", estimates=True)
        self.online.load_state(state.get("online", []))  # (checkpoints of before 2026-11-29 hold neither)
        window = state.get("metrics_window", {"updates": {}, "returns": torch.zeros(0)})
        self._window = {k: v.tolist() for k, v in window["updates"].items()}
        self._returns = window["returns"].tolist()
        torch.set_rng_state(state["torch_rng"])
        cuda_rng = state.get("cuda_rng", [])
        if cuda_rng and torch.cuda.is_available():  # a GPU run resumed on CPU leaves them; more GPUs: the first ones
            torch.cuda.set_rng_state_all(cuda_rng[: torch.cuda.device_count()])
        self.counters = Counters(**counters)
        self._saved_steps = self.counters.env_steps
        self.counters.restarts += 1
        self.health.load_state(self.counters.health)
        if self.counters.rng:
            self.rng.bit_generator.state = self.counters.rng
        # (checkpoints of before 2026-11-29 waited for every evaluation: none unfinished)
        self._asked_again = state.get("evaluations_unfinished", [])
        again = {e["env_steps"] for e in self._asked_again}
        self.warn_of_repairs([self.log.load_existing(self.counters.env_steps, again), self.summary_damage()])
        self.sync_acting_policy()
        self.apply_resumed_settings()

    def _rows_again_from(self) -> int | None:
        """The env steps after which a resumed run logs every row again (None: a new run): its checkpoint's, or
        just before the first evaluation the checkpoint kept unfinished (results come back in the order asked, so
        every row the killed run logged from there on is one that :meth:`start` asks for again or one past the
        checkpoint)."""
        if self._saved_steps is None:
            return None
        return min([self._saved_steps, *(e["env_steps"] - 1 for e in self._asked_again)])

    def _refuse_edited_settings(self, state: dict) -> None:
        """The one-line refusal of a resume whose ``config.yaml`` holds other run-defining settings than its checkpoint
        was trained with (edited by hand), before the replay is read (one of another capacity would not fit)."""
        self._trained_with = state.get("settings", {})  # (a checkpoint of before 2026-11-29: none)
        edited = edited_settings(self.cfg, self._trained_with)
        if edited is not None:
            raise edited

    def load_learner(self, state: dict, source: str, estimates: bool) -> None:
        """The loss's state, the optimiser's (when ``state`` keeps it), with ``estimates`` the agent's stored estimates
        (V-RACER's), and the target networks' copy counters, from ``state``; a one-line :class:`CheckpointError` naming
        ``source`` when they do not fit this configuration (another network, another algorithm)."""
        mine = self.loss.state_dict()
        shapes = [(k, list(v.shape), list(mine[k].shape)) for k, v in state["loss"].items()
                  if k in mine and isinstance(v, torch.Tensor) and v.shape != mine[k].shape]
        if shapes:  # (tensordict's own error names no tensor: its first line ends in "TensorDict(")
            name, there, here = shapes[0]
            raise CheckpointError(f"{source} does not match this configuration: {name} is {there} there, {here} here "
                                  "(another network or env)")
        support = mine.get("support")  # a distributional critic's atoms: what its outputs mean, set by the config
        if support is not None and "support" in state["loss"] and not torch.equal(state["loss"]["support"], support):
            saved = state["loss"]["support"]
            raise CheckpointError(f"{source} holds a distributional critic on [{saved[0]:g}, {saved[-1]:g}], this run's "
                                  f"is on [{support[0]:g}, {support[-1]:g}] (reactor.v_min, reactor.v_max)")
        try:
            keys = self.loss.load_state_dict(state["loss"], strict=False)
            if keys.missing_keys or keys.unexpected_keys:
                raise RuntimeError(f"missing {_listed(keys.missing_keys)}, unexpected {_listed(keys.unexpected_keys)}")
            if "optimizer" in state:
                saved, name = optimiser_name(state["optimizer"]["param_groups"][0]), self.cfg.optim.name
                if saved != name:  # torch would load Adam's moments into RMSprop and fail at its first step
                    raise ValueError(f"its optimiser state is {saved}'s, this run's optim.name={name}")
                self.optimizer.load_state_dict(state["optimizer"])
            if estimates and self.agent.estimates is not None:
                self.agent.estimates.load_state_dict(state["estimates"])
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(
                f"{source} does not match this configuration ({type(err).__name__}: {str(err).splitlines()[0]})"
            ) from None
        for updater, count in zip(self.agent.updaters, state.get("updater_counters", [])):
            if hasattr(updater, "counter"):
                updater.counter = count

    def _start_from_weights(self, path: Path) -> None:
        """A new run from ``init_from``'s weights (:func:`~acer_torchrl.checkpoint.cut_weights`): the networks, the
        optimiser's state when the file keeps it (else the optimiser starts afresh), the statistics fitted beside the
        networks (a state standardisation stays as trained, not fitted afresh), and the counters of the run they
        were cut from (env steps, updates, episodes, clocks: this run's curve continues that run's, one restart on),
        its own seed's RNG and schedules; the replay is empty and refills (``replay.min_size`` steps before the
        replayed updates). A file of another algorithm or env, network or optimiser, is one line."""
        cfg = self.cfg
        weights = load_weights(path)
        if "source" in weights:  # (a file cut by an older version names none)
            self._inherited = {"path": str(path.resolve()), "sha256": file_sha256(path), "source": weights["source"]}
        if (weights["algorithm"], weights["env"]) != (cfg.loss, cfg.env.name):
            raise CheckpointError(f"init_from={path} holds {weights['algorithm']} weights for {weights['env']}, not "
                                  f"{cfg.loss} on {cfg.env.name}")
        network = dataclasses.asdict(cfg.network)
        other = differing_settings(network, weights.get("network", {}))  # (a file of before 2026-11-29: none)
        if other:
            raise CheckpointError(f"init_from={path} holds weights of a network with "
                                  + ", ".join(f"network.{k}={weights['network'][k]}" for k in other)
                                  + ", this run's has " + ", ".join(f"network.{k}={network[k]}" for k in other))
        self.load_learner(weights, f"init_from={path}", estimates="estimates" in weights)
        self.counters = Counters(**weights["counters"])
        self.counters.restarts += 1
        if cfg.total_frames <= self.counters.env_steps:
            raise ConfigError(f"init_from={path} is at {self.counters.env_steps} env steps: give total_frames > "
                              f"{self.counters.env_steps} (the run's end, counted from the start of the first run)")
        self.note_a_short_final_window(path)
        self.sync_acting_policy()
        self.apply_resumed_settings()

    def note_a_short_final_window(self, path: Path) -> None:
        """One ``note:`` line when ``init_from``'s weights start this run past some of its final-window evaluation
        points (:func:`final_window_steps`): its final score then averages fewer than the window's three evaluations
        (``final_score_evaluations`` in summary.json says how many), the weights' own run having made the others."""
        start = self.counters.env_steps
        per_batch = self.cfg.collector.frames_per_batch
        points = final_window_steps(run_end(start, self.cfg.total_frames, per_batch), per_batch)
        due = [step for step in points if step > start]
        if len(due) < len(points):
            print(f"note: init_from={path} starts at {start} env steps, past {len(points) - len(due)} of the final "
                  f"score's {len(points)} evaluation points ({', '.join(map(str, points))}): its final score averages "
                  "the evaluations this run makes from there", file=sys.stderr)

    def apply_resumed_settings(self) -> None:
        """Set this config's applied settings (:data:`~acer_torchrl.config.APPLIED_ON_RESUME`) on what the checkpoint
        (or ``init_from``'s weights) restored with the saved run's values: the optimiser's hyper-parameters (its state
        dict holds the old ones)
        and the evaluation and checkpoint schedules (the next multiple of each interval). The others are read from
        ``self.cfg`` at each use, or by the objects built from it in :meth:`__init__` and :meth:`start`."""
        for group in self.optimizer.param_groups:
            group.update(optimiser_settings(self.cfg.optim), lr=self.learning_rate())
        c, steps = self.counters, self.counters.env_steps
        c.next_eval = (steps // self.cfg.eval.interval + 1) * self.cfg.eval.interval
        c.next_checkpoint = (steps // self.cfg.log.checkpoint_interval + 1) * self.cfg.log.checkpoint_interval

    def check_an_update_comes(self) -> None:
        """A one-line :class:`ConfigError` for a run that would end before its first update (reporting the score of
        an untrained policy): ``total_frames`` too low for the replay to reach what the loss's first update needs
        (``replay.min_size``), or, on resume, lower than the steps the unfinished run already took."""
        cfg, c = self.cfg, self.counters
        remaining = cfg.total_frames - c.env_steps
        if remaining <= 0:
            # the run's own total_frames (its checkpoint's): its last batch may have gone past it (whole batches)
            trained_to = resume_changes(cfg, self._trained_with).get("total_frames", (cfg.total_frames,))[0]
            lowered = cfg.total_frames < c.env_steps and cfg.total_frames < trained_to
            if lowered and not (self.run_dir / "summary.json").is_file():
                raise ConfigError(f"resume={self.run_dir}: total_frames={cfg.total_frames} is below the "
                                  f"{c.env_steps} env steps the run already took; give total_frames >= {c.env_steps}")
            return
        # the steps collected by the end (whole batches), all in the replay (its capacity is at least min_size); counted,
        # not read from the replay: a sweep agent's shared replay is not served yet while its trainer is built
        needed = self.loss.stored_steps_before_first_update(cfg.replay.min_size)
        batch = cfg.collector.frames_per_batch
        from_weights = bool(cfg.init_from) and not cfg.resume  # updates taken, but an empty replay to refill
        stored = 0 if from_weights else c.env_steps
        if (c.updates == 0 or from_weights) and stored + math.ceil(remaining / batch) * batch < needed:
            raise ConfigError(
                f"total_frames={cfg.total_frames} ends before the first update: loss={cfg.loss} takes it once {needed} "
                f"steps are collected (replay.min_size={cfg.replay.min_size}); give total_frames >= "
                f"{c.env_steps - stored + needed}"
            )

    def record_config(self) -> None:
        """``config.yaml`` of a new run; for a resume, what it changed (:meth:`record_resume_changes`), unless the
        run had already finished (nothing trains, and no file is touched)."""
        if not self.cfg.resume:
            dump_yaml(self.cfg, self.run_dir / "config.yaml")
        elif self.finished_summary() is None:
            self.record_resume_changes()

    def summary_damage(self) -> str | None:
        """What is wrong with the resumed run's ``summary.json`` when it cannot be read (None when it is whole or
        missing): the run's end writes it again, at once when the checkpoint holds a finished run. A directory in its
        place, which no write replaces, is a one-line :class:`ConfigError` (before the run trains in vain)."""
        path = self.run_dir / "summary.json"
        if path.is_dir():
            raise ConfigError(f"{path} is a directory, where the run writes its summary; move it away (the resumed run "
                              "writes a new one from its checkpoint)")
        if not path.exists() or read_summary(path) is not None:
            return None
        return "summary.json unreadable, rebuilt " + ("now" if self.counters.env_steps >= self.cfg.total_frames
                                                       else "when the run ends")

    def warn_of_repairs(self, repairs: list[str | None]) -> None:
        """One warning line naming the side files a resume repaired from its checkpoint (none: no line)."""
        done = [r for r in repairs if r]
        if done:
            print(f"warning: resume={self.run_dir}: {'; '.join(done)} (the checkpoint at {self.counters.env_steps} "
                  "env steps is what the run continues from)", file=sys.stderr)

    def record_resume_changes(self) -> None:
        """The settings this resume changed against those its checkpoint was trained with (only those that leave the
        run itself alone get here, e.g. ``total_frames=``): ``config.yaml`` says what trains from now on,
        ``resumes.jsonl`` what changed when. A change that ``config.yaml`` already held (edited by hand) gets a
        ``note:`` line; a record equal to the file's last one (a resume killed before its first checkpoint, resumed
        again) is not written twice."""
        changes = resume_changes(self.cfg, self._trained_with)
        if not changes:
            return
        record = json.dumps({"env_steps": self.counters.env_steps,
                             "changed": {k: {"from": a, "to": b} for k, (a, b) in changes.items()}})
        path = self.run_dir / "resumes.jsonl"
        if path.exists() and path.read_text().splitlines()[-1:] == [record]:
            return
        given = resume_changes(self.cfg)
        for key in (k for k in changes if k not in given):
            print(f"note: resume={self.run_dir}: config.yaml holds {key}={changes[key][1]}, not the "
                  f"{changes[key][0]} its checkpoint was trained with (edited by hand?); applied from "
                  f"{self.counters.env_steps} env steps, recorded in resumes.jsonl", file=sys.stderr)
        with open(path, "a") as f:
            f.write(record + "\n")
        dump_yaml(dataclasses.replace(self.cfg, resume=None), self.run_dir / "config.yaml")

    def sync_acting_policy(self) -> None:
        """Copy the learner policy's weights into the acting policy's CPU copy (a GPU learner's; on CPU the two are
        one module), in place: the collector's workers act with that copy's own tensors (shared memory, see
        :class:`~acer_torchrl.collectors.SharedWeightsScheme`), so they act with these weights from their next
        policy call, and nothing is allocated."""
        if self.acting is not self.agent.policy:
            copy_weights_(TensorDict.from_module(self.acting), TensorDict.from_module(self.agent.policy))

    def checkpoint(self) -> None:
        """Save the run (weights, optimiser, replay, counters) and its learning curve. Evaluations still being played
        are not waited for: the checkpoint keeps them (:meth:`unfinished_evaluations`) and a resume asks for them
        again, so that ``metrics.csv`` holds every evaluation up to the checkpoint's step once they are played. (A
        stop that waited ran past its grace on a GPU learner: its Atari evaluations, asked every ~15 s, took longer.)"""
        if self.evaluator is not None:
            self.log_evaluations(self.evaluator.results())
        self.counters.rng = self.rng.bit_generator.state
        self.counters.health = self.health.state()
        save_checkpoint(self.run_dir, self.state(), vars(self.counters), self.replay)
        self._saved_steps = self.counters.env_steps
        self.log.flush()
        if self.log.rows:  # at checkpoints, not at every evaluation: a plot costs a good part of a checkpoint
            title = f"{self.cfg.loss} on {self.cfg.env.name}"
            save_learning_curve(self.log, self.run_dir / "learning_curve.png", title)

    # ------------------------------------------------------------------ learning
    def draws_ahead(self) -> bool:
        """Whether :meth:`planned_batches` draws the next batch during the update in hand (``replay.prefetch``): not
        when a draw reads what that update changes: the network (``replay.recurrent_state=refresh`` of a recurrent
        agent: the next batch's start states come from its weights) or the priorities (``replay.prioritized``: the
        agent's ``after_update`` writes the drawn windows' new ones), nor from a replay other than this run's own
        :class:`EpisodeReplay` (a sweep's shared replay: its draws are calls to the replay's server)."""
        cfg = self.cfg.replay
        reads_the_update = (self.agent.recurrent and cfg.recurrent_state == "refresh") or cfg.prioritized
        return cfg.prefetch and not reads_the_update and isinstance(self.replay, EpisodeReplay)

    def planned_batches(self, shares: list[float]) -> Iterator[TensorDictBase]:
        """The batches of an update plan (:meth:`draw_batch` for each share; none while the replay is too small).

        With :meth:`draws_ahead`, the next batch is drawn on the ``draw-ahead`` thread while the caller updates with
        the one in hand. The draws are the same: one at a time, in the plan's order (the replay's generator is
        consumed as without it), between the store of the collected batch and the end of the plan, when nothing
        writes what a draw reads (an update changes the network and the optimiser; V-RACER's ``after_update``
        writes its estimates beside the replay, read by ``before_update`` on this thread). Close the iterator
        (``contextlib.closing``): a draw still running is waited for, so that none outlives the plan's step."""
        if self._drawer is None:
            yield from (sample for sample in map(self.draw_batch, shares) if sample is not None)
            return
        pending: tuple[concurrent.futures.Future, float] | None = None  # the draw asked of the thread, its share
        try:
            for share in [*shares, None]:
                sample = self._drawn(*pending) if pending is not None else None
                pending = (self._drawer.submit(self.draw_batch, share), share) if share is not None else None
                if sample is not None:
                    yield sample
        finally:
            if pending is not None and not pending[0].cancel():
                concurrent.futures.wait([pending[0]])

    def _drawn(self, draw: concurrent.futures.Future, share: float) -> TensorDictBase | None:
        """The batch of a draw asked of the ``draw-ahead`` thread: its result (waiting for its end), or drawn on this
        thread when that one has not begun it (no core was free for it during the update)."""
        return self.draw_batch(share) if draw.cancel() else draw.result()

    def draw_batch(self, online_share: float) -> TensorDictBase | None:
        """A batch holding ``online_share`` of the freshest collected windows, the rest from replay."""
        cfg = self.cfg.replay
        seq_len = cfg.seq_len
        if online_share >= 1.0:
            return self.online.latest
        n_online = fresh_windows(online_share, cfg.batch_size)
        if len(self.replay) < max(cfg.min_size, 1):
            return None
        parts = []
        if n_online:
            parts.append(self.online.take(n_online).to(self.device))
        if seq_len == 1 and not n_online and not cfg.prioritized:  # (single steps are drawn uniformly)
            return self.replay.sample_steps(cfg.batch_size, self.loss.in_keys)
        replayed = self.replay.sample_sequences(cfg.batch_size - n_online, seq_len, self.loss.in_keys, self.device)
        if self.agent.recurrent:
            if cfg.recurrent_state == "refresh":
                with set_recurrent_mode(True):
                    self.replay.refresh_recurrent_state(replayed, self.agent.unroll, self.agent.hidden_keys)
            elif cfg.recurrent_state == "zero":
                self.replay.zero_recurrent_state(replayed, self.agent.hidden_keys)
        parts.append(replayed)
        if len(parts) == 1:
            return parts[0]
        if PRIORITY_WEIGHT_KEY in replayed.keys():  # the fresh windows: weight 1, no priority to update
            parts[0] = unprioritized(parts[0])
        keys = set(parts[0].keys(True, True)) & set(parts[1].keys(True, True))
        return torch.cat([p.select(*keys) for p in parts], 0)

    def update(self, batch: TensorDictBase) -> dict[str, float]:
        batch = self.agent.before_update(batch, self.replay)
        self.loss.at_env_steps(self.counters.env_steps)
        if batch.device != self.device:  # a CPU batch for a CUDA learner (a copy per key even when already there)
            batch = batch.to(self.device)
        with set_recurrent_mode(True):
            out = self.loss.forward_backward(batch, self.params)  # the gradients set, not added to the last ones
        finite = torch.isfinite(objective(out))
        if PRIORITY_KEY in out.keys():  # a NaN priority would poison the replay's sum tree: every later draw
            finite = finite & torch.isfinite(out.get(PRIORITY_KEY)).all()
        if not finite:  # (one sync for both)
            bad = [k for k, v in out.items()
                   if (k.startswith("loss_") or k == PRIORITY_KEY) and not torch.isfinite(v).all()]
            raise TrainingError(
                f"non-finite loss at update {self.counters.updates} ({', '.join(bad)}); lower optim.lr or check "
                "the importance weights (behaviour statistics) in the collected data"
            )
        grad_norm = self.clip_gradients()
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate()
        self.direct_step.step()
        for updater in self.agent.updaters:
            updater.step()
        self.counters.updates += 1
        self.agent.after_update(batch, out, self.replay)
        names = [k for k, v in out.items() if v.numel() >= 1 and k != PRIORITY_KEY]  # priorities: per window
        # a loss may report a statistic computed on the replay's device (V-RACER's far share: CPU)
        means = [v if v.ndim == 0 else v.mean() for v in (out.get(k).detach() for k in names)]
        weight = batch.get(PRIORITY_WEIGHT_KEY, None)  # a prioritized replay's draws: how far from uniform they are
        if weight is not None:
            names += ["priority_weight_mean", "priority_weight_min"]
            means += [weight.float().mean(), weight.float().min()]
        means = [m.to(grad_norm.device) for m in means] if self.device.type != "cpu" else means
        stats = dict(zip([*names, "grad_norm"], torch.stack([*means, grad_norm.detach()]).float().tolist()))  # one sync
        self.watch_health(stats)
        return stats

    @torch.no_grad()
    def clip_gradients(self) -> torch.Tensor:
        """Clip the gradients' global norm at ``optim.max_grad_norm`` (``inf``: no clipping); returns the norm before
        clipping (logged)."""
        return self.direct_step.clip(self.cfg.optim.max_grad_norm)

    def fill_replay(self, steps: int, batches: Iterator[TensorDictBase] | None = None) -> None:
        """Store collected batches until the replay holds at least ``steps`` env steps, taking no update: a filled
        replay for timing updates (``benchmarks/learner.py update``) or comparing devices. From ``batches`` when
        given (the caller's collector, left open), else from a collector in this process, shut down after."""
        if batches is not None:
            while len(self.replay) < steps:
                self.store(next(batches))
            return
        collector = self.make_collector(10**12)
        try:
            self.fill_replay(steps, iter(collector))
        finally:
            collector.shutdown()

    def store(self, batch: TensorDictBase) -> TensorDictBase:
        """A collected batch, preprocessed by the loss, into the replay (without the policy's activations) and
        the online windows; returns it preprocessed."""
        batch = self.loss.preprocess(batch)
        self.replay.extend(batch.exclude(*self.agent.activation_keys))
        self.agent.after_extend(self.replay)
        self.online.push(batch)
        return batch

    def learning_rate(self) -> float:
        """The optimiser's step size for the next update: ``optim.lr`` x the run's schedule x the loss's own
        annealing (ReF-ER eq. 13)."""
        return self.cfg.optim.lr * self.lr_schedule() * self.loss.lr_scale()

    def lr_schedule(self) -> float:
        """``optim.lr``'s factor at this point of the run: linear from 1 to ``optim.lr_end_factor``."""
        progress = min(self.counters.env_steps / self.cfg.total_frames, 1.0)
        return 1.0 - (1.0 - self.cfg.optim.lr_end_factor) * progress

    def watch_health(self, stats: dict[str, float], row: bool = False, dead_layer: str | None = None) -> None:
        """Hand an update's statistics (``row``: a metrics row's, ``dead_layer`` naming the layer behind its
        ``dead_unit_share``) to the divergence watch; its warning (once) or notes go to stderr."""
        if row:
            warning = self.health.observe_row(stats, self.counters.updates, self.counters.env_steps, dead_layer)
        else:
            warning = self.health.observe(stats, self.counters.updates, self.counters.env_steps)
        if warning is not None:
            tqdm.write(warning, file=sys.stderr)

    def liveness(self, batch: TensorDictBase, on: dict[str, torch.Tensor]) -> tuple[dict[str, float], str | None]:
        """A metrics row's liveness statistics (``acer_torchrl.health``) and the layer behind the first: the largest
        share of a ReLU layer's units off on every state of the batch's updates (``on``: their
        :meth:`~acer_torchrl.health.ReLUActivity.watching` record), and for a Gaussian policy the share of its mean's
        entries, as it acted in ``batch``, outside the action bounds."""
        stats, layer = {}, None
        if (dead := most_dead_layer(on)) is not None:
            name, off, units = dead
            stats["dead_unit_share"], layer = off / units, f"{name}: {off}/{units}"
        loc = batch.get((BEHAVIOUR, "loc"), None)
        if loc is not None and self.info.action_low is not None:
            low, high = (torch.tensor(b, dtype=loc.dtype, device=loc.device)
                         for b in (self.info.action_low, self.info.action_high))
            stats["mean_outside_bounds"] = float(((loc < low) | (loc > high)).float().mean())
        return stats, layer

    # ----------------------------------------------------- the whole run (RunGuard drives the step API)
    def train(self) -> dict:
        """The whole run (or what is left of it), driven through the step API below by a
        :class:`~acer_torchrl.processes.RunGuard` without stop signals (under SLURM it still holds submitit's
        requeue until the batch in hand is done); returns its summary."""
        return RunGuard().train(self)

    def finished_summary(self) -> dict | None:
        """A resumed run that had already finished: its ``summary.json`` untouched, marked ``already_finished``
        (with the ``total_frames`` asked for); None when there are steps left to take, or no readable summary
        (:meth:`finish` then writes it from the checkpoint)."""
        summary = read_summary(self.run_dir / "summary.json")
        if not (self.cfg.resume and self.counters.env_steps >= self.cfg.total_frames and summary is not None):
            return None
        # run_dir: where it is now (a copy, to branch it, holds its original's summary.json)
        return {**summary, "already_finished": True, "total_frames": self.cfg.total_frames,
                "run_dir": str(self.run_dir)}

    def stop_early(self) -> str | None:
        """Stop before ``total_frames`` (a stop signal): the collector shut down, the steps taken since the latest
        checkpoint saved; returns where the run stopped and how to continue, None when it has nothing saved yet."""
        self.stop_collecting(timeout_s=2.0)  # a stopping run's workers have nothing to finish
        c = self.counters
        if c.env_steps and c.env_steps != self._saved_steps:
            self.checkpoint()
        if self.evaluator is not None:
            self.evaluator.close(wait_s=1.0)  # nothing left for it to do
            self.evaluator = None
        if self._saved_steps is None:
            return None
        resume = shell_command(f"recipes/{self.cfg.loss}.py", f"resume={self.run_dir}")
        return f"at {c.env_steps} env steps; continue with: {resume}"

    # ----------------------------------------------------- the step API (RunGuard, or a driver of several runs)
    def start(self) -> Iterator[TensorDictBase]:
        """Open the run for stepping: the greedy evaluator, a collector for the steps still to take, the clock.
        Returns the collector's batches (none when the run is complete): hand each to :meth:`step` until it
        returns True, then :meth:`stop_collecting`, :meth:`finish` (final evaluation, summary) and, in any
        case, :meth:`close` (:class:`~acer_torchrl.processes.RunGuard` does). A shared-replay sweep drives its agents'
        trainers this way, a batch each in turn."""
        remaining = self.cfg.total_frames - self.counters.env_steps
        self.evaluator = self.make_evaluator()
        now = self.evaluation_settings()
        for e in self._asked_again:  # the checkpoint's unfinished evaluations, on their weights and seeds
            steps = e["env_steps"]  # their rows say what they are played with now (eval.* may change on resume)
            self._awaiting.append((steps, e["updates"], e["wall_time_s"], e["metrics"], now))
            self.evaluator.submit(steps, evaluation_seed(self.cfg.seed, steps), weights=e["weights"])
        changed = [str(e["env_steps"]) for e in self._asked_again if e.get("settings", now) != now]
        if changed:  # which rows play the new settings hangs on how far behind the evaluations were: said once
            print(f"note: the evaluations asked at {', '.join(changed)} env steps with other eval settings were still "
                  f"being played at the checkpoint; they are played again with this resume's "
                  f"{', '.join(f'{k}={v}' for k, v in now.items())}, as their rows record", file=sys.stderr)
        self._asked_again = []
        self._collector = self.make_collector(remaining) if remaining > 0 else None
        self._start_clock()
        self._last_batch = None
        return self._collected(iter(self._collector)) if self._collector is not None else iter(())

    def _collected(self, batches: Iterator[TensorDictBase]) -> Iterator[TensorDictBase]:
        """The collector's batches, kept in hand. A policy that cannot act because its outputs are not finite (the
        weights overflowed, e.g. at a huge ``optim.lr``: the batch's behaviour log-probabilities are not, see
        :class:`~acer_torchrl.modules.BehaviourSampler`) ends the run with one line (:class:`TrainingError`), as does
        a worker's death while it is so (:class:`~acer_torchrl.processes.HelperDied` would propose a resume that
        fails the same way)."""
        try:
            for self._last_batch in batches:
                if not bool(torch.isfinite(self._last_batch.get((BEHAVIOUR, "log_prob"))).all()):
                    raise self._diverged()
                yield self._last_batch
        except HelperDied:
            if self._acts_finitely():
                raise
            raise self._diverged() from None

    def _diverged(self) -> TrainingError:
        return TrainingError(f"the acting policy's outputs are not finite after update {self.counters.updates} (the "
                             "network diverged); lower optim.lr and start a new run")

    @torch.no_grad()
    def _acts_finitely(self) -> bool:
        """Whether the acting policy's outputs on the last collected batch's first steps are finite (True with no
        batch in hand: nothing to tell)."""
        if self._last_batch is None:
            return True
        steps = self._last_batch.reshape(-1)[:4].select(*self.acting.in_keys, strict=False).clone()
        out = self.acting(steps)
        return all(bool(torch.isfinite(v).all()) for v in out.values(True, True) if v.is_floating_point())

    def stop_collecting(self, timeout_s: float | None = None) -> None:
        """Stop the clock and shut the collector down (the evaluator stays open for :meth:`finish`); its
        workers are killed after ``timeout_s`` (TorchRL's default: 10 s)."""
        if self._bar is not None:
            self._stop_clock()
        if self._collector is not None:
            with contextlib.suppress(Exception):
                self._collector.shutdown(timeout=timeout_s)
            self._collector = None

    def close(self) -> None:
        """Release what :meth:`start` opened (collector, evaluator) and the run directory's lock; safe to call
        more than once."""
        self.stop_collecting()
        if self.evaluator is not None:
            self.evaluator.close()
            self.evaluator = None
        if self._drawer is not None:
            self._drawer.shutdown()  # idle: step() waits for every draw it asked for
        self._run_lock.close()

    def make_evaluator(self) -> BackgroundEvaluator | InlineEvaluator:
        """Where this run's greedy evaluations are played (``eval.background``: a process beside the learner); each
        evaluation seeds the env itself (:meth:`ask_evaluation`)."""
        cfg = self.cfg
        env_cfg = evaluation_env_config(cfg.env, games=cfg.eval.episodes)
        env_fn = make_env_fn(env_cfg, extra_transforms=self.agent.env_transforms)
        kind = BackgroundEvaluator if cfg.eval.background else InlineEvaluator
        return kind(self.acting, env_fn, cfg.eval.max_steps)

    def ask_evaluation(self, metrics: dict[str, float]) -> None:
        """A greedy evaluation of the current acting policy, from a seed of the run's seed and the env step (the
        same games in a resumed run); its row (``metrics`` and the evaluation's return) is logged when the result
        is in (:meth:`log_evaluations`)."""
        c = self.counters
        self._awaiting.append((c.env_steps, c.updates, c.wall_time_s, metrics, self.evaluation_settings()))
        with self._named_on_bar(self.evaluator.blocking):
            self.evaluator.submit(c.env_steps, evaluation_seed(self.cfg.seed, c.env_steps))
        # (not while the evaluation process starts: none came back yet)
        if len(self._awaiting) >= EVALUATIONS_BEHIND and self._one_came_back and not self._said_behind:
            self._said_behind = True
            print(f"note: {len(self._awaiting)} greedy evaluations are waiting for the evaluation process at "
                  f"{c.env_steps} env steps (it plays them slower than the learner asks, one each eval.interval="
                  f"{self.cfg.eval.interval} steps): their rows come late, the last ones at the end of the run; raise "
                  "eval.interval", file=sys.stderr, flush=True)

    def evaluation_settings(self) -> dict[str, int]:
        """What an evaluation asked now plays, logged in its row: ``eval.episodes`` games of at most ``eval.max_steps``
        steps. A resume may change them (``APPLIED_ON_RESUME``); summary.json says which the final score's
        evaluations played (:func:`~acer_torchrl.metrics.window_settings`)."""
        return {"eval_episodes": self.cfg.eval.episodes, "eval_max_steps": self.cfg.eval.max_steps}

    def wait_for_evaluations(self) -> None:
        """Log every evaluation asked for, waiting for those still being played."""
        with self._named_on_bar(bool(self._awaiting)):
            self.log_evaluations(self.evaluator.drain())

    @contextlib.contextmanager
    def _named_on_bar(self, waiting: bool):
        """The progress bar says an evaluation holds the learner up while it does: the one at 100 % (the final
        score's last) comes after the bar is full and takes minutes on Atari."""
        bar = self._bar
        if not waiting or bar is None:
            yield
            return
        bar.set_description_str(f"greedy evaluation ({self.cfg.eval.episodes} episodes)")
        try:
            yield
        finally:
            bar.set_description_str("")

    def log_evaluations(self, results) -> None:
        """Log the rows of finished evaluations (in the order they were asked for); with ``log.progress`` and no
        terminal to draw the progress bar on (a SLURM log, a redirect), each is also one line on stderr."""
        for env_steps, mean, std, cut in results:
            self._one_came_back = True
            steps, updates, wall, metrics, settings = self._awaiting.popleft()
            assert steps == env_steps, (steps, env_steps)
            evaluation = {"eval_return_mean": mean, "eval_return_std": std, "eval_games_cut": cut, **settings}
            self.log.row(steps, updates, wall, {**metrics, **evaluation})
            warning = self.health.observe_evaluation(mean, steps)
            if warning is not None:
                tqdm.write(warning, file=sys.stderr)
            if cut and not self._said_games_cut:
                self._said_games_cut = True
                print(f"note: {cut} of the {settings['eval_episodes']} greedy games of the evaluation at {steps} env steps "
                      f"were still running after eval.max_steps={settings['eval_max_steps']} steps; their returns so "
                      "far count (metrics.csv: eval_games_cut); raise eval.max_steps to the env's own step limit",
                      file=sys.stderr, flush=True)
            if self.cfg.log.progress and not sys.stderr.isatty():
                print(self.evaluation_line(), file=sys.stderr, flush=True)

    def evaluation_line(self) -> str:
        """The latest evaluation's row as a log line: env steps, greedy return, env steps/s since the row before."""
        *_, before, row = [{"env_steps": 0, "wall_time_s": 0.0}, *self.log.rows]
        rate = (row["env_steps"] - before["env_steps"]) / max(row["wall_time_s"] - before["wall_time_s"], 1e-9)
        return (f"{self.run_dir.name}: {row['env_steps']}/{self.cfg.total_frames} env steps, greedy return "
                f"{row['eval_return_mean']:.1f}, {rate:.0f} env steps/s")

    def finish(self) -> dict:
        """Final greedy evaluation (the periodic one when it fell on the last step), log row, checkpoint (with the
        learning curve) and summary.json."""
        cfg, c = self.cfg, self.counters
        self.wait_for_evaluations()
        last = self.log.rows[-1] if self.log.rows else {}
        if last.get("env_steps") != c.env_steps or "eval_return_mean" not in last:
            if cfg.log.progress:
                print(f"final greedy evaluation ({cfg.eval.episodes} episodes)...", file=sys.stderr, flush=True)
            self.ask_evaluation({})
            self.wait_for_evaluations()
        self.checkpoint()
        steps, returns = self.log.series("eval_return_mean")
        score = final_score(list(zip(steps, returns)), c.env_steps)
        summary = {
            "algorithm": cfg.loss,
            "env": cfg.env.name,
            "preset": cfg.preset,
            "seed": cfg.seed,
            "env_steps": c.env_steps,
            "updates": c.updates,
            "episodes": c.episodes,
            # the final score (metrics.final_score): mean greedy return over the last 10 % of the env steps
            "eval_return_mean": score.mean,
            "eval_return_std": score.std,
            "final_score_evaluations": score.evaluations,
            "final_score_from_step": score.from_step,
            "eval_return_last": score.last,
            # the final score's evaluations' eval.episodes and eval.max_steps (a list where a resume changed them)
            **window_settings(self.log.rows, score.from_step, self.evaluation_settings()),
            "final_score_games_cut": window_games_cut(self.log.rows, score.from_step),
            "wall_time_s": round(c.wall_time_s, 2),
            "env_steps_per_s": round(c.env_steps / max(c.wall_time_s, 1e-9), 1),
            # the learner process's CPU seconds per wall second: ~1 (or more, with threads) when the learner is
            # what the run waits on; well below 1 when it waits for collected batches
            "learner_cpu_per_wall_s": round(c.learner_cpu_s / max(c.wall_time_s, 1e-9), 3),
            "collector_dropped_steps": self.replay.steps_missing,
            "restarts": c.restarts,
            # ok, diverged at its first bad update, or a greedy evaluation not finite (acer_torchrl.health)
            "health": self.health.summary(),
            # the code and machines of the run's segments (provenance.jsonl: each one's packages too) and its dates
            **summarize(contributing(records := segments(self.run_dir))), **started_from(records),
            "run_dir": str(self.run_dir),
        }
        path = self.run_dir / "summary.json"
        try:
            write_summary(path, summary)
        except OSError as err:
            raise TrainingError(f"cannot write {path} ({os_reason(err)}); the checkpoint holds the finished run: "
                                f"resume={self.run_dir} writes its summary once the disk has room") from None
        return summary

    def make_collector(self, remaining: int):
        """This run's collector for ``remaining`` steps: ``collector.workers`` processes (in-process when 0),
        or the job's collector ranks on other nodes when it has them (``remote``). ``remaining`` is rounded up to
        whole batches, as TorchRL would round it (with a warning in every run)."""
        cfg, c = self.cfg, self.counters
        remaining = math.ceil(remaining / cfg.collector.frames_per_batch) * cfg.collector.frames_per_batch
        workers = self.remote.ranks if self.remote else cfg.collector.workers
        env_fns = [
            make_env_fn(cfg.env, seed=cfg.seed + 1_000 * (i + 1) + 97 * c.restarts, extra_transforms=self.agent.env_transforms)
            for i in range(max(workers, 1))
        ]
        if self.remote:
            return make_remote_collector(env_fns, self.acting, self.remote, frames_per_batch=cfg.collector.frames_per_batch,
                                         total_frames=remaining, seed=cfg.seed + c.restarts)
        return make_collector(
            env_fns if workers else env_fns[0],
            self.acting,
            num_workers=workers,
            frames_per_batch=cfg.collector.frames_per_batch,
            total_frames=remaining,
            seed=cfg.seed + c.restarts,
        )

    def _start_clock(self) -> None:
        """Start the wall clock and progress bar of a collection phase (before :meth:`step`)."""
        c = self.counters
        # on a terminal only (tqdm's disable=None): in a log file its redraws pile up as carriage returns
        self._bar = tqdm(total=self.cfg.total_frames, initial=c.env_steps, unit="step",
                         disable=None if self.cfg.log.progress else True)
        self._start = time.perf_counter() - c.wall_time_s
        self._cpu_start = time.process_time() - c.learner_cpu_s

    def _stop_clock(self) -> None:
        self._bar.close()
        self._bar = None
        self._read_clock()

    def _read_clock(self) -> None:
        """The phase's wall and learner-CPU seconds so far into the counters."""
        self.counters.wall_time_s = time.perf_counter() - self._start
        self.counters.learner_cpu_s = time.process_time() - self._cpu_start

    def step(self, batch: TensorDictBase) -> bool:
        """One collected batch: store it, take the loss's planned updates, push the weights to the collector,
        evaluate / log when due (the periodic checkpoint is the driver's: :meth:`checkpoint_due`). Returns True once
        ``total_frames`` steps were collected."""
        cfg, c = self.cfg, self.counters
        window, returns = self._window, self._returns
        self.log_evaluations(self.evaluator.results())
        batch = self.store(batch)
        self.health.see_rewards(float(batch.get(("next", "reward")).abs().max()))
        steps = batch.numel()
        c.env_steps += steps
        done = batch.get(("next", "done"))
        returns += batch.get(("next", "episode_reward"))[done].tolist()
        c.episodes += int(done.sum())
        row_due = c.env_steps >= c.next_eval or self._final_window_due(c.env_steps - steps, c.env_steps)
        watch = self.activity.watching() if row_due else contextlib.nullcontext({})  # a row's updates: their ReLUs
        with watch as on, contextlib.closing(self.planned_batches(self.loss.update_plan(self.rng))) as samples:
            for sample in samples:
                for key, value in self.update(sample).items():
                    window.setdefault(key, []).append(value)
        self.sync_acting_policy()
        self._collector.update_policy_weights_()
        self._read_clock()
        self._bar.update(steps)
        if returns:
            self._bar.set_postfix(ret=f"{np.mean(returns):.1f}", upd=c.updates)
        if row_due:
            c.next_eval = next_periodic_evaluation(c.next_eval, c.env_steps, cfg.eval.interval)
            # the means of the updates' statistics since the last row, taken once a row: after every batch they cost
            # 14 means over up to an interval's updates, a measurable share of V-RACER's MuJoCo preset's run
            metrics = {k: float(np.mean(v)) for k, v in window.items()}
            if returns:
                metrics["train_return"] = float(np.mean(returns))
            metrics["replay_steps"] = len(self.replay)
            # the replay's episode-length mix and the step size: what a late collapse is read against
            metrics["replay_mean_episode_steps"] = len(self.replay) / max(self.replay.num_episodes, 1)
            metrics["lr"] = self.optimizer.param_groups[0]["lr"]
            metrics["collector_dropped_steps"] = self.replay.steps_missing  # not in env_steps (see replay.py)
            metrics["reward_abs_max"] = self.health.reward_max  # the value bound's max|r| (acer_torchrl.health)
            alive, dead_layer = self.liveness(batch, on)
            metrics.update(alive)
            self.watch_health(metrics, row=True, dead_layer=dead_layer)
            self.ask_evaluation(metrics)
            window.clear()
            returns.clear()
        if c.env_steps >= cfg.total_frames:
            self.wait_for_evaluations()  # the last ones, while the progress bar still shows
            return True
        return False

    def periodic_checkpoint(self) -> None:
        """The checkpoint every ``log.checkpoint_interval`` env steps (:meth:`checkpoint_due` says when), the next one
        scheduled."""
        c, interval = self.counters, self.cfg.log.checkpoint_interval
        self.checkpoint()
        c.next_checkpoint += interval * max(1, math.ceil((c.env_steps - c.next_checkpoint + 1) / interval))

    def checkpoint_due(self) -> bool:
        """Whether to checkpoint after this batch (:meth:`periodic_checkpoint`): once ``log.checkpoint_interval``
        steps are due (evaluations still being played go into the checkpoint: :meth:`checkpoint`)."""
        return self.counters.env_steps >= self.counters.next_checkpoint

    def _final_window_due(self, before: int, after: int) -> bool:
        """Whether this batch crossed one of the final-score window's evaluation points (:func:`final_window_steps`)
        of the run's end: ``total_frames`` rounded up to whole batches from this one's start, as the collector does."""
        per_batch = self.cfg.collector.frames_per_batch
        end = run_end(before, self.cfg.total_frames, per_batch)
        return any(before < step <= after for step in final_window_steps(end, per_batch))


def run_end(start: int, total_frames: int, per_batch: int) -> int:
    """Where a run collecting from ``start`` env steps ends: ``total_frames`` rounded up to whole batches of
    ``per_batch`` from there, as the collector rounds it."""
    return start + math.ceil((total_frames - start) / per_batch) * per_batch


def next_periodic_evaluation(next_eval: int, env_steps: int, interval: int) -> int:
    """The periodic evaluation to come after a row at ``env_steps``: past ``env_steps`` by whole intervals when the row
    was the periodic one (``env_steps >= next_eval``), ``next_eval`` itself when the row was a final-window point's
    alone, so that the periodic evaluation after it still comes (moved on, it was lost from the final score)."""
    if env_steps < next_eval:
        return next_eval
    return next_eval + interval * math.ceil((env_steps - next_eval + 1) / interval)


def train(cfg: Config, stop_signals: StopSignals | None = None, remote: RemoteCollection | None = None) -> dict:
    """Run (or resume) one training run described by ``cfg``; returns its summary. With ``stop_signals``
    (installed), SIGINT / SIGTERM end it with a checkpoint and :class:`~acer_torchrl.processes.Interrupted`
    (:class:`~acer_torchrl.processes.RunGuard`); with ``remote``, the collectors are processes on other nodes (see
    :class:`~acer_torchrl.collectors.RemoteCollection`)."""
    return RunGuard(stop_signals).train(Trainer(cfg, remote))
