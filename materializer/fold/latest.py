"""The ``latest`` fold: the record with the greatest order wins, a delete removes the entity.

Nothing folds in Python: each key sends its batch's winning record (picked in
Arrow, ``materializer.redis.apply``) and Redis keeps it only if its order is
greater than the one stored beside the entity, so a replayed record, never
greater, changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.fold.base import FoldMode, KeyFolder

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class LatestMode(FoldMode):
    """``latest``: the entity is the winning record's fields, ordered as the base orders."""

    def folder(self, records: DataFrame) -> KeyFolder | None:
        """None: Redis compares the orders itself."""
        return None
