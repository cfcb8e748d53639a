"""The configuration reference, ``docs/reference/configuration.md``, from the pydantic models
in ``materializer.config``: ``python -m tools.config_reference``.

The models are the only statement of what a configuration file may hold, so the page is
read off them (keys, types, defaults, the attribute docstrings that describe them) and
``tests/unit/test_generated_docs.py`` fails when the committed page falls behind.
"""

from __future__ import annotations

import itertools
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic.fields import FieldInfo

from materializer.config import ENV_OVERRIDES, AppConfig, SourceConfig
from materializer.config import durations as duration_types
from tools import pages
from tools.config_docstrings import field_description, model_description, module_docstrings
from tools.config_types import default_text, discriminator, is_model, is_union, type_text, unwrap

TOOL = "config_reference"
PAGE = pages.REPO_ROOT / "docs" / "reference" / "configuration.md"

KIND_FIELDS: dict[type[pydantic.BaseModel], str] = {SourceConfig: "format"}
"""Models whose other optional keys depend on one key's value; the page shows, per value,
which of them it needs and takes, as the model's validators decide."""

_PLACEHOLDERS = ("<name>", "<key>", "<item>")
"""What a key the file chooses (a map's name) is written as in a path, outermost first."""


@dataclass(frozen=True)
class Row:
    """One key of the file."""

    path: str
    type: str
    default: str
    description: str


@dataclass
class Block:
    """A heading with its text and its table, and the blocks nested under it."""

    title: str
    text: str = ""
    rows: list[Row] = field(default_factory=list)
    extra: str = ""
    children: list[Block] = field(default_factory=list)


# --- the walk ------------------------------------------------------------------------------


def _placeholder(path: str) -> str:
    return next((p for p in _PLACEHOLDERS if p not in path), "<key>")


def _key(name: str, info: FieldInfo) -> str:
    return info.alias or name


def _walk(model: type[pydantic.BaseModel], prefix: str, block: Block) -> None:
    """A row per field of the model under ``prefix``, each followed by what it contains."""
    for name, info in model.model_fields.items():
        _walk_field(model, name, info, prefix, block)
    kind = KIND_FIELDS.get(model)
    if kind is not None:
        block.children.append(_kinds_block(model, kind, prefix))


def _walk_field(
    model: type[pydantic.BaseModel], name: str, info: FieldInfo, prefix: str, block: Block
) -> None:
    path = f"{prefix}.{_key(name, info)}" if prefix else _key(name, info)
    description = field_description(model, name, info)
    nested = _models_in(info.annotation, info.metadata, path)
    union = _union_members(info.annotation, info.metadata)
    if not description and union.members:
        how = f"its ``{union.discriminator}``" if union.discriminator else "its keys"
        description = f"Each is one of the kinds below, chosen by {how}."
    elif not description and len(nested) == 1:
        description = model_description(nested[0][1])
    block.rows.append(
        Row(
            path=path,
            type=type_text(info.annotation, info.metadata),
            default=default_text(info),
            description=description,
        )
    )
    if union.members:
        block.children.append(_union_block(path + _container_suffix(info, path), union))
    for suffix, inner in nested:
        _walk(inner, path + suffix, block)


def _container_suffix(info: FieldInfo, path: str) -> str:
    tp = unwrap(info.annotation, info.metadata).tp
    origin = typing.get_origin(tp)
    if origin is list:
        return "[]"
    if origin is dict:
        return "." + _placeholder(path)
    return ""


def _models_in(
    annotation: Any, metadata: Sequence[Any] = (), path: str = ""
) -> list[tuple[str, type[pydantic.BaseModel]]]:
    """The models a field holds, each with the path suffix that reaches one of them."""
    tp = unwrap(annotation, metadata).tp
    origin = typing.get_origin(tp)
    if is_model(tp):
        return [("", tp)]
    if is_union(tp):
        found = [m for arm in typing.get_args(tp) for m in _models_in(arm, (), path)]
        return found if len(found) == 1 else []
    if origin is list:
        return [("[]" + s, m) for s, m in _models_in(typing.get_args(tp)[0], (), path)]
    if origin is dict:
        name = "." + _placeholder(path)
        return [(name + s, m) for s, m in _models_in(typing.get_args(tp)[1], (), path + name)]
    return []


