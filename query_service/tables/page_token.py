"""The opaque ``page_token`` of a Query: where the next page starts, and in which snapshot.

A token is URL-safe base64 of a small JSON object: the table version every
page reads, the last key sent (the next page starts strictly after it, in the
engine's key order), how many rows were sent so far (so ``limit`` counts the
whole query), and a fingerprint of the map, the checked filter and the fields.
A query answered through an index carries the last index entry read instead of
a key: the next page reads the entries after it, in the index's order.
A token presented with a different map, filter or fields is refused rather
than answered with rows of another query. The token is not secret: forging
one can only read the same table the caller may query anyway.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from query_service.errors import InvalidArgument

FORMAT = 1
FIELD = "page_token"


def fingerprint(map_name: str, filter_sql: str | None, fields: Sequence[str]) -> str:
    """What a continuation must repeat: the map, the filter as checked, the projection."""
    canonical = orjson.dumps([map_name, filter_sql, list(fields)])
    return hashlib.sha256(canonical).hexdigest()[:32]


@dataclass(frozen=True)
class PageToken:
    """The position after one page of a query."""

    version: int
    last_key: str
    sent: int
    fingerprint: str
    entry: bytes | None = None
    """The last index entry read, for a query answered through an index."""

    def encode(self) -> str:
        """The token as the client sees it."""
        doc: dict[str, object] = {
            "f": FORMAT,
            "v": self.version,
            "k": self.last_key,
            "n": self.sent,
            "q": self.fingerprint,
        }
        if self.entry is not None:
            doc["e"] = base64.urlsafe_b64encode(self.entry).decode()
        return base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> PageToken:
        """A token as a client sent it back; ``InvalidArgument`` if it is not one of ours."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            doc = orjson.loads(raw)
            entry = doc.get("e") if isinstance(doc, dict) else None
            token = cls(
                version=doc["v"],
                last_key=doc["k"],
                sent=doc["n"],
                fingerprint=doc["q"],
                entry=None if entry is None else base64.urlsafe_b64decode(str(entry)),
            )
            valid = (
                doc["f"] == FORMAT
                and _is_int(token.version)
                and token.version >= 0
                and isinstance(token.last_key, str)
                and _is_int(token.sent)
                and token.sent > 0
                and isinstance(token.fingerprint, str)
            )
        except (binascii.Error, ValueError, TypeError, KeyError):
            valid = False
        if not valid:
            raise InvalidArgument(f"{FIELD}: not a page token of this service")
        return token

    def check(self, expected_fingerprint: str) -> None:
        """Refuse a token issued for another map, filter or projection."""
        if self.fingerprint != expected_fingerprint:
            raise InvalidArgument(
                f"{FIELD}: issued for another query; send the same map, filter and fields "
                "as the request that returned it"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
