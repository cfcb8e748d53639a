"""A map that starts far behind while another folds live catches up in small batches at a
pace, then runs as usual; alone, it takes its backlog whole.

The first tests drive the run's supervisor one turn at a time; the last starts
``materializer run`` as users do and watches it from outside: Redis, the run's
report and its log."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from materializer.config import parse_config
from materializer.contract.control import Control
from materializer.contract.redis_layout import status_key
from materializer.contract.status import MapReport
from materializer.job import OPENING_RECORDS
from materializer.run.supervised import SupervisedMap
from materializer.run.supervisor import Supervisor
from materializer.runtime.progress import BatchLog
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import wait_until
from tests.helpers.runs import config_file, fold_batches, materializer_run, records_per_batch
from tests.helpers.slices import FIELDS, SCHEMA, Produced, redis_map, slice_config, watermark
from tests.integration.test_opening import _events

BOUND = 1_000


def _beside_live(
    tmp: Path, kafka: str, redis_url: str, live_topic: str, behind_topic: str
) -> tuple[dict[str, Any], str, str]:
    """A config of two maps, and their names: one on ``live_topic``, and one on
    ``behind_topic`` that folds at most ``BOUND`` records a batch while it catches up."""
    live, behind = f"live{uuid.uuid4().hex[:6]}", f"back{uuid.uuid4().hex[:6]}"
    doc = slice_config(tmp, kafka, redis_url, live_topic, map_name=live)
    doc["maps"][behind] = {
        "source": {"topics": [behind_topic], "schema": SCHEMA},
        "key": "id",
        "changelog": {"topic": f"{behind}.changelog.{uuid.uuid4().hex[:8]}"},
        "catch_up": {"ready_lag": 100, "max_records_per_batch": BOUND},
    }
    return doc, live, behind


def _loop(supervisor: Supervisor, maps: list[SupervisedMap]) -> None:
    """One turn of the run's loop."""
    for m in maps:
        supervisor.step(m, Control())


