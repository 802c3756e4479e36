"""The README and the pages of docs/: their code examples run, their tables are well formed, their links resolve;
the results pages' links resolve, and every learning row they show has its record."""

import json
import re
from pathlib import Path

import pytest

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


ROOT = README.parent
GUIDES = [README, *sorted((ROOT / "docs").glob("*.md"))]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [*GUIDES, *sorted(RESULTS.glob("*.md"))]
ROW_RECORDS = RESULTS / "learning-rows.jsonl"  # benchmarks/learning.py's record of each row, one line by name


def table_rows(text: str) -> list[tuple[int, list[str]]]:
    """Every table of a Markdown text as (line number, cells) rows, tables apart by an entry ``(0, [])``."""
    rows, in_code, in_table = [], False, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        is_row = not in_code and line.startswith("|")
        if is_row:
            cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
            rows.append((number, [cell.strip() for cell in cells]))
        elif in_table:
            rows.append((0, []))
        in_table = is_row
    return rows


def malformed_rows(text: str) -> list[int]:
    """The lines of ``text``'s tables whose count of cells differs from their header's, or whose second line is
    not a separator row."""
    bad, header, position = [], None, 0
    for number, cells in table_rows(text) + [(0, [])]:
        if not cells:
            header, position = None, 0
            continue
        position += 1
        if header is None:
            header = cells
        elif len(cells) != len(header) or (position == 2 and not all(re.fullmatch(r":?-+:?", c) for c in cells)):
            bad.append(number)
    return bad


def test_a_broken_table_row_is_found():
    """The check below can fail: a row with a cell too many (the ACER `minatar` preset row once held a results row)."""
    good = "| a | b |\n|---|---|\n| 1 | 2 |\n\ntext\n| c |\n|---|\n| 3 |\n"
    assert malformed_rows(good) == []
    assert malformed_rows(good.replace("| 1 | 2 |", "| 1 | 2 | 3 |")) == [3]
    assert malformed_rows(good.replace("|---|---|", "| x | y |")) == [2]


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_every_table_is_well_formed(page):
    assert malformed_rows(page.read_text()) == [], f"{page.name}: rows whose cells do not match their header"


def local_targets(page: Path) -> list[str]:
    """The targets of ``page``'s Markdown links to files of this repository (no URL, no in-page anchor), each
    with its ``#fragment`` if it has one."""
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    return [t for t in targets if not re.match(r"[a-z]+:|#", t)]


