"""Bad input as a new user types it: `python recipes/acer.py key=value ...` run as a real process.

Every mistake ends before any work with one ``error:`` line naming the key and the fix, exit code 2 and
no traceback; runs write only inside their run dir and never into an old run's; a diverging run says so.
"""

import importlib.util
import json
import os
import random
import shlex
import signal
import string
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from acer_torchrl.commands import shell_command
from acer_torchrl.health import PATIENCE, Health
from acer_torchrl.rundir import LOCK_FILE, RUN_FILES

ROOT = Path(__file__).resolve().parents[1]
# the recipe process imports this checkout's package, whatever is installed
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
# a run that trains a little (two batches, their updates, an evaluation, a checkpoint): a few seconds
TINY = ["total_frames=64", "collector.workers=0", "collector.frames_per_batch=32", "replay.min_size=64",
        "replay.batch_size=4", "network.hidden=16", "eval.episodes=1", "eval.max_steps=50", "log.progress=false"]


def recipe(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "recipes" / "acer.py"), *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a failed recipe printed (asserting that it is one line, exit code 2, no traceback)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def run_dir_holding(tmp_path: Path, name: str) -> Path:
    """A run dir as an earlier run left it: finished (summary.json) or resumable (checkpoint)."""
    run_dir = tmp_path / "old"
    if name == "summary.json":
        run_dir.mkdir()
        (run_dir / name).write_text("{}")
    else:
        (run_dir / name).mkdir(parents=True)
        (run_dir / name / "counters.json").write_text("{}")
    return run_dir


def saved_config(tmp_path: Path, text: str) -> Path:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.yaml").write_text(text)
    return tmp_path / "old"


# the cases of issue 24, each a recipe process:
# 10 levels of 9 aliases: 9^10 strings once expanded (a 3.85 MB error line before aliases were refused)
BOMB = "env:\n  name: &l0 [a, a, a, a, a, a, a, a, a]\n" + "".join(
    f"x{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)
)

