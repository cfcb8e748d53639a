"""A truncate (Debezium's ``op: t``): every entity of the map deleted, as of the truncate.

The truncate comes as one record keyed ``record_columns.TRUNCATE_KEY``, with an order as
any record has. It is taken out of its batch, the batch applied without it, then every
entity Redis holds (``map_keys.entity_keys``: those the batch just wrote too), and every
key whose fold state stays after its delete, gets a delete at the truncate's order,
through the mode's own delete: a record ordered after the truncate (later in its
partition, or a later ``source.ts_ms`` as the event time) is newer than the delete and
stays, one before it goes. The deletes' states go to the changelog as any change's, so
the table deletes the rows in the batch's MERGE and the change stream shows each delete.
Several truncates in a batch act as the last one.

Applying a delete twice at one order changes nothing (``latest`` keeps the greater order,
``merge`` the latest delete), so a replayed batch deletes again harmlessly and sends the
deletes to the changelog again (the keys deleted already are found by their states); and
a large batch, applied by several tasks at once, deletes once more on the driver after
them all (``RedisFold._apply``): a task's own pass may miss keys another task had not
written yet.

Orders compare positions within one partition only: on a topic of several partitions, a
truncate is in order with the other partitions' records with ``fold.event_time:
source.ts_ms`` (docs/change-data-capture.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.contract.redis_layout import state_key_name, state_keys_pattern
from materializer.fold.base import with_batch_time
from materializer.redis.map_keys import KEYS_PER_READ, SCAN_COUNT, entity_keys
from materializer.redis.prepare import ORDER, arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa

    from materializer.redis.writer import Writer


def split(table: pa.Table) -> tuple[pa.Table, str | None]:
    """The batch without its truncates, and the order of its last one (None: none)."""
    import pyarrow.compute as pc

    # A record of the key that failed a stage (no order) stays: a dead letter, not a truncate.
    marked = pc.and_(
        pc.fill_null(pc.equal(table[c.KEY], c.TRUNCATE_KEY), False), pc.is_valid(table[ORDER])
    )
    if not pc.any(marked).as_py():
        return table, None
    orders = table.filter(marked)[ORDER]
    return table.filter(pc.invert(marked)), str(pc.max(orders).as_py())


def alone(order: str) -> pa.Table:
    """A batch of one truncate at ``order`` (``split``'s): what the driver applies again
    after a large batch's tasks."""
    import pyarrow as pa

    schema = arrow_schema()
    row = {name: [None] for name in schema.names} | {c.KEY: [c.TRUNCATE_KEY], ORDER: [order]}
    return pa.Table.from_pydict(row, schema=schema)


def delete_all(
    writer: Writer, order: str, batch_time_ms: int | None
) -> Iterator[tuple[str, bytes | None]]:
    """Every entity Redis holds of the writer's map deleted at ``order`` (with the batch's
    time in it when the mode's orders have it); each key with its state after the call."""
    import pyarrow as pa

    if batch_time_ms is not None:
        order = str(with_batch_time(pa.chunked_array([[order]]), batch_time_ms)[0].as_py())
    name = writer.target.map_name
    prefix = len(name) + 1
    keys = {k.decode()[prefix:] for page in entity_keys(writer.client, name) for k in page}
    # And the keys deleted already, whose states stay a while: a replay of the batch (after
    # a crash before its changelog records went out) sends their deletes again.
    states = writer.client.scan_iter(match=state_keys_pattern(name), count=SCAN_COUNT)
    keys.update(state_key_name(name, k) for k in states if isinstance(k, bytes))
    folder = writer.target.folder
    ordered = sorted(keys)
    for start in range(0, len(ordered), KEYS_PER_READ):
        chunk = ordered[start : start + KEYS_PER_READ]
        if folder is None:
            yield from writer.latest([(key, (order, None)) for key in chunk])
        else:
            yield from writer.fold(folder, [(key, [(order, None, None)]) for key in chunk])
