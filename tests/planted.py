"""A pickle planted in a saved checkpoint or replay: if anything unpickles it, ``marker`` appears."""

import os
import pickle
from pathlib import Path


class Planted:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def plant_pickle(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(Planted(marker)))
