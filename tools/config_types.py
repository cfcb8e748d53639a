"""How the configuration reference writes a field's type and default, read off its
annotation and pydantic metadata.

Kept apart from the page's walk over the models: these are the words a reader of YAML sees
(``duration``, ``non-empty list of strings``, ``7 days``), not the shape of the page.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import annotated_types
import pydantic
from pydantic.fields import FieldInfo

from tools import pages


@dataclass(frozen=True)
class Shape:
    """An annotation taken apart: the type under ``Annotated`` and its constraints."""

    tp: Any
    constraints: tuple[Any, ...]


def unwrap(annotation: Any, metadata: Sequence[Any] = ()) -> Shape:
    """Constraints sit in ``Annotated`` layers or in a field's own metadata; one flat tuple
    lets the type text read bounds wherever they were declared."""
    constraints = list(metadata)
    while typing.get_origin(annotation) is typing.Annotated:
        annotation, *extra = typing.get_args(annotation)
        constraints.extend(extra)
    flat: list[Any] = []
    for item in constraints:
        flat.extend(item.metadata if isinstance(item, FieldInfo) else [item])
    return Shape(annotation, tuple(flat))


def is_union(tp: Any) -> bool:
    """``Optional[X]`` and ``X | None`` alike: ``get_origin`` tells the two spellings apart."""
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def is_model(tp: Any) -> bool:
    """A nested model gets rows of its own and reads as ``object``, not as a scalar."""
    return isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def discriminator(annotation: Any, metadata: Sequence[Any] = ()) -> str | None:
    """The key that picks a union's member, so the page can tell a reader which to set."""
    items = list(metadata)
    while typing.get_origin(annotation) is typing.Annotated:
        annotation, *extra = typing.get_args(annotation)
        items.extend(extra)
    for item in items:
        if isinstance(item, FieldInfo) and isinstance(item.discriminator, str):
            return item.discriminator
    return None


_SCALARS: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    timedelta: "duration",
    pydantic.SecretStr: "string",
    type(None): "null",
}


def type_text(annotation: Any, metadata: Sequence[Any] = ()) -> str:
    """The type as a reader of YAML thinks of it, with its bounds."""
    shape = unwrap(annotation, metadata)
    tp = shape.tp
    origin = typing.get_origin(tp)
    if is_union(tp):
        arms = typing.get_args(tp)
        if sum(is_model(unwrap(a).tp) for a in arms) > 1:
            return "object"
        texts = [type_text(a) for a in arms if a is not type(None)]
        texts = list(dict.fromkeys(texts))
        if type(None) in arms:
            texts.append("null")
        return texts[0] if len(texts) == 1 else ", ".join(texts[:-1]) + " or " + texts[-1]
    if origin is Literal:
        values = [f"``{v}``" for v in typing.get_args(tp)]
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    if origin is list:
        (item,) = typing.get_args(tp)
        return _sized("list of " + _plural(type_text(item)), shape.constraints)
    if origin is dict:
        key, value = typing.get_args(tp)
        return _sized(f"map of {type_text(key)} to {type_text(value)}", shape.constraints)
    if is_model(tp):
        return "object"
    base = _SCALARS.get(tp, getattr(tp, "__name__", str(tp)))
    return _bounded(base, shape.constraints)


def _plural(text: str) -> str:
    return text + "s" if text.endswith(tuple(_SCALARS.values()) + ("object",)) else text


def _sized(text: str, constraints: Sequence[Any]) -> str:
    for c in constraints:
        if isinstance(c, annotated_types.MinLen) and c.min_length == 1:
            text = "non-empty " + text
        elif isinstance(c, annotated_types.MinLen) and c.min_length > 1:
            text += f", at least {c.min_length}"
        elif isinstance(c, annotated_types.MaxLen):
            text += f", at most {c.max_length}"
    return text


def _bounded(base: str, constraints: Sequence[Any]) -> str:
    if base == "string":
        return _sized(base, constraints)
    low = next((c.ge for c in constraints if isinstance(c, annotated_types.Ge)), None)
    high = next((c.le for c in constraints if isinstance(c, annotated_types.Le)), None)
    bounds = [
        *(f"> {c.gt}" for c in constraints if isinstance(c, annotated_types.Gt)),
        *(f"< {c.lt}" for c in constraints if isinstance(c, annotated_types.Lt)),
    ]
    if low is not None and high is not None:
        bounds.insert(0, f"{low} to {high}")
    elif low is not None:
        bounds.insert(0, f">= {low}")
    elif high is not None:
        bounds.insert(0, f"<= {high}")
    return f"{base} ({', '.join(bounds)})" if bounds else base


# --- defaults ------------------------------------------------------------------------------

_UNITS = (
    (timedelta(days=1), "day"),
    (timedelta(hours=1), "hour"),
    (timedelta(minutes=1), "minute"),
    (timedelta(seconds=1), "second"),
    (timedelta(milliseconds=1), "millisecond"),
)


def _duration_text(value: timedelta) -> str:
    """A duration as a configuration file writes it (``100 milliseconds``, ``7 days``)."""
    if not value:
        return "0 seconds"
    for unit, word in _UNITS:
        if value % unit == timedelta(0):
            count = value // unit
            return f"{count} {word}{'' if count == 1 else 's'}"
    return f"{value.total_seconds()} seconds"


def _value_text(value: Any) -> str:
    """A value as YAML (flow style) would hold it; strings quoted, so ``""`` shows."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, timedelta):
        return _duration_text(value)
    if isinstance(value, pydantic.BaseModel):
        changed = value.model_dump(exclude_defaults=True, by_alias=True)
        return _value_text(changed)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    return str(value)


def default_text(info: FieldInfo) -> str:
    """A key without a default says ``required`` in the same column, so the table has no gaps."""
    if info.is_required():
        return "required"
    return pages.code(_value_text(info.get_default(call_default_factory=True)))
