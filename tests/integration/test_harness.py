"""The service fixtures stop what they start, even when the body fails."""

from __future__ import annotations

import os

import pytest
import redis

from materializer.testing import KafkaBroker, RedisServer
from materializer.testing.ports import port_open


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_redis_server_stops_when_the_body_raises():
    server = RedisServer()
    with pytest.raises(RuntimeError), server:
        assert redis.Redis.from_url(server.url).ping()
        pid = server._proc.proc.pid  # type: ignore[union-attr]
        raise RuntimeError("a failing test")
    assert _gone(pid)
    assert not port_open(server.port)


def test_kafka_broker_stops_and_removes_its_storage_when_the_body_raises():
    broker = KafkaBroker()
    with pytest.raises(RuntimeError), broker:
        pid = broker._proc.proc.pid  # type: ignore[union-attr]
        workdir = broker._workdir
        assert workdir is not None and (workdir / "data").is_dir()
        raise RuntimeError("a failing test")
    assert _gone(pid)
    assert not port_open(broker.port)
    assert not workdir.exists()
