"""``compile=true``: the learner's networks through ``torch.compile`` give the update's numbers of the eager ones.

The compiled cases are slow on a CPU (inductor compiles C++: ~30-60 s a loss on 2 cores); the CUDA ones (and CUDA
graphs, ``compile_mode=reduce-overhead``) are in ``tests/test_gpu.py``.
"""

from __future__ import annotations

import json

import pytest
import torch
from torchrl.modules import set_recurrent_mode

from acer_torchrl.config import ConfigError, load_config
from acer_torchrl.objectives.common import objective
from acer_torchrl.settings import get_algorithm
from acer_torchrl.trainer import Trainer, train

SMALL = ["device=cpu", "collector.workers=0", "log.progress=false", "eval.background=false", "threads=1"]


@pytest.mark.parametrize("overrides, message", [
    (["compile_mode=max-autotune"], "add compile=true"),
    (["compile=true", "compile_mode=reduce-overhead", "device=cpu"], "need device=cuda"),
    (["compile=true", "network.lstm=true"], "feed-forward networks only"),
    (["compile=true", "compile_mode=fast"], "compile_mode"),
])
def test_compile_keys_refuse_what_cannot_run(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("acer", ["preset=cartpole", *overrides])


def test_compile_keys_are_accepted_together():
    cfg = load_config("acer", ["preset=minatar", "compile=true", "compile_mode=max-autotune", "device=cuda"])
    assert cfg.compile and cfg.compile_mode == "max-autotune"


def update_terms(loss, batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The trainer's ``forward_backward`` on ``batch``: the loss terms and every parameter's gradient."""
    torch.manual_seed(0)  # a loss that samples (V-RACER's none, LASER's Gaussian KL) draws the same
    params = [p for p in loss.parameters() if p.requires_grad]
    with set_recurrent_mode(True):
        out = loss.forward_backward(batch, params)
    terms = {k: v.detach().clone() for k, v in out.items() if k.startswith("loss_")}
    grads = {name: p.grad.clone() for name, p in loss.named_parameters() if p.grad is not None}
    assert torch.isfinite(objective(out)) and grads
    return terms, grads


@pytest.mark.slow
@pytest.mark.parametrize("algo, preset", [("acer", "minatar"), ("laser", "minatar"), ("vracer", "pendulum")])
def test_compiled_update_equals_eager(algo, preset, tmp_path):
    """Three batches (an on-policy one first where the loss takes one, so that the step count changes) through the
    eager loss and through a compiled copy with the same weights: loss terms and gradients agree to 1e-5."""
    cfg = load_config(algo, [f"preset={preset}", *SMALL, "replay.min_size=300", "replay.batch_size=8",
                             f"run_dir={tmp_path / 'run'}"])
    trainer = Trainer(cfg)
    trainer.fill_replay(600)
    compiled = get_algorithm(algo).build(cfg, trainer.info).loss
    compiled.load_state_dict(trainer.loss.state_dict())
    compiled.compile_networks()
    shares = [s for _ in range(3) for s in trainer.loss.update_plan(trainer.rng)][:2] + [0.0]
    for share in shares:
        batch = trainer.agent.before_update(trainer.draw_batch(share), trainer.replay)
        (eager_terms, eager_grads), (terms, grads) = update_terms(trainer.loss, batch), update_terms(compiled, batch)
        assert terms.keys() == eager_terms.keys() and grads.keys() == eager_grads.keys()
        for name in eager_terms:
            torch.testing.assert_close(terms[name], eager_terms[name], rtol=1e-5, atol=1e-5, msg=name)
        for name in eager_grads:
            torch.testing.assert_close(grads[name], eager_grads[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.slow
def test_short_compiled_run_completes(tmp_path):
    summary = train(load_config("acer", ["preset=cartpole", *SMALL, "compile=true", "total_frames=800",
                                         "replay.min_size=200", "eval.interval=800", "eval.episodes=2",
                                         f"run_dir={tmp_path / 'run'}"]))
    assert summary["env_steps"] >= 800 and summary["updates"] > 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["health"] == summary["health"]
