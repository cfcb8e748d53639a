"""A truncate (Debezium's ``op: t``): every entity of the map deleted, as of the truncate.

The truncate comes as one record keyed ``record_columns.TRUNCATE_KEY``, with an order as
any record has. It is taken out of its batch, the batch applied without it, then every
entity Redis holds (``map_keys.entity_keys``: those the batch just wrote too) gets a
delete at the truncate's order, through the mode's own delete: a record ordered after the
truncate (later in its partition, or a later ``source.ts_ms`` as the event time) is newer
than the delete and stays, one before it goes. The deletes' states go to the changelog as
any change's, so the table deletes the rows in the batch's MERGE and the change stream
shows each delete. Several truncates in a batch act as the last one.

Applying a delete twice at one order changes nothing, in every mode (``latest`` keeps the
greater order, ``merge`` the latest delete, ``aggregate`` skips a source position it has
folded). So a replayed batch deletes again harmlessly, and a large batch, applied by
several tasks at once, deletes once more on the driver after them all
(``RedisFold._apply``): a task's own pass may miss keys another task had not written yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from materializer import record_columns as c
from materializer.fold.base import with_batch_time
from materializer.redis.map_keys import KEYS_PER_READ, chunked, entity_keys
from materializer.redis.prepare import ORDER, arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa

    from materializer.redis.writer import Writer


def split(table: pa.Table) -> tuple[pa.Table, str | None]:
    """The batch without its truncates, and the order of its last one (None: none)."""
    import pyarrow.compute as pc

    marked = pc.fill_null(pc.equal(table[c.KEY], c.TRUNCATE_KEY), False)
    if not pc.any(marked).as_py():
        return table, None
    orders = table.filter(marked)[ORDER].drop_null()
    rest = table.filter(pc.invert(marked))
    if len(orders) == 0:  # a truncate that failed a stage: a dead letter, not a truncate
        return rest, None
    return rest, str(pc.max(orders).as_py())


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
    prefix = len(writer.target.map_name) + 1
    pages = entity_keys(writer.client, writer.target.map_name)
    for page in pages:
        for keys in chunked(page, KEYS_PER_READ):
            names = [k.decode()[prefix:] for k in keys]
            folder = writer.target.folder
            if folder is None:
                yield from writer.latest([(name, (order, None)) for name in names])
            else:
                yield from writer.fold(folder, [(name, [(order, None, None)]) for name in names])
