"""Lookups down the store's pipelined connection: concurrent ones each get their own entity
and share a watermark read; a connection lost or a Redis too slow fails them alone."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from typing import Any

import grpc
import redis
import trustme

from materializer.clients.redis import connect_async
from materializer.config import RedisConfig
from materializer.contract.redis_layout import entity_key, meta_key
from materializer.contract.watermark import Watermark
from materializer.testing import RedisServer, free_port
from query_service.errors import StoreUnavailable
from query_service.stores.generations import Generations
from query_service.stores.lookup_connection import LookupConnection
from query_service.stores.redis import WATERMARK_SECONDS, RedisMapStore


def _calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_concurrent_lookups_share_one_watermark_read_and_each_gets_its_entity(
    redis_url: str, redis_client: redis.Redis
):
    name = f"co{uuid.uuid4().hex[:8]}"
    for i in range(200):
        redis_client.set(entity_key(name, f"k{i}"), f'{{"i":{i}}}'.encode())
    redis_client.hset(meta_key(name), mapping=Watermark(5, {"t": {0: 9}}).to_hash())
    before = _calls(redis_client, "hgetall")

    async def main() -> tuple[list[tuple[bytes | None, int | None]], float]:
        store = RedisMapStore.from_url(redis_url)
        try:
            keys = [f"k{i % 250}" for i in range(500)]  # some absent, some asked twice
            started = time.monotonic()
            found = await asyncio.gather(*(store.get_with_watermark(name, k) for k in keys))
            took = time.monotonic() - started
            return [(f.entity, f.watermark.batch_id if f.watermark else None) for f in found], took
        finally:
            await store.close()

    answers, took = asyncio.run(main())
    expected = [(f'{{"i":{i % 250}}}'.encode() if i % 250 < 200 else None, 5) for i in range(500)]
    assert answers == expected
    # A watermark read in flight is shared by the lookups written after it, and one answered
    # serves those of the next WATERMARK_SECONDS: not a read per lookup.
    reads = _calls(redis_client, "hgetall") - before
    assert 1 <= reads <= 1 + took / WATERMARK_SECONDS


def test_lookups_keep_their_one_connection(redis_url: str, redis_client: redis.Redis):
    name = f"co{uuid.uuid4().hex[:8]}"
    redis_client.set(entity_key(name, "k"), b'{"v":0}')

    own = f"lookups-{name}"  # this store's connections, whatever else talks to the server

    def clients() -> dict[int, str]:
        return {int(c["id"]): c["cmd"] for c in redis_client.client_list() if c["name"] == own}

    async def main() -> tuple[dict[int, str], dict[int, str]]:
        store = RedisMapStore.from_url(f"{redis_url}?client_name={own}")
        try:
            await asyncio.gather(*(store.get_with_watermark(name, "k") for _ in range(50)))
            first = clients()
            gc.collect()  # nothing collected may close the connection the lookups use
            await asyncio.sleep(0.1)
            await asyncio.gather(*(store.get_with_watermark(name, "k") for _ in range(50)))
            return first, clients()
        finally:
            await store.close()

    first, later = asyncio.run(main())
    # The store's connections: its client's (generations, watermarks) and the lookups'.
    assert list(first.values()).count("get") >= 1  # the lookups' connection among them
    # The second round of lookups went down the same connections: none closed, none new.
    assert set(later) == set(first)


def test_a_lookup_connection_redis_closed_is_made_again(redis_url: str, redis_client: redis.Redis):
    name = f"co{uuid.uuid4().hex[:8]}"
    redis_client.set(entity_key(name, "k"), b'{"v":1}')

    async def main() -> list[bytes | None]:
        store = RedisMapStore.from_url(redis_url)
        try:
            first = await store.get_with_watermark(name, "k")
            # Every connection of the store's lookups goes, as on a Redis restart or a
            # server-side idle timeout.
            for client in redis_client.client_list():
                if client["cmd"] in ("get", "mget", "hgetall"):
                    redis_client.client_kill_filter(_id=client["id"])
            second = await store.get_with_watermark(name, "k")
            return [first.entity, second.entity]
        finally:
            await store.close()

    assert asyncio.run(main()) == [b'{"v":1}', b'{"v":1}']


def test_a_lookup_redis_does_not_answer_in_time_is_unavailable_then_served(
    redis_url: str, redis_client: redis.Redis
):
    name = f"co{uuid.uuid4().hex[:8]}"
    redis_client.set(entity_key(name, "k"), b'{"v":2}')

    async def main() -> tuple[BaseException | object, bytes | None]:
        store = RedisMapStore.from_url(f"{redis_url}?socket_timeout=0.3")
        try:
            await store.get_with_watermark(name, "k")  # connected, generation known
            redis_client.client_pause(1500)  # every client's reads wait 1.5 s
            late = await asyncio.gather(store.get_with_watermark(name, "k"), return_exceptions=True)
            redis_client.client_unpause()
            return late[0], (await store.get_with_watermark(name, "k")).entity
        finally:
            await store.close()

    late, entity = asyncio.run(main())
    assert isinstance(late, StoreUnavailable), late
    assert "TimeoutError" in str(late)
    assert entity == b'{"v":2}'


def test_a_gathering_fails_together_when_redis_is_gone(tmp_path):
    server = RedisServer(tmp_path).start()
    url = server.url
    server.stop()

    async def main() -> list[BaseException | object]:
        store = RedisMapStore.from_url(url)
        try:
            return await asyncio.gather(
                *(store.get_with_watermark("m", f"k{i}") for i in range(10)),
                return_exceptions=True,
            )
        finally:
            await store.close()

    results = asyncio.run(main())
    assert all(isinstance(r, StoreUnavailable) for r in results)
    assert all(r.code == grpc.StatusCode.UNAVAILABLE for r in results)  # type: ignore[union-attr]


def test_lookups_over_tls_with_a_password(tmp_path):
    """The lookups' connection is made by redis-py from the URL (TLS, AUTH) and taken
    over from it: its reads go over the same encrypted, authenticated stream."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_file, key_file, cert_file = tmp_path / "ca.pem", tmp_path / "key.pem", tmp_path / "cert.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    tls_port = free_port()
    options = ["--tls-port", str(tls_port), "--tls-auth-clients", "no"]
    options += ["--tls-cert-file", str(cert_file), "--tls-key-file", str(key_file)]
    options += ["--tls-ca-cert-file", str(ca_file)]
    with RedisServer(tmp_path, options) as server:
        plain = redis.Redis.from_url(server.url)
        plain.set(entity_key("m", "k"), b'{"over":"tls"}')
        plain.hset(meta_key("m"), mapping=Watermark(3, {"t": {0: 1}}).to_hash())
        plain.config_set("requirepass", "s3cret")
        plain.close()
        url = f"rediss://:s3cret@127.0.0.1:{tls_port}/0?ssl_ca_certs={ca_file}"

        async def main() -> tuple[bytes | None, int | None]:
            store = RedisMapStore.from_url(url)
            try:
                found = await store.get_with_watermark("m", "k")
                return found.entity, found.watermark.batch_id if found.watermark else None
            finally:
                await store.close()

        assert asyncio.run(main()) == (b'{"over":"tls"}', 3)


