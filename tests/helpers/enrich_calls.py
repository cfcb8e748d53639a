"""Calling EnrichService.Enrich in the tests: a config serving the seeded maps
(``tests.helpers.enrich.seed_maps``), one exchange over a stream, and what Redis
counts of the commands the service ran."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import redis

from materializer.config import AppConfig, parse_config
from materializer.v1 import enrich_service_pb2 as pb
from materializer.v1 import enrich_service_pb2_grpc as pb_grpc
from tests.helpers.enrich import Maps
from tests.helpers.query_redis import map_doc

DEADLINE = 30.0


def make_config(redis_url: str, maps: Maps, **query: Any) -> AppConfig:
    return parse_config(
        {
            "redis": {"url": redis_url},
            "maps": {m: map_doc(m) for m in (maps.users, maps.companies)},
            "query": query,
        }
    )


async def exchange(
    channel: grpc.aio.Channel, requests: Sequence[pb.EnrichRequest], timeout: float = DEADLINE
) -> list[pb.EnrichResponse]:
    """Send every request without waiting for answers; collect the answers."""
    call = pb_grpc.EnrichServiceStub(channel).Enrich(iter(requests), timeout=timeout)
    return [response async for response in call]


def calls(client: redis.Redis, command: str) -> int:
    """How often Redis has run ``command``: what the service costs it, counted by Redis."""
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
