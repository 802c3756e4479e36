"""The commands a run prints for its user to type again (resume it, train it further, run a sweep without SLURM).

Each names the interpreter that runs now, not a bare ``python``: outside the project's virtual environment that
one lacks the packages (or is missing), and the printed command would fail where it matters, after a stop.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # where recipes/, slurm/ and benchmarks/ are


class OneLineErrors(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (``error: ... (--help: the usage)``) and exit code 2, as
    the recipes' are, instead of argparse's usage block before the error."""

    def error(self, message: str):
        self.exit(2, f"error: {message} ({self.prog} --help: the usage)\n")


def shell_command(script: str, *args: str) -> str:
    """``<interpreter> <script> <args>`` for a POSIX shell in the current directory: the interpreter that runs
    this process (``sys.executable``, e.g. ``.venv/bin/python``) and the project's ``script`` (``recipes/acer.py``),
    each relative to the current directory when it lies under it, else absolute; every part quoted when it needs it."""
    script_path = PROJECT_ROOT / script
    parts = [from_here(Path(sys.executable)), from_here(script_path) if script_path.is_file() else script, *args]
    return shlex.join(parts)


def from_here(path: Path) -> str:
    """``path`` relative to the current directory when it lies under it, else absolute (symbolic links kept: a
    virtual environment's ``bin/python`` is one, and resolving it would leave the environment)."""
    try:
        here = Path.cwd()
    except OSError:  # the current directory was removed: absolute it is
        return str(path)
    path = Path(os.path.abspath(path))
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)
