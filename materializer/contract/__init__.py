"""What the materializer writes and the query service reads.

Both halves run as separate processes, often of different versions during a
rolling upgrade, so everything they must agree on about the stores lives here
and nowhere else:

- ``redis_layout``: every Redis key (a map's entities, fold state and
  bookkeeping, a worker group's, the console's sessions) and the change
  entries (pinned by golden tests; docs/redis-layout.md);
- ``watermark``: a map's watermark, how far its Redis copy reflects its sources;
- ``markers``: where each master's marker says a map's copy there is whole;
- ``table_layout``: where a map's Delta tables live and their non-entity
  columns (docs/table-layout.md);
- ``changelog``: the headers of the changelog topic's records;
- ``entity_json``: an entity as JSON, the same bytes from a Redis hash or a row;
- ``status`` and ``control``: a map's report as the run writes it, its state
  as operators see it, and the requests an operator leaves for the run (pause,
  resume, restart);
- ``table_marks``: which source offsets a map's Delta table reflects, from the
  table marks in Redis and its commits;
- ``history``: a map's figures over time, as the run samples them;
- ``operations``: the last operation asked of a map (verify, rehydrate,
  rebuild) and the run's report of it.

How both reach Kafka, Redis and the object store is ``materializer.clients``;
the lookup join both run is ``materializer.enrichment.plan`` and ``rounds``.
Nothing here imports Spark or the pipeline: a module of this package imports
only ``clients``, ``config``, ``errors`` and its siblings, which ``make lint``
checks (import-linter's layers).
"""
