"""BENCHMARKS.md stays a page a reader can trust: at most 300 lines, a section with its
command and one table for every suite in bench/, every figure dated, every line without
one saying since which change, and the table of goals at the top what ``tools.benchmarks``
makes of the suites' tables.

The page is read here with a parser of its own, so a generator that drops or reorders
a line fails the comparison with the committed table.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tools import benchmarks

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "BENCHMARKS.md"
MAX_LINES = 300
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
NOT_MEASURED = re.compile(r"not measured since \S.* \(\d{4}-\d{2}-\d{2}[^)]*\)")
SUITE_COLUMNS = ["measure", "today", "goal", "goal met?", "measured"]
SUMMARY = "Where the goals stand"


@pytest.fixture(scope="module")
def text() -> str:
    return PAGE.read_text(encoding="utf-8")


def _sections(text: str) -> dict[str, str]:
    """Each ``## `` section's title and body."""
    parts = re.split(r"^## (.*)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _rows(body: str) -> list[list[str]]:
    """A section's table rows (header and rule left out), cells stripped."""
    rows = [line for line in body.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip()[1:-1].split("|")] for row in rows[2:]]


def _header(body: str) -> list[str]:
    first = next(line for line in body.splitlines() if line.startswith("|"))
    return [c.strip() for c in first.strip()[1:-1].split("|")]


def _suite_sections(text: str) -> dict[str, str]:
    """The suites' sections by suite: the heading's text after its last dash."""
    found = {}
    for title, body in _sections(text).items():
        if title != SUMMARY:
            assert " — " in title, f"the section {title!r} does not name its suite after a dash"
            found[title.rsplit(" — ", 1)[1]] = body
    return found


def _runnable_suites() -> list[str]:
    """The scripts of bench/ that run on their own (the others are their shared parts)."""
    found = []
    for path in sorted((REPO / "bench").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(
            isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body
        ):
            found.append(f"`bench/{path.name}`")
    return found


def test_the_page_is_at_most_300_lines(text: str) -> None:
    assert len(text.splitlines()) <= MAX_LINES, "BENCHMARKS.md is longer than 300 lines"


def test_every_suite_has_a_section_with_its_command(text: str) -> None:
    suites = _suite_sections(text)
    runnable = _runnable_suites()
    assert len(runnable) >= 10, "bench/ was not found, or its scripts lost their main"
    missing = [s for s in runnable if s not in suites]
    assert not missing, f"suites without a section: {missing}"
    for suite in runnable:
        command = f".venv/bin/python {suite.strip('`')}"
        assert command in suites[suite], f"{suite}'s section does not give its command"
    unknown = [s for s in suites if s.startswith("`bench/") and s not in runnable]
    assert not unknown, f"sections for scripts bench/ does not run: {unknown}"


def test_every_suite_has_one_table_of_its_lines(text: str) -> None:
    for suite, body in _suite_sections(text).items():
        assert _header(body) == SUITE_COLUMNS, f"{suite}: columns {_header(body)}"
        rows = _rows(body)
        assert rows, f"{suite}: no lines"
        table_lines = [i for i, line in enumerate(body.splitlines()) if line.startswith("|")]
        assert table_lines == list(range(table_lines[0], table_lines[-1] + 1)), (
            f"{suite}: more than one table"
        )
        for row in rows:
            assert len(row) == len(SUITE_COLUMNS), f"{suite}: {row}"


def test_a_figure_has_its_date_and_a_line_without_one_says_since_when(text: str) -> None:
    for suite, body in _suite_sections(text).items():
        for measure, today, goal, met, measured in _rows(body):
            where = f"{suite}, {measure!r}"
            if measured == "—":
                assert NOT_MEASURED.fullmatch(today), (
                    f"{where}: no date, and no 'not measured since <change> (<date>)'"
                )
                assert met == "—", f"{where}: not measured, yet {met!r}"
                continue
            assert DATE.fullmatch(measured), f"{where}: measured {measured!r} is not a date"
            assert "not measured" not in today, f"{where}: dated, yet {today!r}"
            expected = {"—"} if goal == "—" else {"met", "missed"}
            assert met in expected, f"{where}: goal {goal!r} but goal met? {met!r}"


def test_the_table_of_goals_is_every_line_with_a_goal(text: str) -> None:
    """The committed summary against the suites' lines, as this test reads them."""
    expected = [
        [suite, measure, goal, today, met, measured]
        for suite, body in _suite_sections(text).items()
        for measure, today, goal, met, measured in _rows(body)
        if goal != "—"
    ]
    summary = _sections(text)[SUMMARY]
    assert _header(summary) == ["suite", "measure", "goal", "today", "goal met?", "measured"]
    assert _rows(summary) == expected
    assert len(expected) >= 10


def test_the_table_of_goals_is_what_the_tool_writes(text: str) -> None:
    assert benchmarks.page(text) == text, (
        "BENCHMARKS.md's table of goals is stale: run `python -m tools.benchmarks` and commit it"
    )


SAMPLE = f"""# Benchmarks

## Where the goals stand

{benchmarks.NOTICE}

| suite | measure | goal | today | goal met? | measured |
|---|---|---|---|---|---|
| `bench/old.py` | gone | ≥ 1 | 2 | met | 2026-01-01 |

Prose after the table stays.

## One — `bench/one.py`

| measure | today | goal | goal met? | measured |
|---|---|---|---|---|
| rate | 5 events/s | ≥ 4 events/s | met | 2026-02-02 |
| size | 3 bytes | — | — | 2026-02-02 |

## Two — `bench/two.py`

| measure | today | goal | goal met? | measured |
|---|---|---|---|---|
| ratio | not measured since a change (2026-03-03) | ≥ 0.5 | — | — |
"""


def test_the_tool_rewrites_only_the_table_of_goals() -> None:
    written = benchmarks.page(SAMPLE)
    summary = _sections(written)[SUMMARY]
    assert _rows(summary) == [
        ["`bench/one.py`", "rate", "≥ 4 events/s", "5 events/s", "met", "2026-02-02"],
        [
            "`bench/two.py`",
            "ratio",
            "≥ 0.5",
            "not measured since a change (2026-03-03)",
            "—",
            "—",
        ],
    ]
    assert "Prose after the table stays." in summary
    before, after = SAMPLE.split("## One", 1), written.split("## One", 1)
    assert before[1] == after[1], "the suites' sections were changed"
    assert benchmarks.page(written) == written


def test_the_tool_refuses_a_row_of_the_wrong_width() -> None:
    broken = SAMPLE.replace("| size | 3 bytes |", "| size | 3 | bytes |")
    with pytest.raises(benchmarks.PageError, match="a row of 6 cells"):
        benchmarks.page(broken)


def test_the_tool_refuses_a_section_without_its_suite() -> None:
    broken = SAMPLE.replace("## Two — `bench/two.py`", "## Two")
    with pytest.raises(benchmarks.PageError, match="no suite"):
        benchmarks.page(broken)
