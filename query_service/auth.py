"""Bearer tokens, each allowed some maps and some verbs.

The tokens document comes from a file or an environment variable (a mounted
Secret either way) and reads, in YAML or JSON::

    tokens:
      - name: orders-service        # for logs; never the token itself
        token: "s3cr3t…"
        maps: [users, orders]       # or ["*"]
        verbs: [get, enrich]        # or ["*"]

Verbs group the RPCs by what they let a caller do, so a grant survives new
methods of the same kind: ``get`` (Get, BatchGet), ``query`` (Query,
GetAsOf, GetSchema, SQL), ``watch``, ``enrich``, ``status`` (ListMaps, GetStatus, GetMapConfig,
ValidateConfig, GetOperation), ``control`` (Pause, Resume, Restart, StartOperation: a
verify, rehydrate or rebuild) and ``manage`` (CreateMap,
PutMapConfig, DeleteMap: what maps exist, and their definitions). Health checks and
reflection need no token, so probes and tooling work without secrets. A change made
with a token is logged with the token's name.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from materializer.config import AuthConfig
from materializer.errors import ConfigError
from query_service.errors import PermissionDenied, Unauthenticated

ALL = "*"
VERBS = frozenset({"get", "query", "watch", "enrich", "status", "control", "manage"})
METHOD_VERBS = {
    "/materializer.v1.MapService/Get": "get",
    "/materializer.v1.MapService/BatchGet": "get",
    "/materializer.v1.MapService/Query": "query",
    "/materializer.v1.MapService/GetAsOf": "query",
    "/materializer.v1.MapService/GetSchema": "query",
    "/materializer.v1.SqlService/Execute": "query",
    "/materializer.v1.MapService/Watch": "watch",
    "/materializer.v1.EnrichService/Enrich": "enrich",
    "/materializer.v1.AdminService/ListMaps": "status",
    "/materializer.v1.AdminService/GetStatus": "status",
    "/materializer.v1.AdminService/ValidateConfig": "status",
    "/materializer.v1.AdminService/Pause": "control",
    "/materializer.v1.AdminService/Resume": "control",
    "/materializer.v1.AdminService/Restart": "control",
    "/materializer.v1.AdminService/GetMapConfig": "status",
    "/materializer.v1.AdminService/CreateMap": "manage",
    "/materializer.v1.AdminService/PutMapConfig": "manage",
    "/materializer.v1.AdminService/DeleteMap": "manage",
    "/materializer.v1.AdminService/StartOperation": "control",
    "/materializer.v1.AdminService/GetOperation": "status",
}
CALLER: ContextVar[str] = ContextVar("caller", default="anonymous")
"""The name of the token the call in hand was made with (``anonymous`` without auth)."""
OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class GrantedContext:
    """A call's context made inside this process for a caller authenticated already (the
    console's login session): it carries the grant instead of a token. Only code of this
    service creates one; a call from the network has gRPC's or the HTTP front's context."""

    grant: Grant | None = None


def preset_grant(context: Any) -> Grant | None:
    """The grant a ``GrantedContext`` carries; None for every other call, which shows its
    token."""
    return context.grant if isinstance(context, GrantedContext) else None


@dataclass(frozen=True)
class Grant:
    """What one token may do; ``None`` means every map or every verb."""

    name: str
    maps: frozenset[str] | None
    verbs: frozenset[str] | None

    def allows_map(self, name: str) -> bool:
        """Whether the token may touch this map."""
        return self.maps is None or name in self.maps

    def allows_verb(self, verb: str) -> bool:
        """Whether the token may do this kind of call (``VERBS``)."""
        return self.verbs is None or verb in self.verbs


def _digest(token: str) -> bytes:
    # Tokens are looked up by hash: the comparison is of fixed-size digests, and
    # the process keeps no token in a form a memory dump would show as is.
    return hashlib.sha256(token.encode()).digest()


class Authorizer:
    """Checks each call's token, verb and maps against the tokens document."""

    def __init__(self, grants: Mapping[bytes, Grant]) -> None:
        self._grants = dict(grants)

    @classmethod
    def from_config(cls, config: AuthConfig) -> Authorizer:
        """Load the tokens document; a problem names ``query.auth`` and the entry at fault."""
        if config.tokens_file:
            where = "query.auth.tokens_file"
            try:
                text = Path(config.tokens_file).read_text()
            except OSError as exc:
                raise ConfigError("", [f"{where}: cannot read: {exc.strerror}"]) from None
        else:
            where = "query.auth.tokens_env"
            text = os.environ.get(config.tokens_env or "", "")
            if not text:
                raise ConfigError("", [f"{where}: {config.tokens_env} is not set"])
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError("", [f"{where}: not valid YAML: {exc}"]) from None
        return cls(parse_grants(doc, where))

    def authenticate(self, metadata: Iterable[tuple[str, Any]] | None) -> Grant:
        """The grant of the call's ``authorization: Bearer <token>``."""
        values = [v for k, v in metadata or () if k == "authorization"]
        if not values:
            raise Unauthenticated("missing authorization metadata: send 'Bearer <token>'")
        value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("authorization must be 'Bearer <token>'")
        grant = self._grants.get(_digest(token.strip()))
        if grant is None:
            raise Unauthenticated("unknown token")
        return grant

    def login(self, token: str) -> tuple[str, Grant]:
        """A token typed into the console's login form: its digest (hex, what a session
        keeps instead of the token) and its grant."""
        digest = _digest(token.strip())
        grant = self._grants.get(digest) if token.strip() else None
        if grant is None:
            raise Unauthenticated("unknown token")
        return digest.hex(), grant

    def grant_of(self, digest_hex: str) -> Grant | None:
        """The grant of a session's token digest; None once the token is no longer listed."""
        try:
            return self._grants.get(bytes.fromhex(digest_hex))
        except ValueError:
            return None

    @staticmethod
    def check_verb(grant: Grant, method: str) -> None:
        """The method's verb must be granted; a method without a verb is refused."""
        verb = METHOD_VERBS.get(method)
        if verb is None or (grant.verbs is not None and verb not in grant.verbs):
            raise PermissionDenied(f"token {grant.name!r} may not call {method.rsplit('/', 1)[-1]}")

    @staticmethod
    def check_maps(grant: Grant, maps: Iterable[str]) -> None:
        """Every map the request touches must be granted."""
        for name in maps:
            if not grant.allows_map(name):
                raise PermissionDenied(f"token {grant.name!r} may not use map {name!r}")


