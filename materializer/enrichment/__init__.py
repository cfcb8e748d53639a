"""The lookup join, once: its plan and rounds (``plan``, ``rounds``), which the query
service's Enrich runs too, so an event enriched either way comes out the same; and the
streaming enrichment job, a topic's events joined with the maps and written back to Kafka
(``job``, ``partition_join``, ``outputs``)."""
