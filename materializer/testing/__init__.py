"""Real services for tests and the demo: a Kafka broker, a Redis server, topics.

Each service is a context manager that owns its process and stops it on exit,
even when the body raised. Users reuse them for their own integration tests.
"""

from materializer.testing.kafka import KafkaBroker, create_topic
from materializer.testing.ports import closed_port, free_port
from materializer.testing.producing import Producing, produce
from materializer.testing.redis import RedisCluster, RedisServer

__all__ = [
    "KafkaBroker",
    "Producing",
    "RedisCluster",
    "RedisServer",
    "closed_port",
    "create_topic",
    "free_port",
    "produce",
]
