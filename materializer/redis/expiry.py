"""Expiries are changes: a key ``ttl.redis`` expired reaches the change stream and the changelog.

Redis expires a key by itself and tells no one reliably (keyspace
notifications are fire-and-forget: a materializer that is down, or
reconnecting, misses them). So each write of an expiring entity also scores
it in the map's expiry index (``layout.expiry_index_key``), and a sweep, about
once a second, asks each master for the keys whose time has come
(``EXPIRE``): Redis itself decides by the key's ``PTTL``, moves each expired
key to the map's expired set with an ``expire`` change entry, and the sweep
then sends a tombstone per key to the changelog, so the Delta table drops the
row as it would for a delete, and removes the keys from the set once Kafka
has them.

Why nothing is lost or sent out of order:

- A crash after ``EXPIRE`` and before the tombstones leaves the keys in the
  expired set; the next sweep (the next run's first) sends them. A tombstone
  sent twice deletes nothing more.
- The sweep holds the fold's lock (``RedisFold.sweep``) from ``EXPIRE`` to
  the end of its flush, and a batch holds it from its first write to the end
  of its changelog's flush. A key written again after it expired therefore
  has its upsert in the changelog after its tombstone, never before, so the
  table keeps the key Redis has.
- A key written again before the sweep finds it has a later ``PTTL``: it is
  scored again, not expired.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from materializer.clients.redis import client_for, is_cluster, master_of, masters, per_master
from materializer.contract.changelog import EXPIRED_HEADER
from materializer.contract.markers import markers
from materializer.contract.redis_layout import (
    EXPIRE_OP,
    changes_key,
    entity_key,
    expired_key,
    expiry_index_key,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from confluent_kafka import Producer

    from materializer.redis.functions import FoldTarget

log = logging.getLogger(__name__)


def expiry_ms(ttl: timedelta | None) -> int | None:
    """A TTL as whole milliseconds for ``SET .. PX`` (rounded up: at least 1); None stays None."""
    return None if ttl is None else max(1, math.ceil(ttl / timedelta(milliseconds=1)))


SWEEP_KEYS = 1000
"""Keys one ``EXPIRE`` call handles at most: a call holds its master only briefly."""

SWEEP_INTERVAL_S = 1.0
"""How often a map with ``ttl.redis`` looks for expiries: how late its changes may arrive."""


def sweep_expired(target: FoldTarget, producer: Producer) -> int:
    """Find the keys Redis expired and send them to the change stream and the changelog;
    how many tombstones were sent. The caller holds the fold's lock."""
    from materializer.redis.deliveries import Deliveries
    from materializer.redis.functions import EXPIRE, call_function

    client = client_for(target.redis)
    name = target.map_name
    cluster = is_cluster(client)
    nodes = masters(client)
    marks = markers(client, name)
    indexes = per_master(client, name, expiry_index_key)
    expired = per_master(client, name, expired_key)
    stream = changes_key(name)
    fixed = [
        b"" if cluster else stream.encode(),
        str(target.changes_max_len).encode(),
        entity_key(name, "").encode(),
    ]
    deliveries = Deliveries(producer, target)
    sent = 0
    for node_name, node in nodes.items():
        index = indexes[node_name].encode()
        args = [*fixed, marks[node_name].encode(), index, expired[node_name].encode()]
        args.append(str(SWEEP_KEYS).encode())
        while True:
            found = call_function(client, target, EXPIRE, index, args, node)
            if cluster and found:
                _append_expiries(client, stream, found, target.changes_max_len)
            if len(found) < SWEEP_KEYS:
                break
        keys = [bytes(key) for key in client.sscan_iter(expired[node_name], count=SWEEP_KEYS)]
        if not keys:
            continue
        try:
            for key in keys:
                deliveries.send(target.changelog_topic, key, None, [(EXPIRED_HEADER, b"1")])
        except BaseException:
            deliveries.abort()
            raise
        deliveries.flush()
        for start in range(0, len(keys), SWEEP_KEYS):
            client.srem(expired[node_name], *keys[start : start + SWEEP_KEYS])
        sent += len(keys)
    return sent


def _append_expiries(client: Any, stream: str, keys: list[bytes], max_len: int) -> None:
    """A cluster's change entries for keys a master expired (the stream lives on one master,
    so the function cannot append them there itself)."""
    with client.pipeline(transaction=True) as pipe:
        for key in keys:
            entry = {"key": key, "op": EXPIRE_OP, "batch_id": "-1"}
            pipe.xadd(stream, entry, maxlen=max_len, approximate=True)
        pipe.execute()


def index_expiring(client: Any, physical: str, keys: list[str], expiry_ms: list[int]) -> None:
    """Score entities written with a TTL outside the fold (rehydrate, restore) in their
    master's expiry index, as the fold's writes do.

    Scored by this machine's clock: a score early by the clocks' difference
    is scored again by the sweep, one late delays that key's expiry change.
    """
    now = int(time.time() * 1000)
    indexes = per_master(client, physical, expiry_index_key)
    by_index: dict[str, dict[str, int]] = {}
    for key, left in zip(keys, expiry_ms, strict=True):
        owner = master_of(client, entity_key(physical, key))
        by_index.setdefault(indexes[owner], {})[key] = now + left
    with client.pipeline(transaction=False) as pipe:
        for index, scores in by_index.items():
            items = list(scores.items())
            for start in range(0, len(items), SWEEP_KEYS):
                pipe.zadd(index, dict(items[start : start + SWEEP_KEYS]))
        pipe.execute()


class ExpirySweeper:
    """A thread that runs ``sweep`` every ``SWEEP_INTERVAL_S`` until ``stop``.

    A sweep that fails (Redis or Kafka away, a copy being restored) is tried
    again at the next tick: the expired set keeps what was not sent.
    """

    def __init__(self, map_name: str, sweep: Callable[[], int]) -> None:
        self.map_name = map_name
        self._sweep = sweep
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name=f"expiries-{map_name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the sweep under way, if any."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        from materializer.redis.functions import CopyLost

        while not self._stop.wait(SWEEP_INTERVAL_S):
            try:
                sent = self._sweep()
            except CopyLost:
                continue  # the run restores the copy; its expiries follow
            except Exception as exc:  # noqa: BLE001 - tried again: the expired set keeps them
                if not self._failing:
                    log.warning(
                        "map %s: could not send its expiries, trying again: %s",
                        self.map_name,
                        exc,
                    )
                self._failing = True
                continue
            if sent:
                log.debug("map %s: %d keys expired", self.map_name, sent)
            self._failing = False
