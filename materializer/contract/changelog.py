"""The changelog topic ``<map>.changelog``: every batch's entity changes, keyed by entity.

The fold writes each batch here right after Redis (``materializer.redis.apply``), and the
map's Delta table is fed from this topic by a query of its own (see
``job``), so the slow Delta MERGE never holds back the next batch's
Redis writes. The topic is compacted, and it doubles as a change-data-capture
stream for other consumers: the key is the entity key, the value the entity's
compact JSON (as in Redis), null for a delete, and headers carry the batch id
and app id. A key ``ttl.redis`` expired gets a null value too, with the header
``x-expired: 1`` instead (``materializer.redis.expiry``): the table drops its
row as for a delete.

Replays: a batch written again after a crash sends each key's state as Redis
holds it after the replay, the same state as the first copy, right after it
and before any later batch. Readers keep the last record per key, so the copy
changes nothing.
"""

BATCH_HEADER = "x-batch-id"
APP_HEADER = "x-app-id"
EXPIRED_HEADER = "x-expired"
