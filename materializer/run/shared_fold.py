"""A map's fold as its ``QueryGroup`` sees it while the map is on the run's real-time path
(``run.live``): the shared query's failures over it, in the terms a micro-batch fold's
failure is read in, and a stop that makes it leave."""

from __future__ import annotations

import re
from typing import Any, Protocol

from materializer.live.query import QUERY_NAME
from materializer.redis.functions import FENCED, LOST, CopyLost
from materializer.run.lifecycle import FENCED_ERROR

NAMED = re.compile(r"MATERIALIZER_LIVE_MAP (\S+) : ")
"""How the writer names the map a failure is of (``MapFailure``)."""


class LiveMembers(Protocol):
    """What a shared fold asks of the real-time path (``run.live.LivePath``)."""

    failures: dict[str, str]

    def leave(self, name: str) -> None:
        """The map leaves the real-time path."""


class SharedFold:
    """A map's place in the run's real-time query, as its ``QueryGroup`` sees its fold."""

    name = QUERY_NAME

    def __init__(self, path: LiveMembers, map_name: str) -> None:
        self._path = path
        self._map = map_name

    @property
    def isActive(self) -> bool:  # noqa: N802 - StreamingQuery's name
        """False once the shared query failed over this map (or over none in particular)."""
        return self._map not in self._path.failures

    @property
    def lastProgress(self) -> Any:  # noqa: N802
        """None: a real-time batch reports once it ends, minutes apart; the map's rates are
        its catch-up figures'."""
        return None

    @property
    def status(self) -> dict[str, Any]:
        """Never between batches: a stop does not wait for one to end."""
        return {"isTriggerActive": False, "isDataAvailable": False, "message": "real-time"}

    def exception(self) -> str | None:
        """The shared query's failure, when it is this map's, in the terms the lifecycle
        reads a micro-batch fold's failure in (``in_lifecycle_terms``)."""
        error = self._path.failures.get(self._map)
        return None if error is None else in_lifecycle_terms(error)

    def stop(self) -> None:
        """The map leaves the real-time path."""
        self._path.leave(self._map)

    def processAllAvailable(self) -> None:  # noqa: N802
        """A real-time fold has no batch to wait for: its watermark says how far it is."""
        raise RuntimeError(f"map {self._map} folds in real time: wait for its watermark")


def in_lifecycle_terms(error: str) -> str:
    """The writer's failure, led by the name of the error the micro-batch fold raises for
    the same cause, so the lifecycle mends it the same way: a newer owner (Redis refused the
    epoch, or Kafka the producer) fences the map, a lost copy or a Redis away restores it."""
    if FENCED in error or "ProducerFencedException" in error:
        return f"{FENCED_ERROR}: {error}"
    if LOST in error:
        return f"{CopyLost.__module__}.{CopyLost.__name__}: {error}"
    if "JedisConnectionException" in error:
        return f"redis.exceptions.ConnectionError: {error}"
    return error
