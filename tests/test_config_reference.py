"""docs/config.md is what acer_torchrl.config_reference generates from the config dataclasses."""

import dataclasses

from acer_torchrl import config_reference
from acer_torchrl.config import OptimConfig


def test_committed_reference_is_current():
    assert config_reference.DOC_PATH.read_text() == config_reference.render(), (
        "docs/config.md is out of date: run python -m acer_torchrl.config_reference"
    )


def test_reference_follows_a_changed_default(monkeypatch):
    (lr,) = [f for f in dataclasses.fields(OptimConfig) if f.name == "lr"]
    before = config_reference.render()
    monkeypatch.setattr(lr, "default", 0.123)
    after = config_reference.render()
    assert after != before and "| `optim.lr` | `float` | `0.123` | > 0 | step size |" in after
    assert config_reference.main(["--check"]) == 1


def test_every_key_is_listed():
    from acer_torchrl.config import Config, _valid_keys

    text = config_reference.render()
    keys = _valid_keys(Config())
    for name, cls, _ in config_reference.algorithm_sections():
        keys += [f"{name}.{f.name}" for f in dataclasses.fields(cls)]
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, missing


def test_field_comments_read_the_source():
    comments = config_reference.field_comments(OptimConfig)
    assert comments["lr"] == "step size"
    assert comments["lr_end_factor"].startswith("linear step-size decay over the run")  # the lines above it
