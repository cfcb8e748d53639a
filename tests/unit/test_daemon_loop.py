"""The one periodic thread of the run's trackers: rounds go on after any failure, a
service away is warned of once and its return said once, and a stop ends the rounds."""

from __future__ import annotations

import logging
import threading

import pytest

from materializer.runtime.daemon import DaemonLoop


class Away(Exception):
    """A service that does not answer."""


class Scripted(DaemonLoop):
    """Rounds that fail as ``script`` says (an exception to raise, or None), then succeed."""

    transient = (Away,)
    failing = "figures not measured"
    while_away = "(they stay as they were)"
    recovered = "figures measured again"

    def __init__(self, script: list[Exception | None], first_at_once: bool = True) -> None:
        super().__init__("scripted", 0.001, first_at_once=first_at_once)
        self.script = list(script)
        self.rounds = 0
        self.done = threading.Event()

    def round(self) -> None:
        self.rounds += 1
        step = self.script.pop(0) if self.script else None
        if not self.script:
            self.done.set()
        if step is not None:
            raise step


def _run(loop: Scripted) -> None:
    loop.start()
    assert loop.done.wait(30), "the rounds stopped before the script ran out"
    loop.stop()


def test_a_service_away_is_warned_of_once_and_its_return_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = Scripted([Away("down"), Away("down"), Away("down"), None, Away("again"), None])
    with caplog.at_level(logging.INFO, logger=__name__):
        _run(loop)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "figures not measured (they stay as they were): down",
        "figures measured again",
        "figures not measured (they stay as they were): again",
        "figures measured again",
    ]
    assert [r.levelno for r in caplog.records] == [
        logging.WARNING,
        logging.INFO,
        logging.WARNING,
        logging.INFO,
    ]


def test_a_bug_in_a_round_is_logged_with_its_trace_and_the_rounds_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = Scripted([ValueError("a bug"), ValueError("a bug"), None])
    with caplog.at_level(logging.INFO, logger=__name__):
        _run(loop)
    assert loop.rounds >= 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == ["figures not measured: a bug"] * 2
    assert {r.name for r in caplog.records} == {__name__}
    assert all(r.exc_info is not None for r in errors)


def test_a_stop_ends_the_rounds_and_the_thread() -> None:
    loop = Scripted([None])
    _run(loop)
    assert loop.stopping
    assert not loop._thread.is_alive()


def test_rounds_that_start_one_interval_late_never_run_when_stopped_first() -> None:
    loop = Scripted([None], first_at_once=False)
    loop._interval = 3600.0
    loop.start()
    loop.stop()
    assert loop.rounds == 0
