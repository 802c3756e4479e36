"""Shared experience replay across a hyper-parameter sweep (LASER, Schmitt et al. 2020, sec. 5.4-5.5).

N agents with different hyper-parameters (learning rate x entropy cost, sec. 5.1) train concurrently from
scratch. Each writes its experience, tagged with its agent id and carrying its own behaviour statistics
(written by its acting policy), into **one** common :class:`~acer_torchrl.replay.EpisodeReplay`, and every
agent samples uniformly from all of it; LASER's trust region (sec. 4) rejects the steps of behaviours too far
from the learner's policy. Each agent refreshes the recurrent state of what it samples with its *own*
network (App. A.2: "particularly critical when sharing experience between different agents").

Two ways to run a sweep, with the same per-agent :class:`~acer_torchrl.trainer.Trainer` pieces:

* :func:`run_sweep` (one process): the agents' losses and optimisers step in turn in one process, each with
  its own collector; one batch per agent per round, so they run "at identical speed" (sec. 5.1).
* :func:`run_sweep_rank` (one process per agent: ``mode=processes`` on one machine, or one SLURM task per
  agent through :class:`SweepTask`): rank 0 owns the replay storage and serves it with
  ``torch.distributed.rpc`` (TensorPipe); the other ranks ``extend``/``sample`` through remote calls
  (:class:`RemoteReplay`). A gloo process group gathers the results at the end.

Two modules: :mod:`.server` (the replay, its RPC service and each agent's view of it) and :mod:`.sweep` (the
sweep's keys, the per-agent configs, both drivers, the SLURM task and the results); the names below are theirs.

Why an RPC storage server rather than all-gathering new data into a replica on every rank: the sweep must
hold one replay, not N (sec. 5.5: sharing "saves memory"), and agents may run at different speeds across
machines; collectives would force lock-step and N copies. The price is a round trip per call into the replay
(a few per draw: its size, the draw, the recurrent prefix; V-RACER's stored estimates more) and rank 0's RPC threads doing the replay's bookkeeping under a lock.
"""

from acer_torchrl.shared_replay.server import AGENT_KEY, AgentReplay, RemoteReplay, SharedReplay, serve
from acer_torchrl.shared_replay.sweep import (
    SweepAgentTrainer,
    SweepConfig,
    SweepTask,
    agent_configs,
    parse_sweep_args,
    resumed_sweep,
    run,
    run_sweep,
    run_sweep_processes,
    run_sweep_rank,
    sweep_resume_argv,
)

__all__ = [
    "AGENT_KEY", "AgentReplay", "RemoteReplay", "SharedReplay", "serve", "SweepAgentTrainer", "SweepConfig",
    "SweepTask", "agent_configs", "parse_sweep_args",
    "resumed_sweep", "run", "run_sweep", "run_sweep_processes", "run_sweep_rank",
    "sweep_resume_argv",
]
