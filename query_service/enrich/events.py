"""Events of Enrich requests, parsed for the join."""

from __future__ import annotations

import orjson

from materializer.contract.join_rounds import EventState, kind
from query_service.errors import InvalidArgument


def parse_event(raw: bytes, where: str) -> EventState:
    """A request's event, which must be a UTF-8 JSON object; else ``InvalidArgument``."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"{where}: not a UTF-8 JSON object ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{where}: must be a JSON object, not {kind(doc)}")
    return EventState(doc)