@dataclass(frozen=True)
class _Union:
    """A field (or a list's items) that is one of several models."""

    discriminator: str | None
    members: tuple[type[pydantic.BaseModel], ...]


def _union_members(annotation: Any, metadata: Sequence[Any] = ()) -> _Union:
    """The models of a union of several, directly or as the items of a list or map."""
    tp = unwrap(annotation, metadata).tp
    origin = typing.get_origin(tp)
    if origin in (list, dict):
        item = typing.get_args(tp)[-1]
        return _union_members(item)
    if is_union(tp):
        members = tuple(unwrap(a).tp for a in typing.get_args(tp) if is_model(unwrap(a).tp))
        if len(members) > 1:
            return _Union(discriminator(annotation, metadata), members)
    return _Union(None, ())


def _tag(model: type[pydantic.BaseModel], discriminator: str | None) -> str:
    if discriminator is None:
        return model.__name__
    info = model.model_fields[discriminator]
    values = typing.get_args(unwrap(info.annotation, info.metadata).tp)
    return f"{discriminator}: {', '.join(str(v) for v in values)}"


def _union_block(path: str, union: _Union) -> Block:
    how = f"by its `{union.discriminator}`" if union.discriminator else "by its keys"
    block = Block(title=path, text=f"Each item is one of these kinds, chosen {how}.")
    for member in union.members:
        child = Block(title=_tag(member, union.discriminator), text=model_description(member))
        _walk(member, path, child)
        block.children.append(child)
    return block


# --- what each kind of a model takes -------------------------------------------------------


def _sample(annotation: Any) -> tuple[bool, Any]:
    """A value of the type that passes the field's own checks, for probing the validators."""
    tp = unwrap(annotation).tp
    if is_union(tp):
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        return _sample(arms[0]) if arms else (False, None)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return True, typing.get_args(tp)[0]
    if origin is list:
        ok, item = _sample(typing.get_args(tp)[0])
        return ok, [item]
    samples: dict[Any, Any] = {str: "https://example.com/x", int: 1, float: 1.0, bool: True}
    return (tp in samples), samples.get(tp)


def _kinds(
    model: type[pydantic.BaseModel], kind: str
) -> dict[Any, tuple[list[list[str]], list[str]]]:
    """For each value of ``kind``: the inclusion-minimal sets of the null-default keys that a
    valid document of that kind holds, and every such key any valid document holds.

    The validators keep these rules in code, not data; trying each combination reads them
    off the model without restating them here.
    """
    fields = model.model_fields
    base: dict[str, Any] = {}
    for name, info in fields.items():
        if info.is_required():
            ok, value = _sample(info.annotation)
            if not ok:
                return {}
            base[_key(name, info)] = value
    optional = [
        name
        for name, info in fields.items()
        if name != kind and not info.is_required() and info.default is None
    ]
    optional = [n for n in optional if _sample(fields[n].annotation)[0]]
    switches = [
        name
        for name, info in fields.items()
        if name != kind
        and not info.is_required()
        and typing.get_origin(unwrap(info.annotation).tp) is Literal
    ]
    switch_values = [typing.get_args(unwrap(fields[n].annotation).tp) for n in switches]
    result: dict[Any, tuple[list[list[str]], list[str]]] = {}
    for value in typing.get_args(unwrap(fields[kind].annotation).tp):
        valid: list[frozenset[str]] = []
        for chosen in _subsets(optional):
            for settings in itertools.product(*switch_values):
                doc = {**base, _key(kind, fields[kind]): value}
                doc.update({_key(n, fields[n]): _sample(fields[n].annotation)[1] for n in chosen})
                doc.update({_key(n, fields[n]): v for n, v in zip(switches, settings, strict=True)})
                try:
                    model.model_validate(doc)
                except pydantic.ValidationError:
                    continue
                valid.append(frozenset(chosen))
                break
        order = {n: i for i, n in enumerate(optional)}
        minimal = [s for s in valid if not any(o < s for o in valid)]
        needs = sorted(
            {tuple(sorted(s, key=order.__getitem__)) for s in minimal},
            key=lambda names: (len(names), [order[n] for n in names]),
        )
        takes = sorted(set().union(*valid), key=order.__getitem__) if valid else []
        result[value] = (
            [[_key(n, fields[n]) for n in s] for s in needs],
            [_key(n, fields[n]) for n in takes],
        )
    return result


