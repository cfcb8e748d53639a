"""The real-time path's figures as Redis keeps them between its writers and the run: what
several writers add with ``live.freshness.ADD`` (as ``io.materializer.live.Figures``
calls it) is taken once, equal to the freshness of all their records counted in one
place (``runtime.freshness``), then gone."""

from __future__ import annotations

import random

import numpy as np
import redis

from materializer.contract.redis_layout import live_freshness_key
from materializer.live.freshness import ADD, take
from materializer.runtime.freshness import BOUNDS_US, Freshness


def _add(client: redis.Redis, name: str, stamps_us: list[int], landed_us: int, dead: int) -> None:
    """One writer's flush, its arguments built as the writer builds them."""
    ages = [max(0, landed_us - t) for t in stamps_us]
    buckets = np.bincount(np.searchsorted(BOUNDS_US, ages), minlength=len(BOUNDS_US) + 1)
    pairs = [x for b, n in enumerate(buckets) if n for x in (b, int(n))]
    newest = max(stamps_us, default=-1)
    top = max(ages, default=-1)
    client.eval(ADD, 1, live_freshness_key(name), newest, top, sum(ages), dead, *pairs)


def test_what_writers_add_is_taken_once_as_one_freshness(redis_client: redis.Redis) -> None:
    rng = random.Random(3)
    name = f"fresh{rng.randrange(10**9)}"
    landed = 1_800_000_000_000_000
    flushes = [[landed - rng.randrange(1, 5_000_000) for _ in range(200)] for _ in range(3)]
    flushes.append([])  # a writer that only sent dead letters
    for i, stamps in enumerate(flushes):
        _add(redis_client, name, stamps, landed, dead=i)
    taken = take(redis_client, [name, f"{name}-none"])
    assert list(taken) == [name]  # a map with nothing counted is left out
    everything = [t for stamps in flushes for t in stamps]
    expected = Freshness.of(np.array(everything), landed)
    assert taken[name].freshness == expected
    assert taken[name].newest_timestamp_us == max(everything)
    assert taken[name].dead_letters == 0 + 1 + 2 + 3
    assert take(redis_client, [name]) == {}  # taken once
    assert not redis_client.exists(live_freshness_key(name))


def test_dead_letters_alone_give_no_freshness(redis_client: redis.Redis) -> None:
    name = f"fresh{random.randrange(10**9)}"
    _add(redis_client, name, [], 0, dead=2)
    taken = take(redis_client, [name])[name]
    assert (taken.freshness, taken.newest_timestamp_us, taken.dead_letters) == (None, None, 2)