def test_a_backlog_beside_a_live_map_is_folded_in_bounded_batches_then_as_usual(
    spark, kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    live_topic, behind_topic = new_topic(1), new_topic(2)
    doc, live, behind = _beside_live(tmp_path, kafka_bootstrap, redis_url, live_topic, behind_topic)
    cfg = parse_config(doc)
    supervisor = Supervisor(spark, cfg, BatchLog())
    a, b = SupervisedMap(live), SupervisedMap(behind)
    supervisor.maps = {live: a, behind: b}
    try:
        supervisor.start(a)
        wait_until("the live map's opening", lambda: a.queries is not None and a.queries.opened())
        _loop(supervisor, [a])
        assert a.pace is None and not a.queries.opening

        backlog = _events(kafka_bootstrap, behind_topic, 12_000)
        supervisor.start(b)
        wait_until("the opening", lambda: b.queries is not None and b.queries.opened())
        _loop(supervisor, [b])
        assert b.pace is not None, "it opened 2,000 records behind, beside a live map"
        paced = b.queries
        sizes: list[int] = []

        def caught_up() -> bool:
            _events(kafka_bootstrap, live_topic, 20)  # the live map keeps folding
            progress = paced.fold.lastProgress
            if progress is not None and progress["numInputRows"]:
                sizes.append(int(progress["numInputRows"]))
            _loop(supervisor, [a, b])
            return b.pace is None

        wait_until("the catch-up", caught_up, timeout=600)
        assert sizes and max(sizes) <= BOUND
        assert not paced.fold.isActive and b.queries is not paced and b.state == "running"
        wait_until(
            "every record of the backlog",
            lambda: redis_map(redis_client, behind) == fold_latest(backlog, "id", FIELDS),
        )
    finally:
        for m in (a, b):
            if m.queries is not None:
                m.queries.stop()


def test_a_backlog_alone_is_not_paced(
    spark, kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    topic = new_topic(2)
    name = f"alone{uuid.uuid4().hex[:6]}"
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topic, map_name=name)
    doc["maps"][name]["catch_up"] = {"ready_lag": 100, "max_records_per_batch": BOUND}
    supervisor = Supervisor(spark, parse_config(doc), BatchLog())
    m = SupervisedMap(name)
    supervisor.maps = {name: m}
    try:
        events = _events(kafka_bootstrap, topic, 12_000)
        supervisor.start(m)
        wait_until("the opening", lambda: m.queries is not None and m.queries.opened())
        _loop(supervisor, [m])
        assert m.pace is None
        wait_until(
            "every record",
            lambda: redis_map(redis_client, name) == fold_latest(events, "id", FIELDS),
        )
        progress = m.queries.fold.lastProgress
        assert progress is not None and progress["numInputRows"] > BOUND  # the rest at once
    finally:
        if m.queries is not None:
            m.queries.stop()


BACKLOG = 20_000
"""Records waiting for the backlog map when it starts: its opening batch takes
``OPENING_RECORDS``, the rest folds ``BOUND`` a batch, ten batches."""
BURST = 20
"""Records fed to the live map at a time, each a key of its own."""


@pytest.mark.timeout(900)
def test_a_run_keeps_its_live_map_folding_while_another_catches_up_at_a_pace(
    kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    """Both maps start with the run. Whether the backlog map catches up at a pace is decided
    when its opening batch ends, by the maps folding live then: the live map counts from
    its own opening on, whichever of the two openings ends first (they share the cores)."""
    live_topic, behind_topic = new_topic(1), new_topic(2)
    doc, live, behind = _beside_live(tmp_path, kafka_bootstrap, redis_url, live_topic, behind_topic)
    config = config_file(doc, tmp_path)
    fed = Produced(kafka_bootstrap, live_topic, redis_client, keys=10**9)
    backlog = Produced(kafka_bootstrap, behind_topic, redis_client, keys=4_000)
    backlog.produce(BACKLOG)
    fed.produce(BURST)
    # Each time the live map held every record fed to it so far: the records the backlog
    # map had folded by its watermark, and its report.
    seen: list[tuple[int, MapReport | None]] = []
    with materializer_run(config) as proc:

        def live_folds() -> None:
            fed.produce(BURST)  # records the run had not seen when it started
            wait_until(
                "the live map to fold every record fed to it",
                lambda: redis_map(redis_client, live) == fed.expected(),
                timeout=300,
                alive=proc.alive,
            )

        while not backlog.folded(behind):
            live_folds()
            mark = watermark(redis_client, behind)
            folded = 0 if mark is None else sum(mark.offsets.get(behind_topic, {}).values())
            seen.append((folded, MapReport.from_hash(redis_client.hgetall(status_key(behind)))))
        wait_until("the live map's watermark", lambda: fed.folded(live), alive=proc.alive)
        wait_until(
            "the backlog map to run as usual",
            lambda: re.search(rf"map {behind}: [^\n]*, running as usual", proc.log()) is not None,
            alive=proc.alive,
        )
    log = proc.log()

    # The live map held its new records, again and again, at moments the backlog map was
    # past its opening batch, short of its end, and reported catching up.
    catching_up = [
        (folded, report.records_left)
        for folded, report in seen
        if OPENING_RECORDS < folded < BACKLOG
        and report is not None
        and report.state == "catching_up"
        and report.records_left > 0
    ]
    assert len(catching_up) >= 2, seen

    # The backlog map paced: its opening batch, then batches of at most BOUND records until
    # it caught up, said so and ran as usual.
    assert f"map {behind} opening: one batch of its fold first" in log
    assert f"map {behind}: caught up, running as usual" in log, log[-3000:]
    sizes = records_per_batch(fold_batches(redis_client, behind))
    assert sizes[0] == OPENING_RECORDS, sizes
    assert len(sizes) > 1 and max(sizes[1:]) <= BOUND, sizes
    assert sum(sizes) == BACKLOG

    # Both end exactly as the reference fold of every record.
    assert redis_map(redis_client, behind) == backlog.expected()
    assert redis_map(redis_client, live) == fed.expected()
