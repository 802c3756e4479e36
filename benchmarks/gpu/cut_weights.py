"""The weights-only file of a run directory's latest checkpoint, that a new run starts from (``init_from=OUT``):
networks, target networks' counters, the run's counters, the optimiser's state when it fits; no replay
(:func:`acer_torchrl.checkpoint.cut_weights`). Exit code 2 and one line when the run directory has no usable
checkpoint or its weights exceed ``--max-mb``.

usage: python benchmarks/gpu/cut_weights.py RUN_DIR OUT [--max-mb 16]
"""

import argparse
import sys
from pathlib import Path

from acer_torchrl.checkpoint import CheckpointError, cut_weights
from acer_torchrl.commands import OneLineErrors


def main() -> int:
    parser = OneLineErrors(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-mb", type=float, default=16.0, help="the most the file may hold (MiB)")
    args = parser.parse_args()
    try:
        kept = cut_weights(args.run_dir, args.out, int(args.max_mb * (1 << 20)))
    except (CheckpointError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    optimizer = "with the optimiser's state" if kept["optimizer"] else "without the optimiser's state (too large)"
    print(f"{args.out}: {kept['bytes'] / 1e6:.1f} MB, {optimizer}, at {kept['env_steps']} env steps, "
          f"{kept['updates']} updates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