def local_links(page: Path) -> list[str]:
    """The files of this repository ``page`` links to."""
    return [t.split("#", 1)[0] for t in local_targets(page)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    missing = [t for t in local_links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to files that do not exist: {missing}"


def shared_figures() -> set[str]:
    """The figures several rows share (``learning.py figure``), as their records name them."""
    return {json.loads(line).get("figure") for line in ROW_RECORDS.read_text().splitlines()} - {None}


def recorded_rows() -> list[str]:
    """The names of the rows learning-rows.jsonl records, in its line order."""
    return [json.loads(line)["name"] for line in ROW_RECORDS.read_text().splitlines()]


def shown_rows(page: Path) -> list[str]:
    """The learning rows ``page`` shows: the ``<row>.png`` curves it links in benchmarks/results/ (not the MinAtar
    summary's ``minatar-*`` plots, not a figure rows share, not ``gpu/``) and the records it links, lines of
    ``learning-rows.jsonl`` (``#L<line>``; a link to a line that is not there: ``line <n>?``)."""
    rows, shared, recorded = [], shared_figures(), recorded_rows()
    for target in local_targets(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve()
        if file.parent == RESULTS and file.suffix == ".png" and not file.name.startswith("minatar-") \
                and file.name not in shared:
            rows.append(file.stem)
        elif file == ROW_RECORDS and fragment:
            line = int(fragment[1:]) if re.fullmatch(r"L[1-9][0-9]*", fragment) else 0
            rows.append(recorded[line - 1] if 0 < line <= len(recorded) else f"line {fragment}?")
    return rows


def test_each_rows_record_link_goes_to_its_own_line():
    """learning.md's ``[<row>](<curves>) ([record](learning-rows.jsonl#L<n>))``: line ``n`` is that row's record."""
    recorded = recorded_rows()
    page = RESULTS / "learning.md"
    links = re.findall(r"^\| \[([^\]]+)\]\([^)]*\) \(\[record\]\(learning-rows\.jsonl#L(\d+)\)\)",
                       page.read_text(), flags=re.M)
    assert len(links) == len([line for line in page.read_text().splitlines() if line.startswith("| [")])
    wrong = [(name, int(n)) for name, n in links if not 0 < int(n) <= len(recorded) or recorded[int(n) - 1] != name]
    assert not wrong, f"learning.md links these rows' records to other lines of {ROW_RECORDS.name}: {wrong}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_row_a_page_shows_has_its_record(page):
    """A figure's source: each learning row a page shows (its curve or its record linked) is a line of
    learning-rows.jsonl, the seeds' scores, evaluations and command that the row's figures come from."""
    recorded = set(recorded_rows())
    missing = [row for row in shown_rows(page) if row not in recorded]
    assert not missing, f"{page.name} shows rows that {ROW_RECORDS.name} has no record of: {missing}"


def test_readme_is_a_guide():
    """A guide a newcomer reads through; the details live in docs/."""
    assert len(README.read_text().splitlines()) <= 170


def quoted_scores(text: str, records: dict[str, dict]) -> list[str]:
    """The table rows of ``text`` whose figures differ from the record of the learning row they link (link text:
    the row's name): the final score (``IQM [low, high]``, a lone seed's score alone), and ``k/n >= bar``, the
    seeds whose final scores reach the bar the page names (which may differ from the row's own threshold)."""
    wrong = []
    for number, cells in table_rows(text):
        names = [name for name in re.findall(r"\[([^\]]+)\]\(", " | ".join(cells)) if name in records]
        if not names:
            continue
        record = records[names[-1]]
        per_seed, (low, high) = record["final_score_per_seed"], record["final_score_ci95"]
        score = f"{record['final_score_iqm']:.1f}" + (f" [{low:.1f}, {high:.1f}]" if len(per_seed) > 1 else "")
        bars = [re.fullmatch(r"(\d+)/(\d+) >= ([\d.]+)", cell) for cell in cells]
        counts = [(int(m[1]), int(m[2]), float(m[3])) for m in bars if m]
        if score not in cells or any(n != len(per_seed) or k != sum(s >= bar for s in per_seed)
                                     for k, n, bar in counts):
            wrong.append(f"line {number} ({names[-1]})")
    return wrong


def test_a_quoted_score_that_is_not_its_records_is_found():
    """The check below can fail: a score or a count of seeds over the bar that its record does not give."""
    records = {"r": {"final_score_iqm": 2.0, "final_score_ci95": [1.0, 3.0], "final_score_per_seed": [1.0, 2.0, 3.0]}}
    good = "| score | bar | row |\n|---|---|---|\n| 2.0 [1.0, 3.0] | 2/3 >= 2 | [r](r.png) |\n"
    assert quoted_scores(good, records) == []
    assert quoted_scores(good.replace("2.0 [", "2.1 ["), records) == ["line 3 (r)"]
    assert quoted_scores(good.replace("2/3 >= 2", "3/3 >= 2"), records) == ["line 3 (r)"]


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_every_quoted_score_is_its_records(page):
    """What a reader publishes from: each results row a guide quotes gives the figures of the record it links."""
    records = {json.loads(line)["name"]: json.loads(line) for line in ROW_RECORDS.read_text().splitlines()}
    wrong = quoted_scores(page.read_text(), records)
    assert not wrong, f"{page.name}: figures that differ from their learning-rows.jsonl records: {wrong}"
