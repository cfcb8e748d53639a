"""Work slots: which partition of the group's topic stands for which map.

The group's assignor balances partitions by count, so each map has a partition of its
own: the lowest free one, given when a worker first sees the map and kept while
the map exists, so a map created or deleted moves no other. The numbers live in
Redis (``contract.redis_layout.slots_key``), given out by one atomic script, so
every worker reads the same; the topic grows its partitions when the maps outnumber
them (Kafka cannot shrink a topic: a deleted map leaves a free slot for the next).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions, NewTopic

from materializer.clients.kafka import librdkafka
from materializer.clients.redis import Client
from materializer.config import AppConfig
from materializer.contract.redis_layout import slots_key
from materializer.errors import SetupError

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0

_GIVE = """
local slot = redis.call('HGET', KEYS[1], ARGV[1])
if slot then return tonumber(slot) end
local used = {}
for _, taken in ipairs(redis.call('HVALS', KEYS[1])) do used[tonumber(taken)] = true end
local free = 0
while used[free] do free = free + 1 end
redis.call('HSET', KEYS[1], ARGV[1], free)
return free
"""


class Slots:
    """The group's slot numbers in Redis, and the topic whose partitions they are."""

    def __init__(self, config: AppConfig, client: Client) -> None:
        assert config.worker.group is not None
        self.key = slots_key(config.worker.group)
        self.topic = config.worker.slots_topic()
        self._config = config
        self._client = client
        self._give = client.register_script(_GIVE)
        self._admin = AdminClient(librdkafka(config.kafka))
        self._partitions = 0

    def read(self) -> dict[str, int]:
        """Every map's slot."""
        raw = self._client.hgetall(self.key)
        return {_text(name): int(slot) for name, slot in raw.items()}

    def give(self, names: Iterable[str]) -> dict[str, int]:
        """Every map of ``names`` with its slot, given now to those without one; the topic
        grown to hold them all."""
        given = {name: int(self._give(keys=[self.key], args=[name])) for name in names}
        if given:
            self.ensure_partitions(max(given.values()) + 1)
        return given

    def free(self, name: str) -> None:
        """A deleted map's slot, free for the next map created."""
        self._client.hdel(self.key, name)

    def ensure_partitions(self, wanted: int) -> None:
        """The slots topic with at least ``wanted`` partitions (created with them if absent).

        Another worker may create or grow it at the same moment, with other figures:
        the count is read back until the broker shows enough.
        """
        deadline = time.monotonic() + TIMEOUT_S
        while self._partitions < wanted:
            have = self._topic_partitions()
            if have == 0:
                topic = NewTopic(
                    self.topic,
                    num_partitions=max(wanted, 1),
                    replication_factor=self._config.worker.replication_factor,
                    config={"retention.ms": "-1", "cleanup.policy": "compact"},
                )
                _done(self._admin.create_topics([topic])[self.topic], self.topic)
                log.info("worker group: slots topic %s created with %d slots", self.topic, wanted)
            elif have < wanted:
                grown = NewPartitions(self.topic, wanted)
                _done(self._admin.create_partitions([grown])[self.topic], self.topic)
                log.info("worker group: slots topic %s grown to %d slots", self.topic, wanted)
            self._partitions = self._topic_partitions()
            if self._partitions < wanted:
                if time.monotonic() > deadline:
                    raise SetupError(
                        f"worker group: its slots topic {self.topic} shows "
                        f"{self._partitions} partitions, not the {wanted} it was given"
                    )
                time.sleep(0.2)

    def _topic_partitions(self) -> int:
        metadata = self._admin.list_topics(self.topic, timeout=TIMEOUT_S)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            return 0
        return len(topic.partitions)


def _done(future: object, topic: str) -> None:
    """Wait for an admin call; another worker having done it already is as good."""
    try:
        future.result(TIMEOUT_S)  # type: ignore[attr-defined]
    except KafkaException as exc:
        code = exc.args[0].code()
        if code in (KafkaError.TOPIC_ALREADY_EXISTS, KafkaError.INVALID_PARTITIONS):
            return
        raise SetupError(f"worker group: cannot set up its slots topic {topic}: {exc}") from exc


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw
