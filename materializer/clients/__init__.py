"""Clients of the outside systems, set up once for every process of the product.

Kafka (every client's settings from the one ``kafka`` block, and the admin API's
offsets), Redis (one server or a Redis Cluster behind the same calls, one cached
client per process), the object store, and the log format. Both the materializer
and the query service use them; nothing here imports Spark or knows a map's layout.
"""