def test_lookups_given_up_on_leave_the_others_their_own_entities(
    redis_url: str, redis_client: redis.Redis
):
    """Replies are matched to commands by order: a lookup cancelled while its command is
    on the wire must not shift the replies of the lookups written after it."""
    name = f"co{uuid.uuid4().hex[:8]}"
    for i in range(100):
        redis_client.set(entity_key(name, f"k{i}"), f'{{"i":{i}}}'.encode())

    async def main() -> list[bytes | None]:
        store = RedisMapStore.from_url(redis_url)
        try:
            await store.get_with_watermark(name, "k0")  # connected, generation known
            tasks = [
                asyncio.create_task(store.get_with_watermark(name, f"k{i}")) for i in range(100)
            ]
            await asyncio.sleep(0)  # every lookup has written its command
            for task in tasks[::3]:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            later = await asyncio.gather(*(store.get_with_watermark(name, f"k{i}") for i in (5, 6)))
            return [None if isinstance(r, BaseException) else r.entity for r in [*results, *later]]
        finally:
            await store.close()

    entities = asyncio.run(main())
    for i in range(100):
        if i % 3:
            assert entities[i] == f'{{"i":{i}}}'.encode(), i
    assert entities[100:] == [b'{"i":5}', b'{"i":6}']


def test_a_key_redis_cannot_be_sent_fails_alone(redis_url: str, redis_client: redis.Redis):
    name = f"co{uuid.uuid4().hex[:8]}"
    redis_client.set(entity_key(name, "a"), b'{"a":1}')
    redis_client.set(entity_key(name, "b"), b'{"b":2}')

    async def main() -> list[Any]:
        store = RedisMapStore.from_url(redis_url)
        try:
            return await asyncio.gather(
                store.get_with_watermark(name, "a"),
                store.get_with_watermark(name, "bad\ud800"),  # no UTF-8 for a lone surrogate
                store.get_with_watermark(name, "b"),
                return_exceptions=True,
            )
        finally:
            await store.close()

    first, bad, last = asyncio.run(main())
    assert isinstance(bad, UnicodeEncodeError)
    assert (first.entity, last.entity) == (b'{"a":1}', b'{"b":2}')


