"""The gRPC API reference, ``docs/reference/grpc.md``, from ``proto/``:
``python -m tools.grpc_reference``.

protoc itself parses the files (into a descriptor set with source info, which keeps the
comments), so the page sees exactly the services, types and comments the generated code
and every client see, with none of a hand parser's blind spots (nested types, maps,
oneofs, comments in odd places).
"""

from __future__ import annotations

import tempfile
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2 as d
from grpc_tools import protoc

from tools import pages

TOOL = "grpc_reference"
PAGE = pages.REPO_ROOT / "docs" / "reference" / "grpc.md"
PROTO_ROOT = pages.REPO_ROOT / "proto"

_F = d.FileDescriptorProto
_M = d.DescriptorProto
_E = d.EnumDescriptorProto
_S = d.ServiceDescriptorProto

_SCALARS = {
    d.FieldDescriptorProto.TYPE_DOUBLE: "double",
    d.FieldDescriptorProto.TYPE_FLOAT: "float",
    d.FieldDescriptorProto.TYPE_INT64: "int64",
    d.FieldDescriptorProto.TYPE_UINT64: "uint64",
    d.FieldDescriptorProto.TYPE_INT32: "int32",
    d.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    d.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    d.FieldDescriptorProto.TYPE_BOOL: "bool",
    d.FieldDescriptorProto.TYPE_STRING: "string",
    d.FieldDescriptorProto.TYPE_BYTES: "bytes",
    d.FieldDescriptorProto.TYPE_UINT32: "uint32",
    d.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    d.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    d.FieldDescriptorProto.TYPE_SINT32: "sint32",
    d.FieldDescriptorProto.TYPE_SINT64: "sint64",
}


class ProtocError(Exception):
    """protoc rejected the ``.proto`` files; its diagnostics went to stderr."""


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Every ``.proto`` under the root, sorted so that the page's order never depends on the
    file system's."""
    return sorted(proto_root.rglob("*.proto"))


def descriptor_set(proto_root: Path = PROTO_ROOT) -> d.FileDescriptorSet:
    """The files as protoc parses them, comments included; imports too, to resolve types."""
    files = proto_files(proto_root)
    if not files:
        raise ProtocError(f"no .proto files under {proto_root}")
    include = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "set.binpb"
        args = [
            "grpc_tools.protoc",
            f"--proto_path={proto_root.resolve()}",
            f"--proto_path={include}",
            f"--descriptor_set_out={out}",
            "--include_source_info",
            "--include_imports",
            *(str(f.resolve()) for f in files),
        ]
        if protoc.main(args) != 0:
            raise ProtocError(f"protoc failed on {len(files)} file(s) under {proto_root}")
        result = d.FileDescriptorSet()
        result.ParseFromString(out.read_bytes())
    return result


class _Comments:
    """A file's comments, by the path of the element they belong to."""

    def __init__(self, file: d.FileDescriptorProto) -> None:
        self._by_path = {tuple(loc.path): loc for loc in file.source_code_info.location}

    def __call__(self, *path: int, detached: bool = False) -> str:
        loc = self._by_path.get(path)
        if loc is None:
            return ""
        parts = [*loc.leading_detached_comments] if detached else []
        parts += [loc.leading_comments, loc.trailing_comments]
        return "\n\n".join(_clean(p) for p in parts if p.strip())


def _clean(comment: str) -> str:
    """A comment without the space each ``//`` line starts with."""
    return textwrap.dedent(comment).strip()


@dataclass(frozen=True)
class _Type:
    """A message or enum of the documented files, wherever it is nested."""

    full_name: str
    short_name: str
    anchor: str


def _anchor(full_name: str) -> str:
    return full_name.replace(".", "-")


def _walk_types(file: d.FileDescriptorProto) -> Iterator[tuple[str, str]]:
    """(full name, name within the package) of every message and enum, in source order."""

    def messages(scope: str, items: Sequence[d.DescriptorProto]) -> Iterator[tuple[str, str]]:
        for message in items:
            name = f"{scope}{message.name}"
            yield f"{file.package}.{name}", name
            yield from messages(f"{name}.", message.nested_type)
            for enum in message.enum_type:
                yield f"{file.package}.{name}.{enum.name}", f"{name}.{enum.name}"

    yield from messages("", file.message_type)
    for enum in file.enum_type:
        yield f"{file.package}.{enum.name}", enum.name