def _names(value: Any, where: str, allowed: frozenset[str] | None) -> frozenset[str] | None:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError("", [f"{where}: must be a non-empty list of names, or ['*']"])
    if ALL in value:
        return None
    if allowed is not None:
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise ConfigError(
                "", [f"{where}: unknown {unknown[0]!r} (one of {', '.join(sorted(allowed))})"]
            )
    return frozenset(value)


def parse_grants(doc: Any, where: str) -> dict[bytes, Grant]:
    """The grants of a tokens document, by token digest."""
    entries: Sequence[Any] = doc.get("tokens") if isinstance(doc, dict) else None  # type: ignore[assignment]
    if not isinstance(entries, list) or not entries:
        raise ConfigError("", [f"{where}: must hold 'tokens:', a non-empty list"])
    grants: dict[bytes, Grant] = {}
    for i, entry in enumerate(entries):
        at = f"{where}: tokens.{i}"
        if not isinstance(entry, dict):
            raise ConfigError("", [f"{at}: must be a mapping"])
        unknown = sorted(set(entry) - {"name", "token", "maps", "verbs"})
        if unknown:
            raise ConfigError("", [f"{at}.{unknown[0]}: unknown key"])
        token = entry.get("token")
        if not isinstance(token, str) or len(token) < 16:
            raise ConfigError("", [f"{at}.token: must be a string of at least 16 characters"])
        digest = _digest(token)
        if digest in grants:
            raise ConfigError("", [f"{at}.token: the same token appears twice"])
        grants[digest] = Grant(
            name=str(entry.get("name") or f"tokens.{i}"),
            maps=_names(entry.get("maps"), f"{at}.maps", None),
            verbs=_names(entry.get("verbs"), f"{at}.verbs", VERBS),
        )
    return grants
