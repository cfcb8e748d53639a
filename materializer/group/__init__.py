"""A worker group: several ``materializer run`` processes share the maps.

Kafka's consumer-group protocol is the coordinator (docs/decisions/0023): each map
is a partition of the group's topic (``slots``), the group's rebalances move the
maps (``membership``), and a worker that lost a map while paused is fenced out of
Redis, Kafka and Delta (``fencing``).
"""
