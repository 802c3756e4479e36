"""``python -m acer_torchrl.rollout <run_dir>``, the tool that plays a saved policy, run as a real process."""

import re
import subprocess
import sys

import pytest
from test_user_errors import ENV, ROOT, TINY, error_line, recipe


def rollout(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "acer_torchrl.rollout", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_rollout_plays_a_runs_checkpoint_greedy_and_sampled(tmp_path):
    """A finished run's checkpoint plays one greedy and one sampled CartPole episode, each a line with its length,
    return, ending and the asked observation's mean, the same lines again with the same seed (a barely trained
    policy's episode may also reach eval.max_steps); a directory that is no run is one line, exit code 2."""
    run_dir = tmp_path / "run"
    assert recipe([*TINY, f"run_dir={run_dir}"], cwd=tmp_path).returncode == 0
    proc = rollout(str(run_dir), "--episodes", "1", "--obs", "2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"{run_dir}: acer on CartPole-v1"
    episode = r"length +(\d+) +return +([\d.]+) +(terminated|truncated|cut at eval.max_steps) +mean obs\[2\] -?[\d.]+"
    for mode, line in zip(("greedy", "sampled"), lines[1:], strict=True):
        match = re.fullmatch(rf" +{mode} +{episode}", line)
        assert match and float(match[2]) == int(match[1]), line  # CartPole: a reward of 1 a step
    assert rollout(str(run_dir), "--episodes", "1", "--obs", "2").stdout == proc.stdout, "the same seed"
    assert "no config.yaml there" in error_line(rollout(str(tmp_path / "nothing")))
