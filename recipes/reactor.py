"""Reactor (Gruslys et al. 2018) on the shared pipeline.

    python recipes/reactor.py [preset=cartpole|cartpole_pomdp|atari|minatar] [key=value ...]

``preset=cartpole`` is the default; see ``acer_torchrl/settings/reactor.py`` for the presets and the
``reactor.*`` keys (e.g. ``reactor.behaviour=learned`` for the "L" variants, ``reactor.beta_c=inf`` for
the 1/mu-LOO estimator, ``reactor.pg=tislr``, ``replay.recurrent_state=zero`` for the paper's LSTM reset).
"""

import sys

from acer_torchrl.cli import main

if __name__ == "__main__":
    sys.exit(main("reactor"))
