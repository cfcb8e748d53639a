"""This worker's place in the group: the work slots Kafka's group protocol gives it.

A consumer of the group's slots topic that never reads a record: its assignment is
the answer. The ``cooperative-sticky`` assignor moves only the slots that must move
on a join or a leave; a worker stopping leaves the group when it closes, so its
slots move at once, and one that stops answering loses them after
``worker.session_timeout`` (docs/decisions/0023).

The consumer is polled on a thread of its own, where its callbacks run. The run's
loop reads ``owned`` and brings its maps to it; a revocation waits (on the poll
thread, Kafka's heartbeats going on meanwhile) until the loop has stopped the maps
that go (``release``), so no two workers run a map at once in a graceful move.
A loss (``on_lost``: this worker was out of the group past its session) waits for
nothing: another worker may run the map already, and fencing keeps this one's
writes out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import AdminClient

from materializer.clients.kafka import librdkafka
from materializer.config import AppConfig

log = logging.getLogger(__name__)

POLL_S = 0.2


@dataclass(frozen=True)
class Assignment:
    """What this worker holds, as the run's loop reads it."""

    owned: frozenset[int]
    """The slots this worker runs the maps of."""
    version: int = 0
    """Grows with each change; ``Membership.release`` names the one its loop acted on."""


@dataclass
class _State:
    owned: set[int] = field(default_factory=set)
    lost: set[int] = field(default_factory=set)
    stale: dict[int, float] = field(default_factory=dict)
    """Fenced slots, with when: left out of ``owned`` until assigned anew or ``STALE_S`` on."""
    version: int = 0
    released: int = 0


class Membership:
    """This worker in the group; ``start``, read ``assignment`` every loop, ``close`` last."""

    def __init__(self, config: AppConfig, worker_id: str, topic: str) -> None:
        worker = config.worker
        assert worker.group is not None
        self.group = worker.group
        self.worker_id = worker_id
        self.topic = topic
        drain_ms = int(config.spark.stop_timeout.total_seconds() * 1000)
        self._consumer = Consumer(
            librdkafka(
                config.kafka,
                **{
                    "group.id": worker.group,
                    "client.id": worker_id,
                    "partition.assignment.strategy": "cooperative-sticky",
                    "session.timeout.ms": int(worker.session_timeout.total_seconds() * 1000),
                    "heartbeat.interval.ms": int(worker.heartbeat_interval.total_seconds() * 1000),
                    # A revocation waits for the drain, which stops polling meanwhile.
                    "max.poll.interval.ms": max(300_000, 2 * drain_ms + 60_000),
                    "enable.auto.commit": False,
                    # A map created grows the topic: the group sees the new slot soon.
                    "topic.metadata.refresh.interval.ms": 1000,
                },
            )
        )
        self._admin = AdminClient(librdkafka(config.kafka))
        self._lock = threading.Condition()
        self._state = _State()
        self._closing = threading.Event()
        self._drain_s = config.spark.stop_timeout.total_seconds() + 30.0
        self.joined = threading.Event()
        self.rebalances = 0
        self.on_change: Callable[[str, frozenset[int]], None] = lambda _why, _slots: None
        """Told of each move (``assigned``, ``revoked``, ``lost``), on the poll thread."""
        self._thread = threading.Thread(target=self._poll, name="worker-group", daemon=True)
        self._stale_s = 2 * worker.session_timeout.total_seconds() + 5.0
        """How long a fenced slot stays left out while the group still gives it to this
        worker: by then the worker that fenced it, if it was one that lost the map while
        paused, has learnt of it and stopped."""

    def start(self) -> None:
        """Join the group."""
        self._consumer.subscribe(
            [self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
        )
        self._thread.start()

    def assignment(self) -> Assignment:
        """The slots this worker holds now (fenced ones left out for a while)."""
        now = time.monotonic()
        with self._lock:
            s = self._state
            for slot in [slot for slot, at in s.stale.items() if now - at > self._stale_s]:
                del s.stale[slot]
            return Assignment(frozenset(s.owned - s.stale.keys()), s.version)

    def take_lost(self) -> frozenset[int]:
        """The slots lost since the last call (``on_lost``): their maps stop at once,
        without a drain, even if the group has given them back since."""
        with self._lock:
            lost = frozenset(self._state.lost)
            self._state.lost.clear()
            return lost

    def release(self, version: int) -> None:
        """The run's loop brought its maps to the assignment of ``version``: a revocation
        waiting for the maps to stop goes on."""
        with self._lock:
            self._state.released = max(self._state.released, version)
            self._lock.notify_all()

    def fenced(self, slot: int) -> None:
        """A map of ``slot`` was fenced: another worker claimed it, whatever this one was
        last told; it is not taken again until the group assigns it anew, or for a while."""
        with self._lock:
            self._state.stale[slot] = time.monotonic()
            self._state.version += 1

    def members(self) -> list[tuple[str, str, int]]:
        """The group's members now: (worker id, host as the broker sees it, slots held)."""
        future = self._admin.describe_consumer_groups([self.group])[self.group]
        description = future.result(30)
        return [
            (m.client_id, m.host.lstrip("/"), len(m.assignment.topic_partitions))
            for m in description.members
        ]

    def close(self) -> None:
        """Leave the group: the others take this worker's slots over at once."""
        self._closing.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=self._drain_s)
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("worker group %s: leaving it: %s", self.group, exc)

    def _poll(self) -> None:
        while not self._closing.is_set():
            try:
                self._consumer.poll(POLL_S)
            except Exception as exc:  # noqa: BLE001 - the broker away for a while; a callback's bug
                log.warning("worker group %s: %s", self.group, exc)
                self._closing.wait(1.0)

    def _assigned(self, _consumer: Any, partitions: list[Any]) -> None:
        slots = frozenset(p.partition for p in partitions)
        with self._lock:
            self._state.owned |= slots
            for slot in slots:
                self._state.stale.pop(slot, None)
            self._state.version += 1
        self.rebalances += 1
        self.joined.set()
        if slots:
            self.on_change("assigned", slots)

    def _revoked(self, _consumer: Any, partitions: list[Any]) -> None:
        slots = frozenset(p.partition for p in partitions)
        if not slots:
            return
        with self._lock:
            self._state.owned -= slots
            self._state.version += 1
            version = self._state.version
        self.on_change("revoked", slots)
        with self._lock:  # the loop stops their maps (a drain) before another worker starts them
            self._lock.wait_for(
                lambda: self._state.released >= version or self._closing.is_set(),
                timeout=self._drain_s,
            )

    def _lost(self, _consumer: Any, partitions: list[Any]) -> None:
        slots = frozenset(p.partition for p in partitions)
        with self._lock:
            self._state.owned -= slots
            self._state.lost |= slots
            self._state.version += 1
        self.on_change("lost", slots)
