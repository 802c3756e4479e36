"""ACER (Wang et al. 2017) on the shared pipeline.

    python recipes/acer.py [preset=cartpole|atari|minatar|mujoco|pendulum] [key=value ...]

``preset=cartpole`` is the default (what ``make train`` runs); see ``acer_torchrl/settings/acer.py``
for the presets and the ``acer.*`` keys.
"""

import sys

from acer_torchrl.cli import main

if __name__ == "__main__":
    sys.exit(main("acer"))
