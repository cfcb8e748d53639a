"""Events of Enrich requests, parsed for the join."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from materializer.enrichment.rounds import EventState, kind
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


def parse_events(raws: Sequence[bytes], where: str) -> list[EventState]:
    """``parse_event`` of each event of a request, the first bad one's error naming its
    index (``<where>: events[i]``). Messages are made only for a bad request: a valid one
    pays a parse per event and nothing else."""
    try:
        docs = [orjson.loads(raw) for raw in raws]
    except orjson.JSONDecodeError:
        docs = []
    if len(docs) != len(raws) or not all(isinstance(doc, dict) for doc in docs):
        for i, raw in enumerate(raws):
            parse_event(raw, f"{where}: events[{i}]")  # raises at the first bad one
    return [EventState(doc) for doc in docs]