def _subsets(names: Sequence[str]) -> Iterator[tuple[str, ...]]:
    for size in range(len(names) + 1):
        yield from itertools.combinations(names, size)


def _kinds_block(model: type[pydantic.BaseModel], kind: str, prefix: str) -> Block:
    key = _key(kind, model.model_fields[kind])
    rows = []
    for value, (needs, takes) in _kinds(model, kind).items():
        needed = {n for s in needs for n in s}
        need_text = ", or ".join(" and ".join(pages.code(n) for n in s) for s in needs if s)
        also = [pages.code(n) for n in takes if n not in needed]
        rows.append([pages.code(str(value)), need_text or "nothing more", ", ".join(also) or "—"])
    block = Block(
        title=f"{prefix}.{key}" if prefix else key,
        text=(
            f"Of the keys that default to `null`, those each `{key}` needs and those it also "
            f"takes; any other of them is an error with that `{key}`."
        ),
    )
    block.extra = pages.table([pages.code(key), "Needs", "Also takes"], rows)
    return block


# --- the page ------------------------------------------------------------------------------


def _render_block(block: Block, level: int) -> list[str]:
    out = [f"{'#' * level} {pages.code(block.title)}", ""]
    if block.text:
        out += [pages.paragraphs(block.text), ""]
    if block.rows:
        out.append(
            pages.table(
                ["Key", "Type", "Default", "Description"],
                (
                    [
                        pages.code(r.path),
                        pages.inline(r.type),
                        r.default,
                        pages.inline(r.description),
                    ]
                    for r in block.rows
                ),
            )
        )
    if block.extra:
        out.append(block.extra)
    for child in block.children:
        out += _render_block(child, min(level + 1, 6))
    return out


def page() -> str:
    """The whole page, as ``configuration.md`` should hold it."""
    every_model_forbids = all(
        m.model_config.get("extra") == "forbid" for m in _all_models(AppConfig)
    )
    duration_doc = module_docstrings(duration_types).get("Duration", "")
    out = [
        "# Configuration reference",
        "",
        pages.generated_notice(TOOL, "the models in `materializer/config/`"),
        "",
        "Every key of the YAML file that `materializer` and `query-service` read (`-c`), by its",
        "dotted path. `<name>` stands for a name the file chooses (a map's, an enrichment's),",
        "`[]` for each item of a list.",
        "",
    ]
    if every_model_forbids:
        out += ["An unknown key is an error that names its path, never a setting ignored.", ""]
    if duration_doc:
        out += [f"A **duration** is {pages.paragraphs(_lower_first(duration_doc))}", ""]
    for name, info in AppConfig.model_fields.items():
        block = Block(title=_key(name, info))
        _walk_field(AppConfig, name, info, "", block)
        out += _render_block(block, 2)
    out += [
        "## Environment overrides",
        "",
        "Each of these variables, when set and not empty, replaces its key's value in the file,",
        "so one file serves every environment.",
        "",
        pages.table(
            ["Variable", "Key"],
            ([pages.code(var), pages.code(".".join(key))] for var, key in ENV_OVERRIDES.items()),
        ),
    ]
    return "\n".join(out).rstrip("\n") + "\n"


def _lower_first(text: str) -> str:
    """``A timedelta written as …`` reads on after "A duration is"."""
    first, _, rest = text.partition(" ")
    return (first.lower() if first in ("A", "An") else first) + (" " + rest if rest else "")


def _all_models(root: type[pydantic.BaseModel]) -> list[type[pydantic.BaseModel]]:
    seen: dict[type[pydantic.BaseModel], None] = {}
    stack = [root]
    while stack:
        model = stack.pop()
        if model in seen:
            continue
        seen[model] = None
        for info in model.model_fields.values():
            stack += [m for _, m in _models_in(info.annotation, info.metadata)]
            stack += list(_union_members(info.annotation, info.metadata).members)
    return list(seen)


def pages_to_write() -> dict[Path, str]:
    """The files this tool owns, with their text."""
    return {PAGE: page()}


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or ``--check``) the configuration reference."""
    return pages.main(TOOL, "Write docs/reference/configuration.md.", pages_to_write, argv)


if __name__ == "__main__":
    raise SystemExit(main())
