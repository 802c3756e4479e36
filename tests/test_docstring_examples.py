"""The ``Examples:`` of the four losses' docstrings run, as the suite's tests (a new loss in
``acer_torchrl.objectives.__all__`` needs one too)."""

import doctest
import importlib

import pytest

from acer_torchrl import objectives


@pytest.mark.parametrize("name", objectives.__all__)
def test_the_loss_docstring_example_runs(name):
    loss_class = getattr(objectives, name)
    assert ">>>" in loss_class.__doc__
    failed, attempted = doctest.testmod(importlib.import_module(loss_class.__module__))  # failures on stdout
    assert attempted >= 1 and failed == 0
