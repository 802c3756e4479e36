"""Config: presets, typed overrides, one-line errors, YAML round trip, the CLI's error path."""

import contextlib
import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from acer_torchrl.config import ConfigError, dump_yaml, from_dict, load_config, to_dict
from acer_torchrl.settings import REGISTRY

ROOT = Path(__file__).resolve().parents[1]


def test_overrides_are_typed_and_nested():
    cfg = load_config("acer", ["seed=3", "total_frames=1e4", "optim.lr=3e-4", "network.hidden=64,32",
                               "log.progress=false", "env.name=Acrobot-v1", "run_dir=/tmp/x"])
    assert cfg.seed == 3 and cfg.total_frames == 10_000 and isinstance(cfg.total_frames, int)
    assert cfg.optim.lr == 3e-4 and cfg.network.hidden == [64, 32] and cfg.log.progress is False
    assert cfg.env.name == "Acrobot-v1" and cfg.run_dir == "/tmp/x"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("optim.lrr=1", "unknown config key 'optim.lrr'; did you mean optim.lr"),
        ("seed=abc", "config key 'seed' expects int"),
        ("log.progress=maybe", "config key 'log.progress' expects bool"),
        ("total_frames=2.5", "config key 'total_frames' expects int"),
        ("replay=3", "is a section"),
        ("preset=nope", "unknown preset 'nope' for loss=acer"),
        ("loss=dqn", "unknown loss 'dqn'"),
        ("gamma=1.5", "gamma must be in (0, 1]"),
        ("seed", "expected key=value"),
        ("reactor.tau=3", "belongs to loss=reactor but this run uses loss=acer"),
        ("threads=-1", "threads must be in [0, 1024], got -1"),
    ],
)
def test_bad_values_raise_one_clear_line(override, fragment):
    with pytest.raises(ConfigError) as err:
        load_config("acer", [override])
    message = str(err.value)
    assert fragment in message and "\n" not in message


def test_a_key_given_twice_counts_once_the_last_and_is_said():
    from acer_torchrl.config import repeated_settings

    overrides = ["optim.lr=1e-3", "seed=1", "optim.lr = 1e-4", "optim.lr=2e-4"]
    assert load_config("acer", overrides).optim.lr == 2e-4
    assert repeated_settings(overrides) == ["note: optim.lr is given 3 times (1e-3, 1e-4, 2e-4); the last, "
                                            "optim.lr=2e-4, counts"]
    assert repeated_settings(["optim.lr=1e-3", "seed=1"]) == []


def test_learner_threads_leave_the_collector_workers_their_cores(monkeypatch):
    from acer_torchrl.trainer import learner_threads

    monkeypatch.setattr("acer_torchrl.trainer.available_cores", lambda: 8)
    assert learner_threads(load_config("acer", ["collector.workers=2"])) == 6
    assert learner_threads(load_config("acer", ["collector.workers=8"])) == 1
    assert learner_threads(load_config("acer", ["collector.workers=8", "threads=3"])) == 3


def test_cores_are_slurms_share_inside_a_job_else_the_affinity(monkeypatch):
    from acer_torchrl.trainer import available_cores

    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 3, 5})
    assert available_cores() == 3
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
    assert available_cores() == 2


def test_auto_device_takes_the_gpu_of_the_tasks_local_rank(monkeypatch):
    from acer_torchrl.trainer import resolve_device

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.setenv("SLURM_LOCALID", "3")
    assert resolve_device("auto") == torch.device("cuda", 1)
    monkeypatch.delenv("SLURM_LOCALID")
    assert resolve_device("auto") == torch.device("cuda", 0)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")


