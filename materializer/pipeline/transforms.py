"""Single-message transforms, applied in order to decoded records (Kafka Connect's SMTs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from materializer.config import Transform
from materializer.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def apply_transforms(records: DataFrame, transforms: Sequence[Transform]) -> DataFrame:
    """Each transform in turn; records already marked with an error pass through untouched."""
    if transforms:
        raise ConfigError("", ["transforms: not available yet"])
    return records
