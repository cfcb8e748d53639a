"""The run's periodic threads meet a Redis that is away, then back: a history recorder
warns once from its own logger, writes nothing meanwhile, says when it writes again, and
then samples the maps it was given; a state-size measure counts a map's fold state."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis

from materializer.config import RedisConfig
from materializer.contract.redis_layout import history_key, state_key
from materializer.contract.status import MapReport
from materializer.redis.state_size import StateSize, StateSizes
from materializer.runtime.history import HistoryRecorder, Intervals
from materializer.testing.redis import RedisServer
from materializer.testing.waiting import wait_until

HISTORY_LOGGER = "materializer.runtime.history"


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == HISTORY_LOGGER and text in r.getMessage()]


def test_history_warns_once_while_redis_is_away_and_says_when_it_writes_again(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    server = RedisServer(workdir=tmp_path)
    recorder = HistoryRecorder(RedisConfig(url=server.url), Intervals(), 0.05, max_len=100)
    recorder.reported({"orders": MapReport(state="running", state_keys=3)})
    with caplog.at_level(logging.INFO, logger=HISTORY_LOGGER), server:
        server.stop()  # away until it starts again on the same port
        recorder.start()
        try:
            wait_until(
                "the warning", lambda: bool(_lines(caplog, "history samples not written")), 30
            )
            server.restart_empty()
            client = redis.Redis.from_url(server.url)
            wait_until("a sample", lambda: client.xlen(history_key("orders")) > 0, 30)
            wait_until(
                "the recovery line",
                lambda: bool(_lines(caplog, "history samples written again")),
                30,
            )
        finally:
            recorder.stop()  # before the server stops: its end is no outage
        fields = client.xrange(history_key("orders"), count=1)[0][1]
        client.close()
    warnings = _lines(caplog, "history samples not written")
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert warnings[0].levelno == logging.WARNING
    assert "(lost until Redis answers)" in warnings[0].getMessage()
    assert len(_lines(caplog, "history samples written again")) == 1
    assert fields[b"state_keys"] == b"3"


def test_state_sizes_count_a_maps_fold_state(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    name = "sizes-of-orders"
    keys = [state_key(name, f"k{i}") for i in range(25)]
    client.mset({k: b"x" * 40 for k in keys})
    measured: dict[str, StateSize] = {}
    sizes = StateSizes(RedisConfig(url=redis_url), lambda: {name: name}, measured.__setitem__, 60)
    sizes.start()
    try:
        wait_until("a measure", lambda: name in measured, 30)
    finally:
        sizes.stop()
        client.delete(*keys)
        client.close()
    assert measured[name].keys == 25
    assert measured[name].bytes >= 25 * 40
    assert sizes.latest[name] == measured[name]
