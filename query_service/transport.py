"""What every port of the query service shares, and the client with them: the bound on
a message's size, and the reading of ``query.tls``'s PEM files.

It sits below the ports (gRPC in ``server``, HTTP in ``http.server``, Arrow Flight SQL
in ``sql.flight``) and imports none of them, so each port takes these from here and
the module that assembles the ports is the only one that knows them all.
"""

from __future__ import annotations

from pathlib import Path

from materializer.errors import ConfigError

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""A message's bound, both directions, on the gRPC port (gRPC's default is 4 MiB in;
larger requests get RESOURCE_EXHAUSTED) and for a body on the HTTP front; the client
sends and takes as much."""


def read_pem(key: str, path: str) -> bytes:
    """A PEM file of ``query.tls`` (``key`` names it), or the configuration error naming it."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError("", [f"query.tls.{key}: cannot read {path}: {exc.strerror}"]) from None
