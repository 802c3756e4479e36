"""V-RACER with ReF-ER (Novati & Koumoutsakos 2019) on the shared pipeline.

    python recipes/vracer.py [preset=pendulum|mujoco] [env.name=Hopper-v5] [key=value ...]

Both presets hold the paper's settings (App. A: MLP 2x128 Softsign, Adam 1e-4, gamma 0.995, N = 2^18,
B = 256, F = 1): ``preset=pendulum`` (the default) on InvertedPendulum-v5 for 50 000 steps,
``preset=mujoco`` on HalfCheetah-v5 for 10^6 steps (any MuJoCo v5 task with ``env.name=``).
``--help`` lists every key; ``acer_torchrl/settings/vracer.py`` explains the ``vracer.*`` keys (ReF-ER's ``C``, ``A``, ``D``;
``steps_per_update`` F...).
"""

import sys

from acer_torchrl.cli import main

if __name__ == "__main__":
    sys.exit(main("vracer"))
