"""Bulk writes and scans of a Redis map for operations that touch every entity.

Loading a million entities one ``SET`` at a time spends its time in round
trips and in the client's command packing. Here the keys and values arrive as
Arrow arrays and leave as ``MSET`` commands of thousands of pairs whose RESP
bytes Arrow's kernels assemble, so no Python object is made per entity. A few
commands stay in flight while the next batch is encoded, so Redis works on one
core while the encoding runs on the other. Entities that expire (a map's
``ttl.redis``) need their own ``SET .. PX`` each, assembled the same way and
sent thousands per write.

A Redis Cluster takes no multi-key command across slots: there the same
calls become one pipelined ``SET`` per entity, which redis-py sends to each
slot's master (``ClusterBulkWriter``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis
from redis.cluster import RedisCluster

from materializer.clients.redis import Client, is_cluster
from materializer.redis.map_keys import chunked

PAIRS_PER_COMMAND = 4096
"""Entities per MSET: large enough that Redis's per-command cost vanishes, small enough that
one command holds the server for a few milliseconds only (live lookups wait behind it)."""
IN_FLIGHT = 8
"""Commands sent before their replies are read."""


_SET_PX = (b"*5\r\n$3\r\nSET\r\n", b"$2\r\nPX\r\n")
"""The RESP around ``SET <key> <value> PX <ms>``: before the key, and before the expiry."""


class BulkWriter:
    """MSET, SET .. PX and DEL on one connection, pipelined; ``close`` waits for every reply."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._connection = client.connection_pool.get_connection()
        self._pending: deque[tuple[str, int]] = deque()
        """Writes sent and not answered yet: the command and how many replies it owes."""
        self.written = 0

    def mset(self, keys: pa.Array, values: pa.Array) -> None:
        """``SET`` every key (binary or string array) to its value (binary array)."""
        for start in range(0, len(keys), PAIRS_PER_COMMAND):
            chunk_keys = keys.slice(start, PAIRS_PER_COMMAND)
            chunk_values = values.slice(start, PAIRS_PER_COMMAND)
            self._send(b"MSET", _bulk_pairs(chunk_keys, chunk_values), 2 * len(chunk_keys))
            self.written += len(chunk_keys)

    def set_expiring(self, keys: pa.Array, values: pa.Array, expiry_ms: pa.Array) -> None:
        """``SET key value PX ms`` per entity: each key expires its ``expiry_ms`` (int64, > 0)
        later. MSET sets no expiry, so each entity is a command, sent thousands at a time."""
        before, px = _SET_PX
        for start in range(0, len(keys), PAIRS_PER_COMMAND):
            chunk_keys = keys.slice(start, PAIRS_PER_COMMAND)
            commands = pc.binary_join_element_wise(
                before,
                _bulk_pairs(chunk_keys, values.slice(start, PAIRS_PER_COMMAND)),
                px,
                _bulk_strings(pc.cast(expiry_ms.slice(start, PAIRS_PER_COMMAND), pa.string())),
                b"",
            )
            self._send_packed(commands, "SET", len(chunk_keys))
            self.written += len(chunk_keys)

    def delete(self, keys: Iterable[bytes]) -> int:
        """``DEL`` the keys, in commands of ``PAIRS_PER_COMMAND``; the number asked."""
        asked = 0
        for chunk in chunked(keys, PAIRS_PER_COMMAND):
            self._send(b"DEL", _bulk_strings(pa.array(chunk, pa.binary())), len(chunk))
            asked += len(chunk)
        return asked

    def _send(self, command: bytes, arguments: pa.Array, count: int) -> None:
        """One command whose arguments are the concatenated RESP bulk strings of ``arguments``."""
        header = b"*%d\r\n$%d\r\n%s\r\n" % (count + 1, len(command), command)
        self._send_packed(arguments, command.decode(), 1, header)

    def _send_packed(
        self, packed: pa.Array, command: str, replies: int, header: bytes = b""
    ) -> None:
        """``header`` then the bytes of ``packed`` (binary, no nulls), owing ``replies`` replies."""
        _, offsets_buffer, body = packed.buffers()
        offsets = np.frombuffer(offsets_buffer, np.int32)
        first, last = int(offsets[packed.offset]), int(offsets[packed.offset + len(packed)])
        self._connection.send_packed_command(  # type: ignore[no-untyped-call]
            [header, memoryview(body)[first:last]]
        )
        self._pending.append((command, replies))
        while len(self._pending) > IN_FLIGHT:
            self._reply()

    def _reply(self) -> None:
        command, replies = self._pending.popleft()
        for _ in range(replies):
            reply = self._connection.read_response()
            if isinstance(reply, redis.ResponseError):
                raise reply
            if command in ("MSET", "SET") and reply not in (b"OK", "OK", True):
                raise redis.ResponseError(f"{command} answered {reply!r}")

    def close(self) -> None:
        """Wait for the replies of every command sent, then give the connection back."""
        try:
            while self._pending:
                self._reply()
        except BaseException:
            self._connection.disconnect()  # type: ignore[no-untyped-call]
            raise
        finally:
            self._client.connection_pool.release(self._connection)

    def __enter__(self) -> BulkWriter:
        return self

    def __exit__(self, error_type: type[BaseException] | None, *_: object) -> None:
        if error_type is None:
            self.close()
            return
        # Replies still owed would be read from a connection in an unknown state: drop it.
        self._connection.disconnect()  # type: ignore[no-untyped-call]
        self._client.connection_pool.release(self._connection)


