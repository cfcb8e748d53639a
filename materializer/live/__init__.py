"""The real-time path: maps folded record by record in shared queries, as records arrive.

The micro-batch path (``materializer.job``) runs a query per map, and every batch pays
planning, scheduling and a checkpoint on the driver, however few records it carries. Here
maps share queries in Spark's Real-time Mode (``run.live`` groups them): a Kafka source per
map, decoded, keyed and ordered as on the other path, unioned, and handed to a JVM writer
(``jvm/live``, ``io.materializer.live.FoldWriter``) that applies each record to Redis the
moment it arrives, through the same Redis Functions, and sends its state to the changelog
(docs/decisions/0032-the-live-path-in-real-time-mode.md).

Exactly once is by source position, not by batch: each call moves the map's watermark
past the records it applied, in the same atomic call, and a record before the watermark
changes nothing. So the query starts from the watermarks, its own checkpoint holds nothing
the maps need, and a replay after any crash repeats no effect.
"""
