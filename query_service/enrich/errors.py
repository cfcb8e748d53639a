"""Errors of the enrichment join that need more context than ``query_service.errors`` gives."""

from __future__ import annotations

from collections.abc import Iterable

from query_service.errors import MapNotFound, QueryServiceError


class ProfileNotFound(QueryServiceError):
    """A request names a join profile the configuration does not declare."""

    code = MapNotFound.code

    def __init__(self, where: str, profile: str, known: Iterable[str]) -> None:
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(f"{where}: no such profile {profile!r} (known profiles: {listed})")


class LookupMapNotFound(MapNotFound):
    """A lookup names an undeclared map; unlike a lookup call's, the message says where."""

    def __init__(self, where: str, map_name: str, known: Iterable[str]) -> None:
        super().__init__(map_name, known)
        self.where = where

    def __str__(self) -> str:
        return f"{self.where}: {super().__str__()}"
