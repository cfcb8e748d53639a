"""``test_live_run``'s maps, each in a real-time query of its own
(``spark.live_maps_per_query: 1``), stopped by SIGHUP to the whole process group (a
terminal closed): the same checks but the kill -9 (``test_live_run``'s shared query takes
it), and another map's query never starts again while one map is paused, resumed and
restored."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis

from tests.integration.test_live_run import realtime_maps_equal_the_reference

pytestmark = pytest.mark.integration


def test_realtime_maps_in_queries_of_their_own_equal_the_reference(
    kafka_bootstrap: str, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    realtime_maps_equal_the_reference(
        kafka_bootstrap, redis_url, redis_client, tmp_path, 1, signal.SIGHUP, kill=False
    )