# (case, its overrides or how to make them in tmp_path, what the line says)
CASES = [
    ("eval.interval=0", ["eval.interval=0"], "eval.interval must be >= 1, got 0; e.g. eval.interval="),
    ("eval.episodes=0", ["eval.episodes=0"], "eval.episodes must be >= 1, got 0; e.g. eval.episodes="),
    # the example is the preset's value (cartpole: 5e-4), not the dataclass default (1e-3)
    ("optim.lr=-1", ["optim.lr=-1"], "optim.lr must be > 0, got -1.0; e.g. optim.lr=0.0005 (preset=cartpole's value)"),
    ("checkpoint_interval<0", ["log.checkpoint_interval=-5"], "log.checkpoint_interval must be >= 1, got -5"),
    ("resume: empty config.yaml", lambda t: [f"resume={saved_config(t, '')}"],
     "config.yaml holds no run configuration"),
    ("resume: malformed config.yaml", lambda t: [f"resume={saved_config(t, 'seed: [1, 2')}"],
     "config.yaml is not valid YAML (expected ',' or ']'"),
    ("run_dir under a file", lambda t: [f"run_dir={t / 'file' / 'run'}"],
     "cannot be used as a run directory (a part of that path is a file, not a directory)"),
    ("run_dir not writable", ["run_dir=/proc/acer-torchrl-run"], "cannot be used as a run directory ("),
    ("run_dir holds a finished run", lambda t: [f"run_dir={run_dir_holding(t, 'summary.json')}"],
     "already holds a run (summary.json or checkpoint): continue it with resume="),
]
# more of the same kind, checked in this process (cli.main, as the recipe calls it): no process start-up
MORE_CASES = [
    ("optim.lr=nan", ["optim.lr=nan"], "optim.lr must be > 0, got nan"),
    ("optim.lr=inf", ["optim.lr=inf"], "optim.lr must be finite and > 0, got inf"),
    ("unknown key, no close match", ["zzz.qqq=1"], "unknown config key 'zzz.qqq'; the sections are acer, collector"),
    ("unknown key in a section", ["optim.zzzzzzzz_qqq=1"], "unknown config key 'optim.zzzzzzzz_qqq'; the keys of optim are"),
    ("network.hidden=0", ["network.hidden=64,0"], "network.hidden entries must be in [1, 8192], got 64,0"),
    ("total_frames=1e30", ["total_frames=1e30"], "config key 'total_frames' expects int: 1e30 is out of"),
    ("total_frames=abc", ["total_frames=abc"], "config key 'total_frames' expects int: 'abc' is not an integer"),
    ("min_size>capacity", ["replay.capacity=50"], "replay.min_size=64 exceeds replay.capacity=50"),
    ("batch>capacity", ["replay.capacity=64", "replay.batch_size=8", "replay.seq_len=16"], "= 128 steps per update exceed"),
    ("frames_per_batch not a multiple of num_envs", ["collector.frames_per_batch=10"],
     "collector.frames_per_batch=10 is not a multiple of env.num_envs=4"),
    # with 1 GiB available (below): the replay's links alone would take 4.6 GiB
    ("capacity beyond memory", ["replay.capacity=1e8"], "replay.capacity=100000000: its episode links need"),
    ("device=cuda:x", ["device=cuda:x"], "device must be auto, cpu, cuda or cuda:<index>, got 'cuda:x'"),
    ("acer.alpha=1", ["acer.alpha=1"], "acer.alpha must be in [0, 1), got 1.0; e.g. acer.alpha=0.99"),
    ("run_dir empty", ["run_dir="], "run_dir= is empty"),
    # resume=$RUN with RUN unset: refused, not a new run started in its place
    ("resume empty", ["resume="], "resume= is empty: give a run directory"),
    ("init_from empty", ["init_from="], "init_from= is empty: give a weights file"),
    # a list mistyped is refused, not read as another list ([16, before: [16]; [[16],[32]]: [16, 32])
    ("list: unbalanced", ["network.hidden=[16,"], "'[16,' is not a list like [128,128]"),
    ("list: nested", ["network.hidden=[[16],[32]]"], "is not a list like [128,128] (unbalanced or nested"),
    ("list: an empty item", ["network.hidden=[16,,32]"], "'[16,,32]' has an empty item"),
    ("run_dir is a file", lambda t: [f"run_dir={t / 'file'}"], "cannot be used as a run directory (it is a file"),
    ("run_dir holds a checkpoint", lambda t: [f"run_dir={run_dir_holding(t, 'checkpoint')}"],
     "or add overwrite=true to replace it"),
    ("resume: unknown key in config.yaml", lambda t: [f"resume={saved_config(t, 'optim: {lrr: 1}')}"],
     "config.yaml: unknown config key 'optim.lrr'; did you mean optim.lr"),
    ("resume: not a mapping", lambda t: [f"resume={saved_config(t, '- 1')}"], "holds no run configuration"),
    # compile=true went (benchmarks/results/speed-pieces.md): asked for, or recorded by a run that used it
    ("compile=true", ["compile=true"], "compile=true: the key was removed (torch.compile made the learner slower"),
    ("resume: compile: true in config.yaml", lambda t: [f"resume={saved_config(t, 'compile: true')}"],
     "config.yaml: compile=True: the key was removed"),
    # a name longer than a file system's file names: the OS's error came up where the path was first used
    ("run_dir: a 300-byte name", lambda t: [f"run_dir={t / ('r' * 300)}"], "a part of that path is 300 bytes long"),
    ("resume: a 300-byte name", lambda t: [f"resume={t / ('r' * 300)}"], "a part of that path is 300 bytes long"),
    # a value typed (or pasted) by mistake is echoed, cut: one line of at most 600 characters
    ("a 5 000-character value", ["env.name=" + "x" * 5_000], "characters in all)"),
    ("resume: an alias bomb", lambda t: [f"resume={saved_config(t, BOMB)}"], "uses YAML aliases (*name), which no run"),
    ("resume: a huge config.yaml", lambda t: [f"resume={saved_config(t, 'seed: 1  ' + '#' * 70_000)}"],
     "holds 70009 bytes, more than a run's config.yaml ever does (65536)"),
    # a preset made for other observations: an MLP on Atari frames, a Nature CNN on CartPole's 4 numbers
    ("vector preset, Atari env", ["preset=cartpole", "env.name=ALE/Pong-v5"],
     "preset=cartpole is made for vector observations (CartPole-v1), but env.name=ALE/Pong-v5 gives pixel "
     "observations; choose a preset made for them: preset=atari, preset=atari_gpu"),
    ("Atari preset, vector env", ["preset=atari", "env.name=CartPole-v1"], "preset=atari is made for pixel"),
    ("vector preset, MinAtar env", ["preset=cartpole", "env.name=MinAtar/Breakout-v1"], "preset=minatar"),
]