def test_yaml_round_trip(tmp_path):
    cfg = load_config("acer", ["seed=7", "replay.seq_len=11", "network.lstm=true"])
    dump_yaml(cfg, tmp_path / "config.yaml")
    import yaml

    again = from_dict(yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert to_dict(again) == to_dict(cfg)


def test_resume_of_a_directory_without_run_says_so(tmp_path):
    with pytest.raises(ConfigError, match="no config.yaml there"):
        load_config("acer", [f"resume={tmp_path}"])


@pytest.mark.integration
@pytest.mark.parametrize("override, start", [
    ("optim.lrr=1", "error: unknown config key 'optim.lrr'; did you mean optim.lr"),
    ("acer.replay_ration=4", "error: unknown config key 'acer.replay_ration'; did you mean acer.replay_ratio"),
])
def test_cli_prints_one_line_and_exits_2_without_traceback(override, start):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "recipes" / "acer.py"), override],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start)
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("algo, key, value, read", [
    ("acer", "acer.delta", 0.7, lambda loss: loss.delta),
    ("acer", "acer.on_policy", False, lambda loss: loss.on_policy),
    ("laser", "laser.kl_threshold", 0.3, lambda loss: loss.kl_threshold),
    ("reactor", "reactor.lam", 0.7, lambda loss: loss.lam),
    ("vracer", "vracer.D", 0.07, lambda loss: loss.refer.D),
])
def test_build_hands_each_config_option_to_the_loss(tmp_path, algo, key, value, read):
    """``build`` passes a loss its options by name (``algorithms.loss_options``), without listing them."""
    from acer_torchrl.envs import env_info
    from acer_torchrl.settings import get_algorithm

    cfg = load_config(algo, [f"{key}={value}", f"run_dir={tmp_path}"])
    loss = get_algorithm(algo).build(cfg, env_info(cfg.env)).loss
    assert read(loss) == value


def fields_build_reads(algo, env_name, run_dir, monkeypatch):
    """The fields of ``cfg.algo`` that ``algo``'s ``build`` reads on ``env_name`` (those ``loss_options`` reads
    left out), and the loss it builds."""
    from acer_torchrl.settings import get_algorithm
    from acer_torchrl.envs import env_info

    algorithm = get_algorithm(algo)
    # the algorithm's preset for this env where it has one (ACER's default cartpole preset has a target network, which
    # continuous actions refuse), else its default preset
    preset = next((f"preset={n}" for n, p in algorithm.presets.items() if p.get("env.name") == env_name), None)
    cfg = load_config(algo, [*filter(None, [preset]), f"env.name={env_name}", f"run_dir={run_dir}"])
    names, reads, plain = [f.name for f in dataclasses.fields(cfg.algo)], set(), cfg.algo

    class Recorded(algorithm.config_cls):
        def __getattribute__(self, name):
            reads.add(name)
            return super().__getattribute__(name)

    cfg.algo = Recorded(**{name: getattr(plain, name) for name in names})
    module = importlib.import_module(algorithm.builder.rpartition(".")[0])
    options = module.loss_options
    monkeypatch.setattr(module, "loss_options", lambda section, *args, **given: options(plain, *args, **given))
    loss = algorithm.build(cfg, env_info(cfg.env)).loss
    monkeypatch.undo()
    return reads.intersection(names), loss


@pytest.mark.parametrize("algo", sorted(REGISTRY))
def test_every_field_of_the_section_reaches_the_loss_or_build(tmp_path, monkeypatch, algo):
    """Each field of ``<algo>.*`` is an argument of the loss or one of ``build_reads``, and ``build`` itself reads
    exactly ``build_reads`` (recorded during builds on a discrete and a continuous env, those the algorithm takes,
    the reads of ``loss_options`` left out): a field nothing reads, or one ``build`` reads undeclared, fails here."""
    from acer_torchrl.algorithms import unread_fields
    from acer_torchrl.settings import get_algorithm

    algorithm = get_algorithm(algo)
    built = []
    for name in ("CartPole-v1", "InvertedPendulum-v5"):
        with contextlib.suppress(ConfigError):  # an action space the algorithm does not take
            built.append(fields_build_reads(algo, name, tmp_path / name, monkeypatch))
    assert built and set().union(*(reads for reads, _ in built)) == set(algorithm.build_reads)
    for _, loss in built:
        assert unread_fields(algorithm.config_cls, type(loss), algorithm.build_reads) == []


def test_loss_options_refuses_a_field_nothing_reads():
    from acer_torchrl.algorithms import loss_options
    from acer_torchrl.objectives.acer import ACERLoss
    from acer_torchrl.settings.acer import BUILD_READS, ACERConfig

    section = dataclasses.make_dataclass("Misspelt", [("replay_ration", float, 4.0)], bases=(ACERConfig,))()
    with pytest.raises(ConfigError, match="Misspelt field.s. replay_ration reach nothing") as err:
        loss_options(section, ACERLoss, BUILD_READS)
    assert "\n" not in str(err.value)