class ClusterBulkWriter:
    """``BulkWriter``'s calls on a Redis Cluster: pipelined ``SET``s routed by slot."""

    def __init__(self, client: RedisCluster) -> None:
        self._client = client
        self.written = 0

    def mset(self, keys: pa.Array, values: pa.Array) -> None:
        """``SET`` every key to its value, ``PAIRS_PER_COMMAND`` per pipeline."""
        self._set(keys, values, None)

    def set_expiring(self, keys: pa.Array, values: pa.Array, expiry_ms: pa.Array) -> None:
        """``SET key value PX ms`` per entity."""
        self._set(keys, values, expiry_ms)

    def _set(self, keys: pa.Array, values: pa.Array, expiry_ms: pa.Array | None) -> None:
        for start in range(0, len(keys), PAIRS_PER_COMMAND):
            chunk = keys.slice(start, PAIRS_PER_COMMAND).to_pylist()
            chunk_values = values.slice(start, PAIRS_PER_COMMAND).to_pylist()
            expiries = (
                [None] * len(chunk)
                if expiry_ms is None
                else expiry_ms.slice(start, PAIRS_PER_COMMAND).to_pylist()
            )
            pipe = self._client.pipeline(transaction=False)  # type: ignore[no-untyped-call]
            for key, value, px in zip(chunk, chunk_values, expiries, strict=True):
                pipe.set(key, value, px=px)
            pipe.execute()
            self.written += len(chunk)

    def delete(self, keys: Iterable[bytes]) -> int:
        """``DEL`` the keys (split by slot); the number asked."""
        asked = 0
        for chunk in chunked(keys, PAIRS_PER_COMMAND):
            self._client.delete(*chunk)
            asked += len(chunk)
        return asked

    def __enter__(self) -> ClusterBulkWriter:
        return self

    def __exit__(self, *_: object) -> None:
        return None


def bulk_writer(client: Client) -> BulkWriter | ClusterBulkWriter:
    """The bulk writer for a single server or a cluster."""
    if is_cluster(client):
        return ClusterBulkWriter(client)
    return BulkWriter(client)


def _bulk_strings(items: pa.Array) -> pa.Array:
    """Each item as a RESP bulk string, ``$<len>\\r\\n<bytes>\\r\\n``."""
    binary = pc.cast(items, pa.binary())
    lengths = pc.cast(pc.cast(pc.binary_length(binary), pa.string()), pa.binary())
    return pc.binary_join_element_wise(b"$", lengths, b"\r\n", binary, b"\r\n", b"")


def _bulk_pairs(keys: pa.Array, values: pa.Array) -> pa.Array:
    """Each key and its value as two RESP bulk strings, one array element per pair."""
    return pc.binary_join_element_wise(_bulk_strings(keys), _bulk_strings(values), b"")
