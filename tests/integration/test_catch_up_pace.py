"""A map that starts far behind while another folds live catches up in small batches at a
pace, then runs as usual; alone, it takes its backlog whole."""

from __future__ import annotations

import uuid
from pathlib import Path

import redis

from materializer.config import parse_config
from materializer.contract.control import Control
from materializer.run.supervised import SupervisedMap
from materializer.run.supervisor import Supervisor
from materializer.runtime.progress import BatchLog
from materializer.testing.reference import fold_latest
from materializer.testing.waiting import wait_until
from tests.helpers.slices import FIELDS, SCHEMA, redis_map, slice_config
from tests.integration.test_opening import _events

BOUND = 1_000


def _loop(supervisor: Supervisor, maps: list[SupervisedMap]) -> None:
    """One turn of the run's loop."""
    for m in maps:
        supervisor.step(m, Control())


def test_a_backlog_beside_a_live_map_is_folded_in_bounded_batches_then_as_usual(
    spark, kafka_bootstrap, redis_url, redis_client: redis.Redis, new_topic, tmp_path: Path
):
    live_topic, behind_topic = new_topic(1), new_topic(2)
    live, behind = f"live{uuid.uuid4().hex[:6]}", f"back{uuid.uuid4().hex[:6]}"
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, live_topic, map_name=live)
    doc["maps"][behind] = {
        "source": {"topics": [behind_topic], "schema": SCHEMA},
        "key": "id",
        "changelog": {"topic": f"{behind}.changelog"},
        "catch_up": {"ready_lag": 100, "max_records_per_batch": BOUND},
    }
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
