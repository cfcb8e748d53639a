"""The real-time path's fold figures: how fresh each record was when Redis held it, the
newest Kafka timestamp folded and the dead letters sent, counted by the writers in Spark's
tasks and taken by the run into the map's metrics, as a micro-batch's ``Applied`` is.

A writer counts ages into the buckets of ``runtime.freshness`` (their bounds travel in
its spec, so both paths count alike) and adds what it counted to the map's
``<map>\\0f:`` hash (``redis_layout.live_freshness_key``) at most every
``FLUSH_EVERY_MS`` and when its task ends, with ``ADD``. The run takes the hashes of its
real-time maps once a loop (``take``): read and deleted in one transaction, so no count
is taken twice or lost between the two. The fields:

- ``b<i>``: records whose age fell in bucket ``i`` of ``BOUNDS_US``;
- ``sum_us``, ``max_us``: their ages' sum and maximum, microseconds;
- ``newest_us``: the newest Kafka timestamp folded, microseconds since the epoch;
- ``dead``: dead letters sent.

Figures only: a record a crash makes the writer fold again is counted again, as a
replayed micro-batch's records are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from materializer.contract.redis_layout import live_freshness_key, text_fields
from materializer.runtime.freshness import BOUNDS_US, Freshness

if TYPE_CHECKING:
    from materializer.clients.redis import Client

FLUSH_EVERY_MS = 250
"""How often a writer adds its counts at most: the run takes them every loop (0.5 s)."""

ADD = """
local k = KEYS[1]
local function raise(field, value)
  if tonumber(value) > tonumber(redis.call('HGET', k, field) or '-1') then
    redis.call('HSET', k, field, value)
  end
end
raise('newest_us', ARGV[1])
raise('max_us', ARGV[2])
redis.call('HINCRBY', k, 'sum_us', ARGV[3])
redis.call('HINCRBY', k, 'dead', ARGV[4])
for i = 5, #ARGV, 2 do
  redis.call('HINCRBY', k, 'b' .. ARGV[i], ARGV[i + 1])
end
"""
"""The writer's call (``EVAL``, key: the map's hash; arguments: newest timestamp, maximum
age, sum of ages, dead letters, then bucket and count pairs); -1 for none of a maximum."""


def writer_spec() -> dict[str, object]:
    """What the writer's spec carries of this: the script, the buckets and how often."""
    return {
        "freshnessScript": ADD,
        "freshnessBounds": [int(b) for b in BOUNDS_US],
        "freshnessEveryMs": FLUSH_EVERY_MS,
    }


@dataclass(frozen=True)
class Folded:
    """What a map's writers counted since the last take."""

    newest_timestamp_us: int | None
    dead_letters: int
    freshness: Freshness | None


def parse(fields: dict[str, str]) -> Folded:
    """A ``<map>\\0f:`` hash's fields, as ``text_fields`` gives them."""
    counts = [0] * (len(BOUNDS_US) + 1)
    for name, value in fields.items():
        if name.startswith("b"):
            counts[int(name[1:])] += int(value)
    freshness = None
    if any(counts):
        freshness = Freshness(
            tuple(counts), int(fields.get("sum_us", 0)), max(0, int(fields.get("max_us", 0)))
        )
    newest = int(fields.get("newest_us", -1))
    return Folded(None if newest < 0 else newest, int(fields.get("dead", 0)), freshness)


def take(client: Client, names: Iterable[str]) -> dict[str, Folded]:
    """The counts of the maps ``names`` since the last take, removed; maps with none left
    out. One round trip for them all (the real-time path runs on one Redis server)."""
    names = list(names)
    if not names:
        return {}
    pipe = client.pipeline(transaction=True)
    for name in names:
        pipe.hgetall(live_freshness_key(name))
        pipe.delete(live_freshness_key(name))
    replies = pipe.execute()
    return {
        name: parse(text_fields(raw)) for name, raw in zip(names, replies[::2], strict=True) if raw
    }
