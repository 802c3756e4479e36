"""The README's code examples run."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(heading: str) -> str:
    """The first ```python block of the README section titled ``heading``."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_use_a_loss_in_your_own_torchrl_loop():
    namespace = {}
    exec(compile(python_block("Use a loss in your own TorchRL loop"), str(README), "exec"), namespace)
    assert namespace["loss"].ndim == 0 and all(p.grad is not None for p in namespace["network"].parameters())


def test_prose_lines_are_at_most_200_characters():
    """The README is a user guide, not a log: outside code blocks no line runs past 200 characters."""
    in_code, long_lines = False, []
    for number, line in enumerate(README.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and len(line) > 200:
            long_lines.append(number)
    assert not long_lines, f"README.md lines over 200 characters outside code blocks: {long_lines}"