class _CountedWrites:
    """A transport that counts its writes, passing everything on."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.transport.write(data)

    def abort(self) -> None:
        self.transport.abort()


def test_the_commands_of_one_loop_turn_go_out_in_one_write(
    redis_url: str, redis_client: redis.Redis
):
    name = f"co{uuid.uuid4().hex[:8]}"
    for i in range(50):
        redis_client.set(entity_key(name, f"k{i}"), f"v{i}".encode())

    async def main() -> tuple[list[Any], list[int], Any]:
        client = connect_async(RedisConfig(url=redis_url))
        lookups = LookupConnection(client.connection_pool, "the test's redis", 5.0)
        try:
            replies = await lookups.connected()
            counted = _CountedWrites(replies.transport)
            replies.transport = counted  # type: ignore[assignment]
            futures = [replies.send("GET", entity_key(name, f"k{i}")) for i in range(60)]
            writes = [counted.writes]  # nothing written before the turn ends
            values = list(await asyncio.gather(*futures))
            writes.append(counted.writes)
            last = await replies.send("GET", entity_key(name, "k7"))  # a turn of its own
            writes.append(counted.writes)
            return values, writes, last
        finally:
            lookups.close()
            await client.aclose()

    values, writes, last = asyncio.run(main())
    assert values == [f"v{i}".encode() for i in range(50)] + [None] * 10
    assert writes == [0, 1, 2]
    assert last == b"v7"


def test_lookups_over_resp3(redis_url: str, redis_client: redis.Redis):
    name = f"co{uuid.uuid4().hex[:8]}"
    redis_client.set(entity_key(name, "k"), b'{"resp":3}')
    redis_client.hset(meta_key(name), mapping=Watermark(8, {"t": {0: 4}}).to_hash())

    async def main() -> tuple[Any, ...]:
        store = RedisMapStore.from_url(f"{redis_url}?protocol=3")
        try:
            one = await store.get_with_watermark(name, "k")
            many = await store.get_many(name, ["k", "absent"])
            return one.entity, one.watermark, many.entities, many.watermark
        finally:
            await store.close()

    entity, mark, entities, same = asyncio.run(main())
    assert entity == b'{"resp":3}' and entities == [b'{"resp":3}', None]
    assert mark == same == Watermark(8, {"t": {0: 4}})


def test_a_closed_store_fails_its_lookups_in_flight_and_later(
    redis_url: str, redis_client: redis.Redis
):
    name = f"co{uuid.uuid4().hex[:8]}"
    redis_client.set(entity_key(name, "k"), b"{}")

    async def main() -> list[BaseException | object]:
        store = RedisMapStore.from_url(redis_url)
        await store.get_with_watermark(name, "k")
        redis_client.client_pause(500)  # the next lookup is still on its way when closed
        in_flight = asyncio.create_task(store.get_with_watermark(name, "k"))
        await asyncio.sleep(0.05)
        await store.close()
        later = asyncio.create_task(store.get_with_watermark(name, "k"))
        return list(await asyncio.gather(in_flight, later, return_exceptions=True))

    results = asyncio.run(main())
    assert all(isinstance(r, StoreUnavailable) for r in results), results


def test_a_generation_read_outlives_an_asker_given_up_on(redis_url: str):
    """Lookups share one read of a map's generation: the first asker's client giving up
    must not cancel it for the others."""

    async def main() -> list[BaseException | int]:
        client = connect_async(RedisConfig(url=redis_url))
        try:
            generations = Generations(client)
            first = asyncio.create_task(generations.generation("nogen"))
            await asyncio.sleep(0)  # the read is on its way
            second = asyncio.create_task(generations.generation("nogen"))
            await asyncio.sleep(0)
            first.cancel()
            return list(await asyncio.gather(first, second, return_exceptions=True))
        finally:
            await client.aclose()

    first, second = asyncio.run(main())
    assert isinstance(first, asyncio.CancelledError)
    assert second == 0  # a map never rebuilt is in its first generation


def test_a_store_read_cancelled_at_any_step_ends_cancelled(
    redis_url: str, redis_client: redis.Redis
):
    """A cancelled read never returns as if it had not been cancelled, whichever step of the
    send and the reply the cancellation meets (the client sends under ``wait_for``, which
    can drop one on Python 3.11); a caller that went on would wait out its whole budget."""
    name = f"co{uuid.uuid4().hex[:8]}"
    redis_client.hset(meta_key(name), mapping=Watermark(5, {"t": {0: 9}}).to_hash())

    async def main() -> dict[int, int]:
        """Per number of loop turns before the cancellation, the reads that returned."""
        store = RedisMapStore.from_url(redis_url)
        returned: dict[int, int] = {}
        try:
            await store.watermark(name)  # connected, generation known
            for attempt in range(600):
                steps = attempt % 8  # loop turns before the cancellation
                read = asyncio.create_task(store.watermark(name))
                for _ in range(steps):
                    await asyncio.sleep(0)
                if not read.cancel():
                    continue  # done before it could be cancelled
                try:
                    await read
                except asyncio.CancelledError:
                    continue
                returned[steps] = returned.get(steps, 0) + 1
            return returned
        finally:
            await store.close()

    assert asyncio.run(main()) == {}
