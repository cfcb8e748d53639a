"""The fold mode a map's config names, with its semantics (``latest``, ``merge``,
``aggregate``)."""

from __future__ import annotations

from materializer.config import FoldConfig
from materializer.errors import ConfigError
from materializer.fold.aggregate import AggregateMode
from materializer.fold.base import FoldMode
from materializer.fold.latest import LatestMode
from materializer.fold.merge import MergeMode


def fold_mode(fold: FoldConfig) -> FoldMode:
    """The fold mode a map's config names."""
    if fold.mode == "latest":
        return LatestMode(fold)
    if fold.mode == "merge":
        return MergeMode(fold)
    if fold.mode == "aggregate":
        return AggregateMode(fold)
    raise ConfigError("", [f"fold.mode: unknown mode {fold.mode!r}"])
