"""Config: presets, typed overrides, one-line errors, YAML round trip, the CLI's error path."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from acer_torchrl.config import ConfigError, dump_yaml, from_dict, load_config, to_dict

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


def test_cli_prints_one_line_and_exits_2_without_traceback():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "recipes" / "acer.py"), "optim.lrr=1"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown config key 'optim.lrr'; did you mean optim.lr")
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
    from acer_torchrl.algorithms import get_algorithm
    from acer_torchrl.envs import env_info

    cfg = load_config(algo, [f"{key}={value}", f"run_dir={tmp_path}"])
    loss = get_algorithm(algo).build(cfg, env_info(cfg.env)).loss
    assert read(loss) == value
