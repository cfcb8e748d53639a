"""Which HTTP framework the query service's HTTP/JSON front rides on: a spike.

Each candidate serves one bare endpoint shaped like the entity lookup,
``GET /v1/maps/{map}/entities/{key}``, answering a fixed ~300-byte JSON body,
in a process of its own; closed-loop generators in other processes (raw
HTTP/1.1 keep-alive connections over asyncio streams, the same code for every
candidate) drive it for ``--seconds``. Reported per candidate: requests/s and
the server's CPU per request (the figure that stays meaningful when the
generators compete with the server for the machine's two cores).

Candidates: Starlette and FastAPI on uvicorn (uvloop, httptools), aiohttp's
own server; and FastAPI with a typed path (the OpenAPI document generated from
the signature) against FastAPI returning a prebuilt ``Response``.

    .venv/bin/python bench/http_spike.py [--seconds 10] [--procs 2] [--connections 16]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import time
from typing import Any

import orjson

BODY = orjson.dumps(
    {
        "key": "user-000042",
        "found": True,
        "entity": {
            "id": "user-000042",
            "name": "Name 42",
            "email": "user-000042@example.org",
            "city": "Lisbon",
            "age": 42,
            "score": 512.25,
            "plan": "pro",
        },
        "watermark": {"batch_id": 12, "offsets": {"events": {"0": 1000, "1": 998}}},
    }
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(kind: str, port: int) -> None:
    import uvloop

    if kind == "aiohttp":
        from aiohttp import web

        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=BODY, content_type="application/json")

        app = web.Application()
        app.router.add_get("/v1/maps/{map}/entities/{key}", handler)
        uvloop.install()
        web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)
        return
    import uvicorn

    if kind == "starlette":
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        async def entity(request: Request) -> Response:
            return Response(BODY, media_type="application/json")

        asgi: Any = Starlette(routes=[Route("/v1/maps/{map}/entities/{key}", entity)])
    else:
        from fastapi import FastAPI
        from fastapi.responses import Response as FResponse

        asgi = FastAPI()
        if kind == "fastapi":

            @asgi.get("/v1/maps/{map_name}/entities/{key}")
            async def typed(map_name: str, key: str, timeout_ms: int | None = None) -> FResponse:
                return FResponse(BODY, media_type="application/json")
        else:

            @asgi.get("/v1/maps/{map_name}/entities/{key}")
            async def model(map_name: str, key: str) -> dict[str, Any]:
                return orjson.loads(BODY)  # type: ignore[no-any-return]

    uvicorn.run(
        asgi,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


async def _drive(port: int, connections: int, seconds: float) -> int:
    request = b"GET /v1/maps/users/entities/user-000042 HTTP/1.1\r\nHost: x\r\n\r\n"
    done = 0
    deadline = time.perf_counter() + seconds

    async def one() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < deadline:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            done += 1
        writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return done


def drive(port: int, connections: int, seconds: float, out: Any) -> None:
    import uvloop

    out.put(uvloop.run(_drive(port, connections, seconds)))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    ctx = mp.get_context("spawn")
    server = ctx.Process(target=serve, args=(kind, port), daemon=True)
    server.start()
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    # Warm up, then measure.
    asyncio.run(_drive(port, 2, 1.0))
    out = ctx.Queue()
    cpu0 = cpu_seconds(server.pid or 0)
    started = time.perf_counter()
    procs = [
        ctx.Process(target=drive, args=(port, args.connections, args.seconds, out))
        for _ in range(args.procs)
    ]
    for p in procs:
        p.start()
    total = sum(out.get() for _ in procs)
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(server.pid or 0) - cpu0
    for p in procs:
        p.join()
    server.terminate()
    server.join()
    return {
        "name": f"http_spike_{kind}",
        "requests_per_s": round(total / elapsed),
        "server_cpu_us_per_request": round(cpu / total * 1e6, 1),
        "server_cores": round(cpu / elapsed, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--kinds", default="starlette,fastapi,fastapi_model,aiohttp")
    args = parser.parse_args()
    print(orjson.dumps({"name": "setup", "cpus": os.cpu_count()}).decode(), flush=True)
    for kind in args.kinds.split(","):
        print(orjson.dumps(measure(kind, args)).decode(), flush=True)


if __name__ == "__main__":
    main()
