"""Regenerate the gRPC Python code from ``proto/``: ``python -m tools.codegen``.

The generated modules are committed (``materializer/v1/``) so that installing
the package needs no compiler; ``tests/unit/test_codegen.py`` regenerates them
into a temporary folder and fails when the committed copy is stale. The
output depends only on the pinned ``grpcio-tools``, so it is byte-for-byte
reproducible.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO_ROOT / "proto"
INIT_TEXT = '"""Generated from proto/ by ``python -m tools.codegen``: do not edit."""\n'


class CodegenError(Exception):
    """protoc rejected the ``.proto`` files; its diagnostics went to stderr."""


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Every ``.proto`` under the root, sorted so runs are reproducible."""
    return sorted(proto_root.rglob("*.proto"))


def generate(out: Path = REPO_ROOT, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Write ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` under ``out``.

    Each proto package becomes a Python package of the same name
    (``materializer.v1``), so its directory also gets an ``__init__.py``; parent
    directories are left alone (``materializer/__init__.py`` is hand-written).
    Returns the files written, relative to ``out``.
    """
    files = proto_files(proto_root)
    if not files:
        raise CodegenError(f"no .proto files under {proto_root}")
    out.mkdir(parents=True, exist_ok=True)
    include = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={proto_root.resolve()}",
        f"--proto_path={include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(f.resolve()) for f in files),
    ]
    if protoc.main(args) != 0:
        raise CodegenError(f"protoc failed on {len(files)} file(s) under {proto_root}")
    written: list[Path] = []
    for package_dir in sorted({f.relative_to(proto_root).parent for f in files}):
        init = out / package_dir / "__init__.py"
        init.write_text(INIT_TEXT)
        written.append(init.relative_to(out))
    for f in files:
        stem = f.relative_to(proto_root).with_suffix("")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            written.append(stem.with_name(stem.name + suffix))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m tools.codegen", description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT, help="output root (default: the repository root)"
    )
    parser.add_argument(
        "--proto", type=Path, default=PROTO_ROOT, help="folder holding the .proto files"
    )
    ns = parser.parse_args(argv)
    try:
        written = generate(ns.out, ns.proto)
    except CodegenError as exc:
        print(f"codegen: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(ns.out / path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
