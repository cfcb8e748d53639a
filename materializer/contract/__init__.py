"""What the materializer writes and the query service reads: the only materializer code
the query service imports, besides ``config``, ``errors`` and the generated ``v1``.

Both halves run as separate processes, often of different versions during a
rolling upgrade, so everything they must agree on lives here and nowhere else:

- ``redis_layout``: a map's Redis keys, entity encoding, watermark, status and
  change entries (pinned by golden tests; docs/redis-layout.md);
- ``table_layout``: where a map's Delta tables live and their non-entity
  columns (docs/table-layout.md);
- ``object_store``: how both reach tables in S3 (Spark's S3A, delta-rs, pyarrow);
- ``entity_json``: an entity as JSON, the same bytes from a Redis hash or a row;
- ``status`` and ``control``: a map's reported state and the requests an
  operator leaves for the run (pause, resume, restart);
- ``kafka_offsets`` and ``kafka_clients``: Kafka's log ends and groups as both
  read them, with ``kafka.security`` mapped once for every client;
- ``join_plan`` and ``join_rounds``: the lookup join, so an event enriched by the
  query service's Enrich or by an enrichment job comes out the same;
- ``logs``: the one log line format of both processes.

Nothing here imports Spark or the pipeline: a module of this package may
import only ``config``, ``errors`` and its siblings, which ``make lint`` checks
(import-linter).
"""
