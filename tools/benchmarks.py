"""BENCHMARKS.md's table of goals, generated from the suites' own tables.

Each suite's section ends its heading with the suite (``— `bench/live.py```) and holds
one table of its lines: measure, today's figure, goal, whether the figure meets it, and
the date of the run. The table at the top of the page repeats every line that has a
goal, with its figure and date, so a reader sees where the goals stand without two
copies to keep in step: edit a suite's lines, then run ``python -m tools.benchmarks``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import pages

TOOL = "benchmarks"
PAGE = pages.REPO_ROOT / "BENCHMARKS.md"

SUITE_HEADER = ("measure", "today", "goal", "goal met?", "measured")
"""The columns of every suite's table."""
SUMMARY_HEADER = ("suite", "measure", "goal", "today", "goal met?", "measured")
SUMMARY_HEADING = "## Where the goals stand"
NOTICE = (
    "<!-- Generated from the suites' tables below by `python -m tools.benchmarks`: "
    "edit those and run it again, not this table. -->"
)
NO_GOAL = "—"
"""A goal cell with nothing to meet: the line is informational, and not in the summary."""
SUITE_MARK = " — "
"""What comes before the suite's name in its section's heading."""


class PageError(ValueError):
    """The page is not laid out as this tool reads it; the message says where."""


@dataclass(frozen=True)
class Line:
    """One row of a suite's table, its cells as Markdown."""

    suite: str
    measure: str
    today: str
    goal: str
    met: str
    measured: str


def cells(row: str) -> list[str]:
    """A table row's cells. No cell carries a raw pipe (``tools.pages``), so a row splits on
    every one; a stray pipe shows up as a row of the wrong width."""
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def sections(text: str) -> list[tuple[str, list[str]]]:
    """Each ``## `` heading with the lines under it, up to the next one."""
    found: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            found.append((line, []))
        elif found:
            found[-1][1].append(line)
    return found


def suite_lines(text: str) -> list[Line]:
    """Every suite's rows, in the page's order."""
    lines: list[Line] = []
    for heading, body in sections(text):
        if heading == SUMMARY_HEADING:
            continue
        if SUITE_MARK not in heading:
            raise PageError(f"{heading!r}: no suite after {SUITE_MARK.strip()!r}")
        suite = heading.rsplit(SUITE_MARK, 1)[1].strip()
        rows = _table(body, heading)
        lines += [Line(suite, *row) for row in rows]
    return lines


def _table(body: Sequence[str], heading: str) -> list[list[str]]:
    """The rows of the one table under a suite's heading, checked against ``SUITE_HEADER``."""
    starts = [i for i, line in enumerate(body) if line.startswith("|")]
    if not starts:
        raise PageError(f"{heading!r}: no table")
    first = starts[0]
    if tuple(cells(body[first])) != SUITE_HEADER:
        raise PageError(f"{heading!r}: the table's columns are not {' | '.join(SUITE_HEADER)}")
    rows: list[list[str]] = []
    end = first + 2
    while end < len(body) and body[end].startswith("|"):
        row = cells(body[end])
        if len(row) != len(SUITE_HEADER):
            raise PageError(f"{heading!r}: a row of {len(row)} cells: {body[end]}")
        rows.append(row)
        end += 1
    if any(line.startswith("|") for line in body[end:]):
        raise PageError(f"{heading!r}: more than one table")
    return rows


def summary(lines: Sequence[Line]) -> str:
    """The table of goals: every line that has one, with its suite, figure and date."""
    return pages.table(
        SUMMARY_HEADER,
        (
            [line.suite, line.measure, line.goal, line.today, line.met, line.measured]
            for line in lines
            if line.goal != NO_GOAL
        ),
    )


def page(text: str) -> str:
    """``text`` with its table of goals made again from its suites' tables."""
    lines = text.splitlines()
    try:
        at = lines.index(SUMMARY_HEADING)
    except ValueError:
        raise PageError(f"no {SUMMARY_HEADING!r} section") from None
    if lines[at + 1 : at + 4] != ["", NOTICE, ""]:
        raise PageError(f"{SUMMARY_HEADING!r} must start with a blank line, {NOTICE}, a blank")
    start = at + 4
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    table = summary(suite_lines(text)).splitlines()
    return "\n".join([*lines[:start], *table, *lines[end:]]) + "\n"


def pages_to_write() -> dict[Path, str]:
    """The one page this tool keeps: BENCHMARKS.md with its table of goals made again."""
    return {PAGE: page(PAGE.read_text(encoding="utf-8"))}


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or ``--check``) BENCHMARKS.md's table of goals."""
    return pages.main(
        TOOL, "Make BENCHMARKS.md's table of goals from its suites' tables.", pages_to_write, argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
