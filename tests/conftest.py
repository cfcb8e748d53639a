"""The test session: real services, Spark and a browser as fixtures (``tests/fixtures/``),
and the order the longest files run in on two workers."""

from __future__ import annotations

import signal

import pytest

pytest_plugins = [
    "tests.fixtures.services",
    "tests.fixtures.spark",
    "tests.fixtures.helm_chart",
    "tests.fixtures.browser",
]


RUNS = (
    "test_exactly_once.py",  # three crashes of a run with two maps and two enrichments
    "test_operations.py",  # one run walked through pause, rehydrate, rebuild and restart
    "test_demo.py",
    "test_run.py",
    "test_source_loss.py",  # a run whose maps lost source records, and their way out
    "test_catch_up.py",  # a run catching up on a backlog, watched by every viewer
)
"""Test files that start ``materializer run`` (a JVM of its own, many queries): the longest.

With two workers (``make test``) they run one after the other on one worker,
first, while the other worker takes every other file: two such runs at once
on two cores would starve each other's micro-batches."""


CLUSTERS = ("test_scale_kafka.py", "test_scale_spark.py")
"""The next longest: a three-node Kafka cluster, and a Spark standalone cluster with a run
of its own. They start first on the other worker."""


def pytest_configure(config: pytest.Config) -> None:
    """The runs the tests start see SIGHUP as a terminal's children do, even when the suite
    itself runs under ``nohup``: a run started with SIGHUP ignored keeps ignoring it (as
    ``nohup materializer run`` must), and the tests that close a terminal send it."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return 0 if item.path.name in RUNS else 1 if item.path.name in CLUSTERS else 2

    items.sort(key=rank)  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadFileScheduling

    class RunsTogether(LoadFileScheduling):
        """Files as units of work, the ``RUNS`` files together as one."""

        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "materializer-runs" if scope.rsplit("/", 1)[-1] in RUNS else scope

    return RunsTogether(config, log)
