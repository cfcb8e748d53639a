"""Compare a map's Redis copy with the state its durable copies say it should hold, key by
key (``restore.expected_state``): digests of the expected entities against digests of
what Redis holds, while the map is held still."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from materializer.clients.redis import Client
from materializer.config import AppConfig
from materializer.contract.control import MapControl
from materializer.contract.redis_layout import physical_name
from materializer.contract.watermark import Watermark
from materializer.redis.map_keys import entity_values
from materializer.restore.changelog_tail import Tail, read_tail
from materializer.restore.expected_state import ExpectedState, fold_watermark


def value_digest(value: bytes) -> bytes:
    """A short hash of an entity's bytes: maps of key to digest compare a million entities
    without holding their JSON twice."""
    return hashlib.blake2b(value, digest_size=16).digest()


@dataclass
class Differences:
    """Keys of one kind of difference: the first few, and how many in all."""

    count: int = 0
    first: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    """What one copy of a map holds that another does not, or holds otherwise."""

    missing: Differences
    extra: Differences
    different: Differences

    @property
    def identical(self) -> bool:
        """No difference of any kind."""
        return not (self.missing.count or self.extra.count or self.different.count)


@dataclass
class VerifyReport:
    """Redis against the expected state: counts, differing keys, and the watermarks."""

    map_name: str
    generation: int
    physical: str
    paused: bool
    table_version: int | None
    table_rows: int
    tail: Tail
    expected: int
    actual: int
    stores: Comparison
    """Redis against the Delta table and changelog tail."""
    expected_watermark: Watermark | None
    actual_watermark: Watermark | None
    replayed: Comparison | None = None
    """A fold replayed from Kafka up to Redis's watermark against Redis (``--replay``)."""

    @property
    def watermark_matches(self) -> bool:
        """Batch, offsets and writer agree (the time is the writer's clock, never compared)."""
        return _watermark_identity(self.expected_watermark) == _watermark_identity(
            self.actual_watermark
        )

    @property
    def identical(self) -> bool:
        """Every entity and the watermark as expected."""
        return (
            self.stores.identical
            and self.watermark_matches
            and (self.replayed is None or self.replayed.identical)
        )


def _expired_keys(config: AppConfig, map_name: str, generation: int) -> set[str]:
    """Keys whose last changelog record is an expiry's tombstone (none without ``ttl.redis``);
    the whole compacted changelog is read, which keeps tombstones for a while only."""
    from materializer.config.names import changelog_topic

    map_config = config.map(map_name)
    if map_config.ttl is None or map_config.ttl.redis is None:
        return set()
    return read_tail(config.kafka, changelog_topic(config, map_name, generation), None).expired


def _watermark_identity(
    mark: Watermark | None,
) -> tuple[int, dict[str, dict[int, int]], str] | None:
    return None if mark is None else (mark.batch_id, mark.offsets, mark.app_id)


def verify(
    config: AppConfig,
    map_name: str,
    client: Client,
    *,
    generation: int | None = None,
    show: int = 10,
    replay: Callable[[dict[str, dict[int, int]]], dict[str, bytes]] | None = None,
    on_start: Callable[[ExpectedState], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Compare the map's Redis copy with its expected state, key by key, under the same hold.

    ``replay`` folds the map's topics again up to the given offsets and returns
    the digests it found (``ops.replay``); Redis is compared with that too,
    less the keys ``ttl.redis`` expired (their last changelog record is an
    expiry's tombstone), which a replay cannot know of. ``on_start`` is told the
    expected state once the map is held still, ``on_progress`` how many of its
    source rows were just read (an exception from either ends the comparison
    and releases the hold).
    """
    config.map(map_name)
    control = MapControl(client, map_name)
    gen = control.generation() if generation is None else generation
    physical = physical_name(map_name, gen)
    with control.held() as paused:
        state = ExpectedState.open(config, map_name, gen)
        if on_start is not None:
            on_start(state)
        expected: dict[str, bytes] = {}
        for batch in state.batches():
            for key, value in zip(batch.keys.to_pylist(), batch.values.to_pylist(), strict=True):
                expected[key] = value_digest(value)
            if on_progress is not None:
                on_progress(batch.source_rows)
        actual = redis_digests(client, physical)
        actual_watermark = control.watermark(gen)
        expected_watermark = fold_watermark(config, physical)
    # Redis was read at its watermark; the replay stops at the same offsets, so the
    # map need not stay still while it runs.
    replayed = None
    if replay is not None and actual_watermark is not None:
        digests = replay(actual_watermark.offsets)
        for key in _expired_keys(config, map_name, gen):
            digests.pop(key, None)
        replayed = compare(digests, actual, show)
    return VerifyReport(
        map_name=map_name,
        generation=gen,
        physical=physical,
        paused=paused,
        table_version=state.table_version,
        table_rows=state.table_rows,
        tail=state.tail,
        expected=len(expected),
        actual=len(actual),
        stores=compare(expected, actual, show),
        expected_watermark=expected_watermark,
        actual_watermark=actual_watermark,
        replayed=replayed,
    )


def redis_digests(client: Client, physical: str) -> dict[str, bytes]:
    """Key to value digest of every entity of one copy of a map in Redis."""
    prefix = len(physical) + 1
    digests: dict[str, bytes] = {}
    for keys, values in entity_values(client, physical):
        for key, value in zip(keys, values, strict=True):
            if value is not None:
                digests[key[prefix:].decode()] = value_digest(value)
    return digests


def compare(expected: dict[str, bytes], actual: dict[str, bytes], show: int) -> Comparison:
    """Keys missing from ``actual``, extra in it, and with another value."""
    return Comparison(
        missing=_first(expected.keys() - actual.keys(), show),
        extra=_first(actual.keys() - expected.keys(), show),
        different=_first(
            {k for k in expected.keys() & actual.keys() if expected[k] != actual[k]}, show
        ),
    )


def _first(keys: set[str], show: int) -> Differences:
    return Differences(len(keys), sorted(keys)[:show])