def case_args(tmp_path: Path, overrides) -> list[str]:
    """A case's command line: its overrides (a list, or made in ``tmp_path``) after the tiny run's."""
    (tmp_path / "file").write_text("in the way")
    return [*TINY, f"run_dir={tmp_path / 'run'}", *(overrides(tmp_path) if callable(overrides) else overrides)]


def by_name(cases: list[tuple]):
    return pytest.mark.parametrize("overrides, fragment", [c[1:] for c in cases], ids=[c[0] for c in cases])


@pytest.mark.integration
@by_name(CASES)
def test_bad_input_ends_before_any_work_with_one_line(tmp_path, overrides, fragment):
    args, cwd = case_args(tmp_path, overrides), tmp_path / "cwd"
    cwd.mkdir()
    before = sorted(tmp_path.rglob("*"))
    assert fragment in error_line(recipe(args, cwd))
    assert sorted(tmp_path.rglob("*")) == before, "nothing was written"


@by_name(MORE_CASES)
def test_more_bad_input_ends_with_one_line(tmp_path, capsys, monkeypatch, overrides, fragment):
    from acer_torchrl import cli

    monkeypatch.setattr("acer_torchrl.replay.available_memory", lambda: 2**30)
    args = case_args(tmp_path, overrides)
    before = sorted(tmp_path.rglob("*"))
    code = cli.main("acer", args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], lines
    assert len(lines[0]) <= len("error: ") + 600
    run = tmp_path / "run"
    assert sorted(tmp_path.rglob("*")) in (before, [*before, run], [*before, run, run / LOCK_FILE]), \
        "at most the run dir, empty but for its lock file"


def test_replay_too_large_for_the_memory_is_refused_before_it_is_allocated(monkeypatch):
    import torch
    from tensordict import TensorDict

    from acer_torchrl.config import ConfigError
    from acer_torchrl.replay import EpisodeReplay

    monkeypatch.setattr("acer_torchrl.replay.available_memory", lambda: 10 * 2**20)
    replay = EpisodeReplay(100_000)  # 4.7 MiB of links: fits
    batch = TensorDict({"observation": torch.zeros(8, 256), ("collector", "traj_ids"): torch.zeros(8, dtype=torch.long),
                        ("next", "done"): torch.zeros(8, 1, dtype=torch.bool)}, batch_size=[8])
    with pytest.raises(ConfigError, match=r"replay.capacity=100000: its steps \(1033 bytes each\) need 0.1 GiB"):
        replay.extend(batch)  # 100 000 steps of 1 KiB: do not fit