class _Renderer:
    """The page's text for the documented files, linking types across them."""

    def __init__(self, documented: Sequence[d.FileDescriptorProto]) -> None:
        self.files = documented
        self.types = {
            full: _Type(full, short, _anchor(full))
            for file in documented
            for full, short in _walk_types(file)
        }
        self.map_entries = {
            f"{file.package}.{scope}": message
            for file in documented
            for scope, message in _all_messages(file)
            if message.options.map_entry
        }

    def type_ref(self, type_name: str) -> str:
        name = type_name.lstrip(".")
        known = self.types.get(name)
        if known is None:
            return pages.code(name)
        return f"[{pages.code(known.short_name)}](#{known.anchor})"

    def field_type(self, field: d.FieldDescriptorProto) -> str:
        if field.type in (
            d.FieldDescriptorProto.TYPE_MESSAGE,
            d.FieldDescriptorProto.TYPE_ENUM,
        ):
            entry = self.map_entries.get(field.type_name.lstrip("."))
            if entry is not None:
                key, value = entry.field[0], entry.field[1]
                return f"map&lt;{self.field_type(key)}, {self.field_type(value)}&gt;"
            text = self.type_ref(field.type_name)
        else:
            text = pages.code(_SCALARS.get(field.type, str(field.type)))
        if field.label == d.FieldDescriptorProto.LABEL_REPEATED:
            return f"repeated {text}"
        if field.proto3_optional:
            return f"optional {text}"
        return text

    def service(self, file: d.FileDescriptorProto, index: int, comments: _Comments) -> list[str]:
        service = file.service[index]
        full = f"{file.package}.{service.name}"
        out = [pages.anchor(_anchor(full)), "", f"### Service {pages.code(service.name)}", ""]
        out += [f"{pages.code(full)}, in {pages.code(file.name)}.", ""]
        text = comments(_F.SERVICE_FIELD_NUMBER, index)
        if text:
            out += [pages.paragraphs(text), ""]
        rows = []
        for i, method in enumerate(service.method):
            request = self.type_ref(method.input_type)
            response = self.type_ref(method.output_type)
            rows.append(
                [
                    pages.anchor(_anchor(f"{full}.{method.name}")) + pages.code(method.name),
                    ("stream " if method.client_streaming else "") + request,
                    ("stream " if method.server_streaming else "") + response,
                    pages.inline(
                        comments(_F.SERVICE_FIELD_NUMBER, index, _S.METHOD_FIELD_NUMBER, i)
                    ),
                ]
            )
        out.append(pages.table(["RPC", "Request", "Response", "Description"], rows))
        return out

    def message(
        self,
        file: d.FileDescriptorProto,
        message: d.DescriptorProto,
        name: str,
        path: tuple[int, ...],
        comments: _Comments,
    ) -> list[str]:
        full = f"{file.package}.{name}"
        out = [pages.anchor(_anchor(full)), "", f"### Message {pages.code(name)}", ""]
        text = comments(*path)
        if text:
            out += [pages.paragraphs(text), ""]
        oneofs = [o.name for o in message.oneof_decl]
        real = {
            f.oneof_index
            for f in message.field
            if f.HasField("oneof_index") and not f.proto3_optional
        }
        if not message.field:
            out += ["No fields.", ""]
        else:
            rows = []
            for i, field in enumerate(message.field):
                description = pages.inline(comments(*path, _M.FIELD_FIELD_NUMBER, i))
                if field.HasField("oneof_index") and field.oneof_index in real:
                    within = f"Within oneof {pages.code(oneofs[field.oneof_index])}."
                    description = f"{within} {description}".strip()
                rows.append(
                    [pages.code(field.name), str(field.number), self.field_type(field), description]
                )
            out.append(pages.table(["Field", "Number", "Type", "Description"], rows))
        for i, oneof in enumerate(message.oneof_decl):
            text = comments(*path, _M.ONEOF_DECL_FIELD_NUMBER, i)
            if i in real and text:
                out += [f"**Oneof {pages.code(oneof.name)}.** {pages.paragraphs(text)}", ""]
        for i, enum in enumerate(message.enum_type):
            out += self.enum(
                file, enum, f"{name}.{enum.name}", (*path, _M.ENUM_TYPE_FIELD_NUMBER, i), comments
            )
        for i, nested in enumerate(message.nested_type):
            if nested.options.map_entry:
                continue
            out += self.message(
                file,
                nested,
                f"{name}.{nested.name}",
                (*path, _M.NESTED_TYPE_FIELD_NUMBER, i),
                comments,
            )
        return out

    def enum(
        self,
        file: d.FileDescriptorProto,
        enum: d.EnumDescriptorProto,
        name: str,
        path: tuple[int, ...],
        comments: _Comments,
    ) -> list[str]:
        full = f"{file.package}.{name}"
        out = [pages.anchor(_anchor(full)), "", f"### Enum {pages.code(name)}", ""]
        text = comments(*path)
        if text:
            out += [pages.paragraphs(text), ""]
        rows = [
            [
                pages.code(value.name),
                str(value.number),
                pages.inline(comments(*path, _E.VALUE_FIELD_NUMBER, i)),
            ]
            for i, value in enumerate(enum.value)
        ]
        out.append(pages.table(["Value", "Number", "Description"], rows))
        return out

    def file(self, file: d.FileDescriptorProto) -> list[str]:
        comments = _Comments(file)
        out = [f"## {pages.code(file.name)}", ""]
        text = comments(_F.SYNTAX_FIELD_NUMBER, detached=True) or comments(
            _F.PACKAGE_FIELD_NUMBER, detached=True
        )
        if text:
            out += [pages.paragraphs(text), ""]
        for i in range(len(file.service)):
            out += self.service(file, i, comments)
        for i, message in enumerate(file.message_type):
            out += self.message(
                file, message, message.name, (_F.MESSAGE_TYPE_FIELD_NUMBER, i), comments
            )
        for i, enum in enumerate(file.enum_type):
            out += self.enum(file, enum, enum.name, (_F.ENUM_TYPE_FIELD_NUMBER, i), comments)
        return out


