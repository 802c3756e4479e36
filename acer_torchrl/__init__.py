"""acer-torchrl: sample-efficient off-policy actor-critic with experience replay on TorchRL."""

__version__ = "0.1.0"
