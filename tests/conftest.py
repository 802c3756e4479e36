import os
import shutil
import subprocess
from pathlib import Path

import pytest

START_CLUSTER = "start one with `bash slurm/local_cluster.sh start`"


def slurm_problem() -> str | None:
    """Why no SLURM cluster is reachable from here, or None when ``sinfo`` lists a partition that is up."""
    if shutil.which("sinfo") is None:
        return "sinfo not found"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%a"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "sinfo timed out"
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return f"sinfo failed: {lines[-1] if lines else f'exit code {out.returncode}'}"
    if "up" not in out.stdout.split():
        return "sinfo lists no partition that is up"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """Tests marked ``slurm`` use this: skip without a cluster, but fail under CI=true (CI starts one)."""
    problem = slurm_problem()
    if problem is None:
        return
    message = f"no SLURM cluster reachable ({problem}); {START_CLUSTER}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def learning(monkeypatch):
    """``benchmarks/learning.py`` as a module (the benchmarks are scripts, not a package)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import learning

    return learning
