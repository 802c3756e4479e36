"""LASER (Schmitt et al. 2020): V-trace actor-critic with mixed online/replay batches and a trust region.

    python recipes/laser.py [preset=cartpole|cartpole_pomdp|atari|minatar|mujoco] [key=value ...]

``preset=cartpole`` is the default; see ``acer_torchrl/settings/laser.py`` for the presets and the
``laser.*`` keys (e.g. ``laser.online_share=0`` for the pure-replay ablation of Fig. 2,
``laser.trust_region=false`` for plain V-trace, ``laser.kl_threshold=`` for b). A sweep of agents sharing
one replay: ``recipes/laser_sweep.py``.
"""

import sys

from acer_torchrl.cli import main

if __name__ == "__main__":
    sys.exit(main("laser"))