def _all_messages(file: d.FileDescriptorProto) -> Iterator[tuple[str, d.DescriptorProto]]:
    def walk(scope: str, items: Sequence[d.DescriptorProto]) -> Iterator[tuple[str, _M]]:
        for message in items:
            yield f"{scope}{message.name}", message
            yield from walk(f"{scope}{message.name}.", message.nested_type)

    yield from walk("", file.message_type)


def documented_files(proto_root: Path = PROTO_ROOT) -> list[d.FileDescriptorProto]:
    """Our API's files under ``proto/materializer/`` (not the well-known types they import,
    nor the Flight SQL protocol the SQL port speaks, which Apache Arrow documents), sorted
    by name."""
    ours = {
        str(p.relative_to(proto_root))
        for p in proto_files(proto_root)
        if p.relative_to(proto_root).parts[0] == "materializer"
    }
    return sorted(
        (f for f in descriptor_set(proto_root).file if f.name in ours), key=lambda f: f.name
    )


def page(proto_root: Path = PROTO_ROOT) -> str:
    """The whole page, as ``grpc.md`` should hold it."""
    files = documented_files(proto_root)
    renderer = _Renderer(files)
    packages = sorted({f.package for f in files})
    services = [(f"{f.package}.{s.name}", s.name, f.name) for f in files for s in f.service]
    out = [
        "# gRPC API reference",
        "",
        pages.generated_notice(TOOL, "`proto/`"),
        "",
        "The services of the query service, their messages and enums, with the comments of",
        f"the `.proto` files; package {', '.join(pages.code(p) for p in packages)}.",
        "A method's full name is `/<package>.<Service>/<RPC>`.",
        "",
        pages.table(
            ["Service", "File"],
            (
                [f"[{pages.code(name)}](#{_anchor(full)})", pages.code(file)]
                for full, name, file in services
            ),
        ),
    ]
    for file in files:
        out += renderer.file(file)
    return "\n".join(out).rstrip("\n") + "\n"


def pages_to_write() -> dict[Path, str]:
    """The files this tool owns, with their text."""
    return {PAGE: page()}


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or ``--check``) the gRPC reference."""
    return pages.main(TOOL, "Write docs/reference/grpc.md.", pages_to_write, argv)


if __name__ == "__main__":
    raise SystemExit(main())
