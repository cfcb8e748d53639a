"""Durations as a config file writes them (``"30 minutes"``, ``"500 ms"``, ``90``), and as Spark's
triggers take them."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    WithJsonSchema,
)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$")


_DURATION_UNITS: dict[str, float] = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}


_DURATION_FORM = (
    'must be a duration such as "30 minutes", "500 ms", "1.5 hours" or a number of seconds '
    "(units: ms, s, m, h, d, or their words)"
)


def _duration(value: Any) -> Any:
    """A human duration (``"30 minutes"``) or a number of seconds, as a ``timedelta``."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(_DURATION_FORM)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value.lower())):
        unit = _DURATION_UNITS.get(match.group(2))
        if unit is None:
            raise ValueError(f"unknown unit {match.group(2)!r}: {_DURATION_FORM}")
        seconds = float(match.group(1)) * unit
    else:
        raise ValueError(_DURATION_FORM)
    try:
        return timedelta(seconds=seconds)
    except (OverflowError, ValueError):  # inf, nan, beyond timedelta's 999,999,999 days
        raise ValueError(_DURATION_FORM) from None


_DURATION_SCHEMA = {
    "anyOf": [
        {"type": "number", "minimum": 0, "description": "seconds"},
        {
            "type": "string",
            "pattern": r"^\s*(\d+(\.\d*)?|\.\d+)\s*("
            + "|".join(sorted((u for u in _DURATION_UNITS if u), key=len, reverse=True))
            + r")?\s*$",
            "description": 'a number and a unit, e.g. "30 minutes", "500 ms", "1.5 h"',
        },
    ]
}
"""What a duration is written as, for JSON Schema readers (the HTTP front's document)."""

Duration = Annotated[timedelta, BeforeValidator(_duration), WithJsonSchema(_DURATION_SCHEMA)]
"""A ``timedelta`` written as ``"30 minutes"``, ``"2 s"``, ``"500 ms"`` or seconds (``90``)."""


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be more than 0")
    return value


PositiveDuration = Annotated[Duration, AfterValidator(_positive)]
"""A ``Duration`` of more than nothing."""


def _not_negative(value: timedelta) -> timedelta:
    if value < timedelta(0):
        raise ValueError("must be 0 or more")
    return value


NonNegativeDuration = Annotated[Duration, AfterValidator(_not_negative)]
"""A ``Duration`` of nothing or more."""


def processing_time(interval: timedelta) -> str:
    """A trigger interval as Spark's ``trigger(processingTime=...)`` takes it."""
    millis = interval.total_seconds() * 1000
    # Never rounded down to 0, which would make Spark trigger without a pause.
    return f"{math.ceil(millis) if millis > 0 else 0} milliseconds"
