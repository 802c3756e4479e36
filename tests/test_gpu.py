"""The CUDA learner (``device=cuda``: the losses on the GPU, a CPU acting copy synced after every batch).

Marked ``gpu`` and skipped where torch sees no CUDA device (CI has none); run them on a GPU machine with
``pytest -m gpu`` (benchmarks/gpu/README.md says how the results of 2026-11-24 were obtained).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributions as D

from acer_torchrl.config import load_config
from acer_torchrl.settings import get_algorithm
from acer_torchrl.trainer import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch"),
]
ROOT = Path(__file__).resolve().parents[1]

# every loss, on small real batches: discrete and continuous ACER (the latter with its SDN), LASER, Reactor
# feed-forward and with its LSTM core, V-RACER
CASES = {
    "acer-discrete": ("acer", "cartpole"),
    "acer-continuous": ("acer", "pendulum"),
    "laser": ("laser", "cartpole"),
    "reactor": ("reactor", "cartpole"),
    "reactor-lstm": ("reactor", "cartpole_pomdp"),
    "vracer": ("vracer", "pendulum"),
}


@contextlib.contextmanager
def normal_noise_drawn_on_cpu(seed: int):
    """Gaussian draws inside the losses (ACER's SDN samples, eq. 13/16) come from one CPU generator whatever
    the device, so that a CPU and a CUDA forward see the very same noise."""
    gen = torch.Generator().manual_seed(seed)
    original = D.Normal.rsample, D.Normal.sample

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, generator=gen, dtype=self.loc.dtype).to(self.loc.device)
        return self.loc + eps * self.scale

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            return rsample(self, sample_shape)

    D.Normal.rsample, D.Normal.sample = rsample, sample
    try:
        yield
    finally:
        D.Normal.rsample, D.Normal.sample = original


def filled_trainer(algo: str, preset: str, tmp_path: Path) -> Trainer:
    cfg = load_config(algo, [f"preset={preset}", "device=cpu", "collector.workers=0", "replay.min_size=300",
                             f"run_dir={tmp_path / 'run'}", "log.progress=false", "eval.background=false"])
    trainer = Trainer(cfg)
    trainer.fill_replay(600)
    return trainer


def loss_and_grads(loss, batch, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    loss.zero_grad(set_to_none=True)
    with normal_noise_drawn_on_cpu(seed):
        out = loss(batch)
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    values = {k: v.detach().cpu().double() for k, v in out.items() if k.startswith("loss_")}
    grads = {n: p.grad.detach().cpu().double() for n, p in loss.named_parameters() if p.grad is not None}
    return values, grads


def compare_devices(algo: str, preset: str, tmp_path: Path, device: str) -> None:
    """One real replay batch through the loss on CPU and on ``device``: the loss entries and every parameter's
    gradient agree to 1e-5 (TF32 off: it rounds matmuls and convolutions to 10-bit mantissas)."""
    trainer = filled_trainer(algo, preset, tmp_path)
    share = next(s for s in trainer.loss.update_plan(trainer.rng) if s < 1.0) if algo != "vracer" else 0.0
    batch = trainer.agent.before_update(trainer.draw_batch(share), trainer.replay)
    # a second build of the same loss with the first one's state (a deepcopy would cut the functional
    # parameters of TorchRL's LossModule off from the graph)
    on_device = get_algorithm(algo).build(trainer.cfg, trainer.info).loss
    on_device.load_state_dict(trainer.loss.state_dict())
    on_device.to(device)
    cpu_values, cpu_grads = loss_and_grads(trainer.loss, batch, seed=7)
    dev_values, dev_grads = loss_and_grads(on_device, batch.to(device), seed=7)
    assert cpu_values.keys() == dev_values.keys() and cpu_grads.keys() == dev_grads.keys()
    assert len(cpu_grads) > 0
    for name in cpu_values:
        torch.testing.assert_close(dev_values[name], cpu_values[name], rtol=1e-5, atol=1e-5, msg=name)
    for name in cpu_grads:
        torch.testing.assert_close(dev_grads[name], cpu_grads[name], rtol=1e-5, atol=1e-5, msg=name)


@contextlib.contextmanager
def full_fp32_matmuls():
    """TF32 off in cuBLAS and cuDNN while the block runs, then as it was. Not pytest's ``monkeypatch``: it cannot
    restore ``torch.backends.cuda.matmul.allow_tf32`` (a ``__getattr__`` / ``__setattr__`` pair of
    ``cuBLASModule``, no attribute of its own), and under pytest 9.2 six tests errored at teardown."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.mark.parametrize("case", CASES)
def test_loss_and_gradients_on_cuda_equal_cpu(case, tmp_path):
    with full_fp32_matmuls():
        compare_devices(*CASES[case], tmp_path, "cuda")


def run_recipe(algo: str, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "recipes" / f"{algo}.py"), *overrides, "log.progress=false"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


SHORT = ("total_frames=2000", "replay.min_size=500", "eval.interval=1000", "eval.episodes=10")


@pytest.mark.parametrize("algo, preset", [
    ("acer", "cartpole"), ("laser", "cartpole"), ("reactor", "cartpole"), ("vracer", "pendulum"), ("acer", "minatar"),
], ids=["acer", "laser", "reactor", "vracer", "acer-minatar"])
def test_short_cuda_run_leaves_its_summary(algo, preset, tmp_path):
    run = run_recipe(algo, f"preset={preset}", "device=cuda", *SHORT, f"run_dir={tmp_path / 'run'}")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["env_steps"] >= 2000 and summary["updates"] > 0


def resume_across_devices(run_dir: Path, devices: tuple[str, ...]) -> list[tuple[int, int]]:
    """ACER CartPole started on ``devices[0]`` and resumed on each next one, 1000 env steps further each
    time; ``(env_steps, updates)`` of every piece's summary."""
    steps = []
    for i, device in enumerate(devices):
        args = ["preset=cartpole", f"device={device}", *SHORT[1:], f"total_frames={2000 + 1000 * i}"]
        args += [f"resume={run_dir}"] if i else [f"run_dir={run_dir}"]
        run = run_recipe("acer", *args)
        assert run.returncode == 0, run.stderr[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        steps.append((summary["env_steps"], summary["updates"]))
    return steps


def test_gpu_checkpoint_resumes_on_cpu_and_back(tmp_path):
    steps = resume_across_devices(tmp_path / "run", ("cuda", "cpu", "cuda"))
    assert [s for s, _ in steps] == sorted(s for s, _ in steps) and steps[-1][0] >= 4000
    assert steps[0][1] < steps[1][1] < steps[2][1]  # the update count carries over each resume


def test_frame_store_draws_on_cuda_equal_cpu():
    """A frame-store replay's draw for a CUDA learner (each distinct frame moved once, expanded on the GPU) holds
    the stacks a CPU draw of the same slots holds (the CPU path: ``tests/test_replay.py``)."""
    from test_replay import random_batches

    from acer_torchrl.replay import EpisodeReplay

    replay = EpisodeReplay(200, seed=0, frame_stack=4)
    for batch in random_batches(20, seed=2):
        replay.extend(batch)
    slots = replay.alive_slots()
    keys = ["observation", ("next", "observation"), "step_count"]
    on_cpu, on_cuda = replay.gather(slots, keys), replay.gather(slots, keys, device=torch.device("cuda"))
    assert on_cuda["observation"].is_cuda and on_cuda["next", "observation"].is_cuda
    for key in keys:
        assert torch.equal(on_cuda[key].cpu(), on_cpu[key])
