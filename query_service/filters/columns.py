"""The columns a filter may name: those of one map's Delta table."""

from __future__ import annotations

from dataclasses import dataclass, field

from query_service.errors import InvalidArgument
from query_service.filters import sql


@dataclass(frozen=True)
class Columns:
    """The column names of one map's table, in table order (``_key`` first).

    Names resolve exactly; an unquoted SQL identifier may also match one column
    regardless of case, as SQL users expect (``Age`` for ``age``), as long as
    that match is unambiguous.
    """

    map_name: str
    names: tuple[str, ...]
    without_stats: frozenset[str] = field(default_factory=frozenset)
    """Columns the table keeps no file statistics for: lists, maps, whole structs."""

    def reference(self, name: str) -> str:
        """The SQL that reads column ``name`` inside a filter.

        A column without statistics is read as ``coalesce(col, NULL)``, which
        is the column itself: delta-rs 1.5 hands every predicate it can
        translate to its file-skipping step, and that step fails on such a
        column ("Predicate references unknown column"); a function call keeps
        the predicate out of it (fixed upstream by delta-io/delta-rs#4693).
        """
        quoted = sql.identifier(name)
        return f"coalesce({quoted}, NULL)" if name in self.without_stats else quoted

    def exact(self, name: str, where: str) -> str:
        """``name`` if it is a column, else ``InvalidArgument`` naming it and ``where`` it was."""
        if name in self.names:
            return name
        raise self.unknown(name, where)

    def resolve(self, name: str, *, quoted: bool, where: str) -> str:
        """The column a SQL identifier names: exact first, then case-insensitive if unquoted."""
        if name in self.names or quoted:
            return self.exact(name, where)
        folded = [n for n in self.names if n.casefold() == name.casefold()]
        if len(folded) == 1:
            return folded[0]
        if folded:
            choices = ", ".join(f'"{n}"' for n in folded)
            raise InvalidArgument(f"{where}: column {name!r} is ambiguous; quote one of {choices}")
        raise self.unknown(name, where)

    def unknown(self, name: str, where: str) -> InvalidArgument:
        """The error for a name that is not a column, listing the columns there are."""
        listed = ", ".join(self.names)
        return InvalidArgument(
            f"{where}: unknown column {name!r} (columns of map {self.map_name!r}: {listed})"
        )
