"""The demo's producer: the event stream sent to Kafka on schedule, and what became of it.

It runs on a thread of its own so that its pace does not depend on the screen
refresh or a slow lookup. What it delivered (per topic and partition: the
log end and when each offset was produced) is the producer's side of the
demo's figures: lag is the log end minus the map's watermark, and freshness is
the watermark's time minus the produce time of the newest offset it covers.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer

from materializer.demo.events import DemoEvent

Partition = tuple[str, int]

MAX_TRACKED = 1_000_000
"""Produce times kept per partition while a map lags; beyond, the oldest go (freshness unknown)."""


@dataclass(frozen=True)
class Delivery:
    """One delivered record: where it landed, whose it is, and when it was produced."""

    topic: str
    partition: int
    offset: int
    user_id: str
    produced_at: float
    """UTC epoch seconds at ``produce()``: comparable with a watermark's ``updated_at_ms``."""


class DeliveryLog:
    """Deliveries as the producer's callbacks report them; read by the monitor, thread-safe.

    The demo's topics are fresh and written by this producer alone, without
    transactions, so offsets count records: a partition's log end is its
    highest delivered offset + 1.
    """

    def __init__(self, recent: int = 256) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._ends: dict[Partition, int] = {}
        self._times: dict[Partition, deque[tuple[int, float]]] = {}
        self._recent: deque[Delivery] = deque(maxlen=recent)
        self.failed = 0
        self.last_error = ""

    def delivered(self, d: Delivery) -> None:
        """Record one delivery (called on the producer's thread)."""
        where = (d.topic, d.partition)
        with self._lock:
            self._counts[d.topic] = self._counts.get(d.topic, 0) + 1
            self._ends[where] = max(self._ends.get(where, 0), d.offset + 1)
            self._times.setdefault(where, deque(maxlen=MAX_TRACKED)).append(
                (d.offset, d.produced_at)
            )
            self._recent.append(d)

    def failure(self, error: str) -> None:
        """Record a record that could not be delivered."""
        with self._lock:
            self.failed += 1
            self.last_error = error

    def count(self, topic: str) -> int:
        """Records delivered to ``topic``."""
        with self._lock:
            return self._counts.get(topic, 0)

    def log_ends(self, topic: str) -> dict[int, int]:
        """Next offset per partition of ``topic``."""
        with self._lock:
            return {p: end for (t, p), end in self._ends.items() if t == topic}

    def produced_at(self, topic: str, partition: int, offset: int) -> float | None:
        """When ``offset`` was produced; forgets earlier offsets, which a watermark has passed.

        Ask with offsets that only grow per partition (a watermark's), or the
        answer is ``None``.
        """
        with self._lock:
            times = self._times.get((topic, partition))
            if not times:
                return None
            while len(times) > 1 and times[0][0] < offset:
                times.popleft()
            first_offset, at = times[0]
            return at if first_offset == offset else None

    def recent(self) -> list[Delivery]:
        """The latest deliveries, newest first."""
        with self._lock:
            return list(reversed(self._recent))


class EventProducer:
    """Sends events at ``rate`` per second for ``duration`` seconds (0: until stopped).

    Event ``i`` is sent when ``i / rate`` seconds have passed since the start,
    the schedule the event generator stamps its times with; behind schedule (a
    busy machine) it sends at once until it has caught up. Idempotent, so a
    retried send never duplicates or reorders a user's events.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        events: Iterator[DemoEvent],
        *,
        rate: float,
        duration: float,
        log: DeliveryLog,
        encode: Callable[[DemoEvent], bytes | None] = DemoEvent.encoded,
    ) -> None:
        self._config = {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "linger.ms": 20,
            "compression.type": "lz4",
            # Errors only: a fresh broker answers the first requests with retriable warnings
            # ("coordinator load in progress") that would scribble over the live view.
            "log_level": 3,
        }
        self._events = events
        self._encode = encode
        self._rate = rate
        self._duration = duration
        self.log = log
        self._stop = threading.Event()
        self.finished = threading.Event()
        """Set once the producer has stopped and every record sent is delivered (or failed)."""
        self.sent = 0
        self.undelivered = 0
        self.started_at = 0.0
        self.finished_at = 0.0
        self._thread = threading.Thread(target=self._run, name="demo-producer", daemon=True)

    def start(self) -> None:
        """Start sending on the producer's thread."""
        self.started_at = time.monotonic()
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop sending, wait for the records in flight to be delivered."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        producer = Producer(self._config)
        try:
            start = self.started_at
            while not self._stop.is_set():
                due = self.sent / self._rate
                if self._duration and due >= self._duration:
                    break
                wait = start + due - time.monotonic()
                if wait > 0:
                    producer.poll(min(wait, 0.05))  # serves delivery callbacks while it waits
                    continue
                self._send(producer, next(self._events))
                self.sent += 1
        finally:
            self.undelivered = producer.flush(30)
            self.finished_at = time.monotonic()
            self.finished.set()

    def _send(self, producer: Producer, event: DemoEvent) -> None:
        callback = functools.partial(self._delivered, event.user_id, time.time())
        try:
            value = self._encode(event)
        except Exception as exc:  # counted and shown as a failed delivery, never silent
            self.log.failure(f"cannot encode an event of {event.topic}: {exc}")
            return
        while True:
            try:
                producer.produce(event.topic, key=event.key, value=value, on_delivery=callback)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)

    def _delivered(
        self, user_id: str, produced_at: float, err: KafkaError | None, msg: Message
    ) -> None:
        if err is not None:
            self.log.failure(str(err))
            return
        self.log.delivered(
            Delivery(
                msg.topic() or "",
                msg.partition() or 0,
                msg.offset() or 0,
                user_id,
                produced_at,
            )
        )