@pytest.mark.integration
@pytest.mark.parametrize("algo, presets, key", [
    ("acer", "cartpole, atari, atari_gpu, minatar, mujoco, pendulum (default cartpole)", "acer.replay_ratio=4.0"),
    ("reactor", "cartpole, cartpole_pomdp, atari, atari_gpu, minatar, atari_prioritized (default cartpole)",
     "reactor.pg=beta_loo"),
    ("vracer", "mujoco, pendulum (default pendulum)", "vracer.D=0.1"),
    ("laser", "cartpole, cartpole_pomdp, atari, atari_gpu, minatar, mujoco (default cartpole)",
     "laser.online_share=0.125"),
])
def test_help_lists_presets_and_keys_without_importing_torch(tmp_path, algo, presets, key):
    code = (f"import sys; sys.argv = ['recipes/{algo}.py', '--help']; import runpy; "
            f"runpy.run_path('{ROOT / 'recipes' / (algo + '.py')}', run_name='__main__')")
    check = "import atexit, sys; atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
    proc = subprocess.run([sys.executable, "-c", check + code], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"usage: {shlex.join([sys.executable, str(ROOT / 'recipes' / f'{algo}.py')])} [preset=NAME] [key=value ...]"
    assert lines[1] == f"presets: {presets}"
    assert f"  {key}" in lines and any(line.startswith("  replay.capacity=") for line in lines)
    assert lines[-1] == "torch imported: False"


@pytest.mark.integration
def test_runs_write_only_in_their_run_dir_and_never_into_an_old_run(tmp_path):
    cwd, run_dir = tmp_path / "cwd", tmp_path / "run"
    cwd.mkdir()
    first = recipe([*TINY, f"run_dir={run_dir}"], cwd)
    assert first.returncode == 0, first.stderr
    assert not any(cwd.iterdir()), "nothing outside the run dir"
    assert {p.name for p in run_dir.iterdir()} <= {*RUN_FILES, LOCK_FILE}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["health"] == {"status": "ok"}

    again = recipe([*TINY, f"run_dir={run_dir}"], cwd)
    assert f"continue it with resume={run_dir}" in error_line(again)
    assert json.loads((run_dir / "summary.json").read_text()) == summary, "the old run is untouched"

    (run_dir / "notes.txt").write_text("the user's own file")
    (run_dir / "tensorboard").mkdir()  # from the old run (log.tensorboard=true): not part of the new one
    replaced = recipe([*TINY, f"run_dir={run_dir}", "overwrite=true", "seed=1"], cwd)
    assert replaced.returncode == 0, replaced.stderr
    assert json.loads((run_dir / "summary.json").read_text())["seed"] == 1
    assert (run_dir / "notes.txt").is_file() and not (run_dir / "tensorboard").exists()


@pytest.mark.integration
def test_a_diverging_run_says_so_in_the_log_and_in_its_summary(tmp_path):
    proc = recipe([*TINY, "total_frames=128", "optim.lr=1e3", f"run_dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    health = json.loads((tmp_path / "run" / "summary.json").read_text())["health"]
    assert health["status"] == "diverged" and health["update"] >= 1 and health["env_steps"] > 0
    assert f"warning: training diverged at update {health['update']}" in proc.stderr
    assert "warning: this run diverged" in proc.stderr.strip().splitlines()[-1]


def feed(health: Health, values: list[float], key: str = "grad_norm") -> str | None:
    warnings = [health.observe({key: v}, update, 32 * update) for update, v in enumerate(values, 1)]
    return next((w for w in warnings if w), None)


def test_health_flags_a_blow_up_from_its_first_bad_update_but_not_noise():
    rng = random.Random(0)
    noisy = [rng.lognormvariate(0, 1.5) for _ in range(2000)]  # heavy-tailed, spikes 10-100x
    for start in range(100, 2000, 300):  # bursts of huge spikes shorter than PATIENCE
        noisy[start : start + PATIENCE - 1] = [1e6] * (PATIENCE - 1)
    growing = [1.01**t for t in range(1000)]  # a value estimate that rises 20 000x while learning
    for values in (noisy, growing):
        health = Health()
        assert feed(health, values) is None and health.summary() == {"status": "ok"}

    blow_up = [1.0] * 50 + [1.5**t for t in range(1, 60)]  # from update 51 on, 1.5x per update
    health = Health()
    warning = feed(health, blow_up)
    assert warning is not None and health.summary()["status"] == "diverged"
    # update 50 + k: 1.5^k against a scale that followed at 1 % per update, 1.01^(k - 1): over 100x from k = 12
    assert health.summary()["update"] == 62 and "at update 62 (1984 env steps)" in warning

    health = Health(value_keys=("state_value",))
    assert feed(health, [1.0, float("nan")], "state_value") is not None
    assert health.summary() == {"status": "diverged", "update": 2, "env_steps": 64, "statistic": "state_value",
                                "value": "nan"}
    assert feed(health, [float("inf")]) is None, "reported once"


# ------------------------------------------------------------------------------------------------ fuzz
# the cases run in one process (cli.main per case, as the recipe calls it; argv: the cases, a time limit):
# a traceback is an exception that escapes main; a case still going at the limit (e.g. total_frames=1e9)
# counts as running
FUZZ_DRIVER = """
import contextlib, io, json, signal, sys, traceback
from acer_torchrl import cli
# imported before any alarm: one that lands in an import leaves the module half made for every case after it
# (seen on a loaded machine: "partially initialized module ... torchrl/modules/models/model_based.py")
import acer_torchrl.trainer, acer_torchrl.evaluation

class Limit(BaseException):
    pass

def stop(*_):
    raise Limit

def unraisable(report):
    # the alarm landed in a __del__ (an env's, as a run is collected): Python swallows the Limit there and
    # prints it; it is the driver's own, not the command's output: stop at the next chance instead
    if isinstance(report.exc_value, Limit):
        signal.setitimer(signal.ITIMER_REAL, 0.01)
    else:
        sys.__unraisablehook__(report)

signal.signal(signal.SIGALRM, stop)
sys.unraisablehook = unraisable
results = []
for argv in json.loads(sys.argv[1]):
    err, code = io.StringIO(), None
    signal.alarm(int(sys.argv[2]))
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main("acer", argv)
    except Limit:
        code = "running"
    except BaseException:
        err.write(traceback.format_exc())
        code = "traceback"
    finally:
        signal.alarm(0)
    results.append({"argv": argv, "code": code, "stderr": err.getvalue()})
print(json.dumps(results))
"""
NUMBERS = ["0", "1", "2", "3", "-1", "-2", "0.5", "-0.5", "2.5", "1e-3", "1e-12", "1e9", "1e30", "-1e9", "nan", "inf",
           "-inf", "1_000", "0x10", "1e999"]


def random_value(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.7:
        return rng.choice(NUMBERS)
    if kind < 0.85:
        return rng.choice(["", "none", "true", "false", "[1, 2]", "1,2", "a=b", " "])
    return "".join(rng.choice(string.printable.strip()) for _ in range(rng.randint(1, 8)))


def fuzz_cases(n: int, seed: int, tmp_path: Path) -> list[list[str]]:
    from acer_torchrl.config import _valid_keys, load_config

    cfg = load_config("acer", [])
    # not run_dir: a random one (e.g. "/") would be a real directory to write a run into
    keys = sorted(set(_valid_keys(cfg)) - {"run_dir"}) + [f"acer.{k}" for k in _valid_keys(cfg.algo)]
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        picked = [f"{rng.choice(keys)}={random_value(rng)}" for _ in range(rng.choice([1, 1, 2]))]
        cases.append([*TINY, f"run_dir={tmp_path / f'run{i}'}", *picked])
    return cases


@pytest.mark.integration
def test_fuzzed_overrides_run_or_fail_with_one_line(tmp_path):
    cases = fuzz_cases(50, seed=2024, tmp_path=tmp_path)
    proc = subprocess.run([sys.executable, "-c", FUZZ_DRIVER, json.dumps(cases), "20"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    codes = [r["code"] for r in results]
    for r in results:
        picked = r["argv"][len(TINY) + 1 :]
        assert "Traceback" not in r["stderr"] and r["code"] in (0, 2, "running"), (picked, r["stderr"])
        if r["code"] == 2:
            errors = [line for line in r["stderr"].strip().splitlines() if line.startswith("error: ")]
            assert len(errors) == 1 and r["stderr"].strip().endswith(errors[0]), (picked, r["stderr"])
    # the fuzz reaches both ends: refused configs, and accepted ones (run to the end, or still running at the limit)
    assert codes.count(2) >= 10 and codes.count(0) + codes.count("running") >= 5, codes


@pytest.mark.integration
def test_a_benchmark_refuses_to_overwrite_a_committed_result_before_any_run(tmp_path):
    """benchmarks/learning.py writes a row's line of `learning-rows.jsonl` and its `<name>.png` beside the committed
    rows: a second run under a taken name (a quick try with the default name) must not replace the record and curve
    a committed row links to."""
    results = tmp_path / "results"
    results.mkdir()
    committed = '{"name": "acer-pendulum"}\n{"name": "acer-cartpole"}\n'
    (results / "learning-rows.jsonl").write_text(committed)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learning.py"), "acer", "cartpole",
                           "--frames", "64", "--results", str(results), "--runs", str(tmp_path / "runs")],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("learning-rows.jsonl already holds a row acer-cartpole: "
                                                         "give another --name, or --replace")
    assert (results / "learning-rows.jsonl").read_text() == committed and not (tmp_path / "runs").exists()
    assert sorted(p.name for p in results.iterdir()) == ["learning-rows.jsonl"]


@pytest.mark.integration
@pytest.mark.skipif(importlib.util.find_spec("pfrl") is not None, reason="pfrl is importable here")
def test_the_pfrl_benchmark_without_pfrl_says_how_to_install_it_in_one_line(tmp_path):
    """pfrl is installed for ``benchmarks/learner.py pfrl`` alone (``--site``), never for the tests: without it the
    benchmark ends in one line that says how, no traceback."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learner.py"), "pfrl", "--site", str(tmp_path)],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and proc.stdout == "" and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: learner.py pfrl needs pfrl") and "--site DIR" in lines[0]


@pytest.mark.integration
def test_a_killed_learner_benchmark_takes_its_recipe_run_with_it(tmp_path):
    """``kill`` (SIGTERM) on ``benchmarks/learner.py`` while its end-to-end recipe runs: both end (before, the
    benchmark went on through the signal, and its recipe was left running when it was killed harder)."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "learner.py"), "--only", "acer:cartpole",
                             "--frames", "1000000", "--out", str(tmp_path / "learner.json")],
                            cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 120
    recipe = None
    while recipe is None and time.monotonic() < deadline and proc.poll() is None:
        pids = children.read_text().split() if children.exists() else []
        recipe = next((int(p) for p in pids if "recipes/acer.py" in Path(f"/proc/{p}/cmdline").read_text()), None)
        time.sleep(0.2)
    assert recipe is not None, "the end-to-end recipe run never started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    deadline = time.monotonic() + 30
    while Path(f"/proc/{recipe}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{recipe}").exists() or "Z" in Path(f"/proc/{recipe}/stat").read_text().split()[2]


def test_the_sweep_recipe_takes_help_anywhere_and_names_its_interpreter(tmp_path):
    """``recipes/laser_sweep.py ... --help`` as the other recipes take it (it was an error when not first), its
    command line with the interpreter that runs, which works from any directory (not ``python recipes/...``)."""
    script = str(ROOT / "recipes" / "laser_sweep.py")
    proc = subprocess.run([sys.executable, script, "agents=2", "--help"], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines()[2].startswith(f"    {shlex.join([sys.executable, script])} [agents=3]"), proc.stdout


def test_printed_commands_name_the_interpreter_from_where_they_are_typed(monkeypatch, tmp_path):
    """The interpreter and script of a printed command: relative under the current directory (the README's
    ``.venv/bin/python recipes/...``), absolute elsewhere, the venv's link kept (resolved, it would leave the venv);
    every part quoted for the shell."""
    monkeypatch.setattr(sys, "executable", str(ROOT / ".venv" / "bin" / "python"))
    monkeypatch.chdir(ROOT)
    assert shell_command("recipes/acer.py", "resume=runs/a b") == ".venv/bin/python recipes/acer.py 'resume=runs/a b'"
    monkeypatch.chdir(tmp_path)
    assert shell_command("recipes/acer.py") == f"{ROOT}/.venv/bin/python {ROOT}/recipes/acer.py"


@pytest.mark.parametrize("recipe", ["acer", "laser_sweep"])
def test_help_into_a_closed_pipe_ends_quietly(tmp_path, recipe):
    """``recipes/<algo>.py --help | head -1``: the reader goes away before the help is written; the recipe ends
    with the shell's code for a closed pipe and nothing on stderr (it printed a BrokenPipeError traceback)."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "recipes" / f"{recipe}.py"), "--help"], cwd=tmp_path, env=ENV,
                              stdout=writer, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(writer)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_a_broken_pipe_that_is_not_stdout_is_not_taken_for_a_closed_reader():
    """Only a closed stdout ends a recipe quietly with 141: a BrokenPipeError on another pipe (a helper process's)
    is an error (a collector worker's death once ended a run with 141 and nothing said)."""
    from acer_torchrl import cli

    def writes_to_a_dead_helper(stops):
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        cli.with_stop_signals(writes_to_a_dead_helper)


def test_help_anywhere_on_the_line_and_submit_takes_a_recipe_path(capsys):
    from acer_torchrl import cli

    assert cli.main("acer", ["preset=atari", "seed=3", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {shell_command('recipes/acer.py')} [preset") and "docs/config.md" in out
    sys.path.insert(0, str(ROOT / "slurm"))
    try:
        import submit
    finally:
        sys.path.remove(str(ROOT / "slurm"))
    assert submit.build_parser().parse_args(["recipes/acer.py", "seed=1"]).recipe == "acer"


def test_runs_started_in_the_same_second_get_directories_of_their_own(tmp_path, monkeypatch):
    """Runs given no run_dir= (a recipe's, a sweep's or slurm/submit.py's) each make their own directory at once."""
    import threading
    import time

    from acer_torchrl.config import load_config
    from acer_torchrl.rundir import default_run_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda _format: "20261127-052600")
    cfg, start, made = load_config("acer", ["seed=3"]), threading.Barrier(6), []

    def new_run() -> None:
        start.wait()
        made.append(default_run_dir(cfg))

    threads = [threading.Thread(target=new_run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    base = "acer-CartPole-v1-s3-20261127-052600"
    assert sorted(str(path) for path in made) == sorted([f"runs/{base}", *(f"runs/{base}-{n}" for n in range(2, 7))])
    assert default_run_dir(cfg, sweep=True) == Path("runs/acer-sweep-CartPole-v1-s3-20261127-052600")


@pytest.mark.parametrize("workers", [0, pytest.param(1, marks=pytest.mark.integration)])
def test_a_policy_whose_outputs_overflow_ends_the_run_with_one_line(tmp_path, workers):
    """At ``optim.lr=1e30`` the first step leaves finite weights whose logits overflow: the sampler of the acting
    policy (in this process, or in a worker) cannot draw. The run ends with one line saying why, not with a
    traceback (a worker's, which once died of it first) or a worker's death and a resume that would fail the same
    way."""
    from acer_torchrl.config import without_keys

    args = [*without_keys(TINY, "collector.workers", "total_frames"), f"collector.workers={workers}", "total_frames=640",
            "optim.lr=1e30", f"run_dir={tmp_path / 'run'}"]
    proc = recipe(args, tmp_path)
    line = ("error: the acting policy's outputs are not finite after update 1 (the network diverged); lower optim.lr "
            "and start a new run")
    # with a worker: this line, or the next update's non-finite loss where the learner takes it before the worker's batch
    assert error_line(proc) == line or (workers and error_line(proc).startswith("error: non-finite loss at update 1"))


def test_a_new_run_in_a_directory_left_without_a_checkpoint_starts_clean(tmp_path):
    """A run killed before its first checkpoint leaves files but nothing to resume: a new run there (what
    benchmarks/learning.py does with such a seed) removes them, so that its TensorBoard / W&B event files and
    metrics are its own; the user's own files stay."""
    from acer_torchrl.rundir import drop_old_run, prepare_run_dir

    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    (run / "tensorboard" / "events.out.tfevents.1").write_text("the killed run's")
    (run / "metrics.csv").write_text("env_steps\n64\n")
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "notes.txt").write_text("the user's own file")
    _, lock = prepare_run_dir(run, resume=False, overwrite=False)
    drop_old_run(run)  # (what the trainer does once the new run is built: until then they are set aside)
    lock.close()
    assert sorted(p.name for p in run.iterdir()) == sorted([LOCK_FILE, "notes.txt"])


def test_a_run_copied_with_hard_links_is_refused_on_resume_and_the_original_stays(tmp_path):
    """``cp -al run copy`` then ``resume=copy``: the copy's files are the original's (hard links); a resume appends
    to ``provenance.jsonl`` and writes the memory-mapped replay in place, into the original too. Refused in one line."""
    run, copy = tmp_path / "run", tmp_path / "copy"
    assert recipe([*TINY, "replay.memmap=true", f"run_dir={run}"], tmp_path).returncode == 0
    shutil.copytree(run, copy, copy_function=os.link)  # what cp -al makes
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    line = error_line(recipe([f"resume={copy}", "total_frames=96"], tmp_path))
    assert line.startswith(f"error: resume={copy}: ") and "hard link shared with another directory" in line, line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
