"""The frames a statement process and the service exchange over its pipes.

A frame is one kind byte, a 4-byte big-endian length, and that many bytes. The
service sends a request (pickled: both ends are this package, in processes it
started); the process answers with ``SCHEMA`` (an Arrow IPC schema message),
``BATCH`` frames (Arrow IPC record batch messages of that schema), and ``DONE``, or
with ``ERROR`` at any point. Arrow's own messages go through as the engine made
them, so the service can forward them without decoding.
"""

from __future__ import annotations

import asyncio
import struct
from typing import BinaryIO

READY = b"R"
REQUEST = b"Q"
SCHEMA = b"S"
BATCH = b"B"
DONE = b"D"
ERROR = b"E"

INVALID = "invalid"
"""The statement does not plan or fails on the data (a type mismatch, a division by zero)."""
MEMORY = "memory"
"""The statement needed more than its memory pool."""
STORAGE = "storage"
"""A table's files could not be read."""

_HEADER = struct.Struct(">cI")


def write(out: BinaryIO, kind: bytes, payload: bytes) -> None:
    """One frame, flushed: the reader waits for it."""
    out.write(_HEADER.pack(kind, len(payload)))
    out.write(payload)
    out.flush()


def write_error(out: BinaryIO, kind: str, message: str) -> None:
    """An ``ERROR`` frame: ``kind`` (``INVALID``, ``MEMORY``, ``STORAGE``), a tab, the text."""
    write(out, ERROR, f"{kind}\t{message}".encode())


def read(source: BinaryIO) -> tuple[bytes, bytes] | None:
    """The next frame, or ``None`` at the end of the pipe."""
    header = source.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    kind, size = _HEADER.unpack(header)
    return kind, source.read(size)


async def read_async(source: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The next frame; ``asyncio.IncompleteReadError`` when the process ended."""
    kind, size = _HEADER.unpack(await source.readexactly(_HEADER.size))
    return kind, await source.readexactly(size) if size else b""


def encode(kind: bytes, payload: bytes) -> bytes:
    """One frame as bytes, for an asyncio writer."""
    return _HEADER.pack(kind, len(payload)) + payload


def parse_error(payload: bytes) -> tuple[str, str]:
    """An ``ERROR`` frame's kind and message."""
    kind, _, message = payload.decode(errors="replace").partition("\t")
    return kind, message
