"""Web console benchmark: how long the pages take to render with 50 maps, server-side.

One ``query-service serve`` process (as users run it) over one ``redis-server`` and one
Kafka broker, with 50 maps, each with a topic of 3 partitions, a status report, an
hour of history samples (720 at the default 5 s), a watermark and a few entities.
A client on the same machine logs in and asks each page in turn, one request at a
time, and the time from request to the last byte is recorded:

  overview        the overview page: every map's status (one GetStatus, which asks
                  Kafka for the log ends), the trend lines' samples, the workers;
  overview_rows   the fragment htmx fetches every 5 s;
  map_page        a map's page: status, config, Delta facts, dead letters (Kafka),
                  the maps in turn so that most views read Kafka;
  history_json    a map's chart data for the last hour (720 samples);
  entities_get    the entity browser with one Get;
  floor_healthz   the HTTP front's /healthz on the same process: the cost of a request
                  that does nothing, measured in the same run.

Goal: each page under 200 ms at p99. Lines are JSON: ``p50_ms``, ``p99_ms``, ``max_ms``.

    .venv/bin/python bench/console.py [--maps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
import redis
import yaml
from harness import emit, machine, services

from materializer.contract.history import HistorySample
from materializer.contract.redis_layout import history_key, meta_key, status_key
from materializer.contract.status import MapReport
from materializer.testing.ports import free_port
from materializer.testing.process import ManagedProcess

TOKEN = "bench-console-token-0123456789"
SAMPLES = 720
INTERVAL_MS = 5000


def populate(client: redis.Redis, names: list[str]) -> None:
    now = int(time.time() * 1000)
    for name in names:
        pipe = client.pipeline(transaction=False)
        report = MapReport(state="running", reported_at_ms=now, worker="worker-1",
                           input_rows_per_second=500.0, processed_rows_per_second=498.0,
                           state_keys=10_000, state_bytes=4_000_000)  # fmt: skip
        pipe.hset(status_key(name), mapping=report.to_hash())  # type: ignore[arg-type]
        for i in range(SAMPLES):
            at = now - (SAMPLES - i) * INTERVAL_MS
            sample = HistorySample(
                at_ms=at, state="running", input_rate=500.0, fold_rate=498.0, batches=10,
                batch_ms=180, add_batch_ms=120, freshness_p50_ms=250, freshness_p99_ms=600,
                freshness_max_ms=800, lag_records=12, lag_ms=300, state_keys=10_000,
                state_bytes=4_000_000, delta_lag_ms=4000,
            )  # fmt: skip
            pipe.xadd(history_key(name), sample.to_fields(), id=f"{at}-0")  # type: ignore[arg-type]
        offsets = {f"{name}-events": {"0": 100, "1": 100, "2": 100}}
        meta = {"batch_id": "9", "offsets": orjson.dumps(offsets), "updated_at_ms": str(now),
                "app_id": "bench"}  # fmt: skip
        pipe.hset(meta_key(name), mapping=meta)  # type: ignore[arg-type]
        for k in range(20):
            pipe.set(f"{name}:user-{k}", orjson.dumps({"id": f"user-{k}", "tier": "gold"}))
        pipe.execute()


def create_topics(bootstrap: str, names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(f"{n}-events", 3, 1) for n in names])
    for future in futures.values():
        future.result()


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 1),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
        "max_ms": round(ordered[-1], 1),
    }


async def measure(base: str, names: list[str], rounds: int) -> None:
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.post(f"{base}/ui/login", data={"token": TOKEN, "next": "/ui/"}) as r:
            page = await r.text()
            assert r.status == 200 and "data-csrf" in page, r.status
        pages = {
            "overview": "/ui/",
            "overview_rows": "/ui/fragments/overview",
            "map_page": "/ui/maps/{map}",
            "history_json": "/ui/maps/{map}/history.json",
            "entities_get": "/ui/maps/{map}/entities?op=get&key=user-3",
            "floor_healthz": "/healthz",
        }
        for label, path in pages.items():
            times = []
            for i in range(rounds + 3):
                # The maps in turn: a map's page reads its dead letters from Kafka at most
                # every 5 s, so its first view in a while is the one that pays for it.
                url = base + path.format(map=names[(i * 7) % len(names)])
                started = time.perf_counter()
                async with http.get(url) as r:
                    body = await r.read()
                    assert r.status == 200, (label, r.status, body[:300])
                if i >= 3:  # the first few warm the process's caches and connections
                    times.append((time.perf_counter() - started) * 1000)
            if label == "overview":
                assert len(re.findall(rb"data-map=", body)) == len(names)
            emit(name=f"console_{label}", maps=len(names), rounds=rounds, bytes=len(body),
                 **percentiles(times))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--maps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    emit(name="console_setup", **machine())
    names = [f"console-bench-{i:02d}" for i in range(args.maps)]
    with services() as (bootstrap, redis_url), tempfile.TemporaryDirectory() as tmp:
        create_topics(bootstrap, names)
        populate(redis.Redis.from_url(redis_url), names)
        tokens = {"tokens": [{"name": "bench", "token": TOKEN, "maps": ["*"], "verbs": ["*"]}]}
        os.environ["BENCH_CONSOLE_TOKENS"] = yaml.safe_dump(tokens)
        config = {
            "kafka": {"bootstrap_servers": bootstrap},
            "redis": {"url": redis_url},
            "delta": {"root": str(Path(tmp) / "warehouse")},
            "query": {"auth": {"tokens_env": "BENCH_CONSOLE_TOKENS"}},
            "maps": {
                n: {"source": {"topics": [f"{n}-events"], "format": "json"}, "key": "id",
                    "fold": {"mode": "latest"}}
                for n in names
            },
        }  # fmt: skip
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        http_port = free_port()
        server = ManagedProcess(
            [str(Path(sys.executable).with_name("query-service")), "serve", "-c", str(path),
             "--port", "0", "--http-port", str(http_port), "--metrics-port", "0"],
            Path(tmp) / "query-service.log",
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{http_port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    asyncio.run(_ready(base))
                    break
                except (OSError, aiohttp.ClientError):
                    if time.monotonic() > deadline or not server.alive():
                        raise
                    time.sleep(0.2)
            asyncio.run(measure(base, names, args.rounds))
        finally:
            server.stop()


async def _ready(base: str) -> None:
    async with aiohttp.ClientSession() as http, http.get(base + "/readyz") as r:
        if r.status != 200:
            raise aiohttp.ClientError(f"not ready: {r.status}")


if __name__ == "__main__":
    main()
