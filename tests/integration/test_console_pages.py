"""The web console's pages and fragments, rendered by a real query service over a real
redis-server and Kafka: login and sessions, where a login may send the browser, what each
token sees and may do, actions with their CSRF token, escaping of user data, the charts'
data, the live changes, and the map form's errors and what it stores in the catalog."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import aiohttp
import orjson
import pytest
import redis
import yaml
from yarl import URL

from materializer.config import AppConfig, parse_config
from materializer.contract.history import HistorySample
from materializer.contract.redis_layout import (
    console_session_key,
    control_key,
    history_key,
    operation_key,
    status_key,
)
from materializer.contract.status import MapReport
from query_service.console.sessions import COOKIE
from tests.helpers.query_redis import fresh_map, map_doc, started, write_batch
from tests.helpers.slices import SCHEMA
from tests.integration.test_maps_api import stored as stored_maps

ADMIN = "console-admin-token-0123456789"
READER = "console-reader-token-0123456789"
SCRIPT = "<script>alert('x')</script>"


@pytest.fixture()
def first(redis_client: redis.Redis) -> Any:
    yield from fresh_map(redis_client)


@pytest.fixture()
def second(redis_client: redis.Redis) -> Any:
    yield from fresh_map(redis_client)


def console_config(
    redis_url: str, kafka: str, maps: list[str], monkeypatch: pytest.MonkeyPatch, reader: str
) -> AppConfig:
    tokens = {
        "tokens": [
            {"name": "admin", "token": ADMIN, "maps": ["*"], "verbs": ["*"]},
            {"name": "reader", "token": READER, "maps": [reader],
             "verbs": ["get", "query", "watch", "status"]},
        ]
    }  # fmt: skip
    monkeypatch.setenv("CONSOLE_TEST_TOKENS", yaml.safe_dump(tokens))
    return parse_config(
        {
            "kafka": {"bootstrap_servers": kafka},
            "redis": {"url": redis_url},
            "query": {"auth": {"tokens_env": "CONSOLE_TEST_TOKENS"}},
            # A catalog of the test's own: what the map form stores is read back from it.
            "catalog": {"topic": f"console-maps-{uuid.uuid4().hex[:10]}"},
            "maps": {m: map_doc(m) for m in maps},
        }
    )


def lands_at(origin: str, location: str) -> tuple[str, str]:
    """The host and path a browser goes to on this ``Location``, read as browsers read one
    (the WHATWG URL standard): tabs and newlines are dropped, a backslash is a slash, and
    ``%2e`` is a dot of a ``..`` segment."""
    read = re.sub(r"%2e", ".", re.sub(r"[\t\n\r]", "", location), flags=re.IGNORECASE)
    url = urlsplit(urljoin(origin + "/ui/login", read.replace("\\", "/")))
    return url.netloc, url.path


class Browser:
    """An HTTP session with a cookie jar, as a browser keeps one."""

    def __init__(self, http: aiohttp.ClientSession, origin: str) -> None:
        self.http, self.origin = http, origin
        self.base = origin + "/ui"

    async def page(self, path: str, status: int = 200, **kwargs: Any) -> str:
        async with self.http.get(self.base + path, **kwargs) as r:
            text = await r.text()
            assert r.status == status, (r.status, text[:500])
            return text

    async def post(self, path: str, data: dict[str, str], status: int = 303, **kw: Any) -> Any:
        async with self.http.post(self.base + path, data=data, allow_redirects=False, **kw) as r:
            text = await r.text()
            assert r.status == status, (r.status, text[:500])
            return r.headers, text

    async def login(self, token: str) -> str:
        headers, _ = await self.post("/login", {"token": token, "next": "/ui/"})
        assert headers["Location"] == "/ui/"
        cookie = headers["Set-Cookie"]
        assert cookie.startswith(f"{COOKIE}=") and token not in cookie
        for attribute in ("HttpOnly", "SameSite=Strict", "Path=/ui"):
            assert attribute in cookie, cookie
        overview = await self.page("/")
        return csrf_of(overview)


def csrf_of(page: str) -> str:
    found = re.search(r'data-csrf="([^"]+)"', page)
    assert found, "no CSRF token in the page"
    return found.group(1)


@asynccontextmanager
async def console(config: AppConfig) -> AsyncIterator[Browser]:
    jar = aiohttp.CookieJar(unsafe=True)  # keeps cookies of an IP address, as browsers do
    async with started(config) as servers, aiohttp.ClientSession(cookie_jar=jar) as http:
        yield Browser(http, f"http://127.0.0.1:{servers.http_port}")


def report(client: redis.Redis, name: str, state: str = "running") -> None:
    now = int(time.time() * 1000)
    fields = MapReport(state=state, reported_at_ms=now, worker="worker-a",
                       input_rows_per_second=120.0, processed_rows_per_second=118.0)  # fmt: skip
    client.hset(status_key(name), mapping=fields.to_hash())  # type: ignore[arg-type]


def history(client: redis.Redis, name: str, samples: int) -> list[HistorySample]:
    start = int(time.time() * 1000) - samples * 5000
    written = []
    for i in range(samples):
        sample = HistorySample(
            at_ms=start + i * 5000, state="running", input_rate=100.0 + i, fold_rate=90.0 + i,
            batches=3, batch_ms=200 + i, add_batch_ms=150, freshness_p50_ms=300 + i,
            freshness_p99_ms=700 + i, freshness_max_ms=900 + i, lag_records=i, lag_ms=400,
            dead_letters=i % 2, state_keys=10 * i, state_bytes=1000 * i,
        )  # fmt: skip
        client.xadd(history_key(name), sample.to_fields(), id=f"{sample.at_ms}-0")  # type: ignore[arg-type]
        written.append(sample)
    return written


def test_login_sessions_and_what_each_token_sees(
    redis_url: str, kafka_bootstrap: str, redis_client: redis.Redis, first: str, second: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    config = console_config(redis_url, kafka_bootstrap, [first, second], monkeypatch, first)
    for name in (first, second):
        report(redis_client, name)
        history(redis_client, name, 12)

    async def body(b: Browser) -> None:
        # Not logged in: pages send the browser to the login form, fragments answer 401.
        async with b.http.get(f"{b.base}/maps/{first}?x=1", allow_redirects=False) as r:
            assert r.status == 303
            to = urlsplit(r.headers["Location"])
            assert (to.path, parse_qs(to.query)) == (
                "/ui/login",
                {"next": [f"/ui/maps/{first}?x=1"]},
            )
        async with b.http.get(b.base + "/fragments/overview", headers={"HX-Request": "true"}) as r:
            assert r.status == 401 and r.headers["HX-Redirect"] == "/ui/login"
        async with b.http.get(b.origin + "/ui", allow_redirects=False) as r:
            assert r.status == 308 and r.headers["Location"] == "/ui/"
        headers, text = await b.post("/login", {"token": "not-a-token-at-all-xx"}, status=401)
        assert "unknown token" in text and "Set-Cookie" not in headers
        await redirects_stay_on_the_console(b)

        csrf = await b.login(ADMIN)
        overview = await b.page("/")
        for name in (first, second):
            assert f'data-map="{name}"' in overview
        assert "worker-a" in overview
        assert '<polyline points="0.0,' in overview  # the trend line of the samples
        fragment = await b.page("/fragments/overview")
        assert "<html" not in fragment and f'data-map="{first}"' in fragment
        map_page = await b.page(f"/maps/{first}")
        for button in ("pause", "resume", "restart", "verify", "rehydrate", "rebuild"):
            assert f'id="action-{button}"' in map_page
        assert 'href="/ui/new-map"' in map_page
        # The security headers every page carries.
        async with b.http.get(b.base + "/") as r:
            assert "script-src 'self'" in r.headers["Content-Security-Policy"]
            assert r.headers["X-Frame-Options"] == "DENY"

        # Log out: the session is gone for every replica (Redis), the cookie is useless.
        cookie = b.http.cookie_jar.filter_cookies(URL(b.base + "/"))[COOKIE].value
        session = console_session_key(hashlib.sha256(cookie.encode()).hexdigest())
        assert redis_client.hget(session, "name") == b"admin"
        await b.post("/logout", {"csrf": csrf})
        assert not redis_client.exists(session)
        async with b.http.get(b.base + "/", allow_redirects=False, cookies={COOKIE: cookie}) as r:
            assert r.status == 303 and r.headers["Location"].startswith("/ui/login?next=")

        # A read-only token granted one map sees that map only, and no action buttons.
        csrf = await b.login(READER)
        overview = await b.page("/")
        assert f'data-map="{first}"' in overview and f'data-map="{second}"' not in overview
        map_page = await b.page(f"/maps/{first}")
        assert 'id="action-' not in map_page and 'href="/ui/new-map"' not in map_page
        denied = await b.page(f"/maps/{second}", status=403)
        assert "may not use map" in denied and second in denied
        # Posting an action anyway: refused by the same check as gRPC.
        _, text = await b.post(f"/maps/{first}/actions/pause", {"csrf": csrf}, status=403)
        assert "may not call Pause" in text
        assert redis_client.hget(control_key(first), "desired") is None

    asyncio.run(_serve(config, body))


async def redirects_stay_on_the_console(b: Browser) -> None:
    """A login's ``next`` sends the browser back to a page of the console, and to nothing
    else: not another site, however its address is spelt, nor another path of the host."""
    console_host = urlsplit(b.origin).netloc
    # A page of the console: kept and followed as it was asked (the checks below can fail).
    form = await b.page("/login", params={"next": "/ui/maps/m?x=1"})
    assert 'name="next" value="/ui/maps/m?x=1"' in form
    headers, _ = await b.post("/login", {"token": READER, "next": "/ui/maps/m?x=1"})
    assert headers["Location"] == "/ui/maps/m?x=1"
    elsewhere = [
        "https://evil.example/",
        "//evil.example/",
        "/\\evil.example/",
        "\\\\evil.example/",
        "https:evil.example",
        "/\t/evil.example/",
        "javascript:alert(1)",
        f"{b.origin}/v1/maps",
        "/v1/maps",
        "/ui",
        "/ui/../v1/maps",
        "/ui/%2e%2e/v1/maps",
        "/ui/.%2E/v1/maps",
        "/ui/..\\v1/maps",
    ]
    for target in elsewhere:
        # The form keeps only a console path for after the login...
        form = await b.page("/login", params={"next": target})
        kept = re.search(r'name="next" value="([^"]*)"', form)
        assert kept and kept.group(1) == "/ui/", (target, kept and kept.group(1))
        # ...and a login posted with it anyway lands on the console.
        headers, _ = await b.post("/login", {"token": READER, "next": target})
        assert lands_at(b.origin, headers["Location"]) == (console_host, "/ui/"), target
    # A wrong token with a foreign ``next`` sends nowhere either.
    headers, _ = await b.post("/login", {"token": "x", "next": "https://evil.example/"}, 401)
    assert "Location" not in headers


async def _serve(config: AppConfig, body: Any) -> None:
    async with console(config) as b:
        await body(b)


def test_actions_need_the_sessions_csrf_token_and_a_typed_name(
    redis_url: str, kafka_bootstrap: str, redis_client: redis.Redis, first: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    config = console_config(redis_url, kafka_bootstrap, [first], monkeypatch, first)
    report(redis_client, first)

    async def body(b: Browser) -> None:
        csrf = await b.login(ADMIN)
        await b.post(f"/maps/{first}/actions/pause", {}, status=403)
        await b.post(f"/maps/{first}/actions/pause", {"csrf": "forged"}, status=403)
        await b.post(f"/maps/{first}/actions/pause", {"csrf": csrf}, status=403,
                     headers={"Origin": "https://evil.example"})  # fmt: skip
        assert redis_client.hget(control_key(first), "desired") is None
        headers, _ = await b.post(f"/maps/{first}/actions/pause", {"csrf": csrf})
        assert headers["Location"] == f"/ui/maps/{first}?done=pause"
        assert redis_client.hget(control_key(first), "desired") == b"paused"
        await b.post(f"/maps/{first}/actions/resume", {"csrf": csrf})
        assert redis_client.hget(control_key(first), "desired") == b"running"
        # A destructive action without the map's name typed does nothing...
        _, text = await b.post(f"/maps/{first}/actions/rebuild", {"csrf": csrf}, status=400)
        assert "to confirm" in text
        await b.post(f"/maps/{first}/actions/rebuild", {"csrf": csrf, "confirm": "x"}, 400)
        assert not redis_client.exists(operation_key(first))
        # ...and with it typed, the rebuild is asked of the run.
        headers, _ = await b.post(
            f"/maps/{first}/actions/rebuild", {"csrf": csrf, "confirm": first}
        )
        assert headers["Location"] == f"/ui/maps/{first}?done=rebuild"
        asked = redis_client.hgetall(operation_key(first))
        assert (asked[b"kind"], asked[b"requested_by"]) == (b"rebuild", b"admin"), asked
        await b.post(f"/maps/{first}/actions/nonsense", {"csrf": csrf}, status=404)

    asyncio.run(_serve(config, body))


def test_entities_render_as_text_with_the_watermark_and_the_commands(
    redis_url: str, kafka_bootstrap: str, redis_client: redis.Redis, first: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    config = console_config(redis_url, kafka_bootstrap, [first], monkeypatch, first)
    topic = f"{first}-events"
    hostile = orjson.dumps({"id": SCRIPT, "name": SCRIPT})
    write_batch(redis_url, first, 7, {SCRIPT: hostile, "plain": b'{"id":"plain"}'},
                {topic: {0: 42}})  # fmt: skip

    async def body(b: Browser) -> None:
        await b.login(READER)
        page = await b.page(f"/maps/{first}/entities", params={"op": "get", "key": SCRIPT})
        assert SCRIPT not in page
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
        assert 'id="watermark"' in page and "batch 7" in page and f"{topic} [0] 42" in page
        assert f"/v1/maps/{first}/entities/%3Cscript%3E" in page  # the curl command
        assert "materializer.v1.MapService/Get" in page
        page = await b.page(
            f"/maps/{first}/entities", params={"op": "batch", "keys": "plain, missing"}
        )
        assert 'data-key="plain"' in page and "not found" in page and "batch 7" in page
        page = await b.page(f"/maps/{first}/entities", params={"op": "get", "key": "nope"})
        assert "not found" in page
        # A refused read is said on the page, with its code.
        page = await b.page(f"/maps/{first}/entities", params={"op": "asof", "key": "plain",
                                                              "as_of": "yesterday"})  # fmt: skip
        assert "INVALID_ARGUMENT" in page and "yesterday" in page

    asyncio.run(_serve(config, body))


def test_history_json_holds_the_samples_series(
    redis_url: str, kafka_bootstrap: str, redis_client: redis.Redis, first: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    config = console_config(redis_url, kafka_bootstrap, [first], monkeypatch, first)
    written = history(redis_client, first, 20)

    async def body(b: Browser) -> None:
        await b.login(READER)
        async with b.http.get(f"{b.base}/maps/{first}/history.json") as r:
            assert r.status == 200
            data = orjson.loads(await r.read())
        assert data["t"] == [s.at_ms for s in written]
        series = data["series"]
        assert series["fold_rate"] == [s.fold_rate for s in written]
        assert series["freshness_p99_ms"] == [s.freshness_p99_ms for s in written]
        assert series["lag_seconds"] == [0.4] * 20
        assert series["delta_trailing"] == [None] * 20  # unknown stays a gap, not a zero
        assert series["dead_letters_per_minute"][0] is None
        assert series["dead_letters_per_minute"][1:] == [(i % 2) * 12.0 for i in range(1, 20)]
        since = written[15].at_ms
        async with b.http.get(f"{b.base}/maps/{first}/history.json?since={since}") as r:
            assert orjson.loads(await r.read())["t"] == [s.at_ms for s in written[15:]]

    asyncio.run(_serve(config, body))


def test_live_changes_arrive_as_server_sent_events(
    redis_url: str, kafka_bootstrap: str, redis_client: redis.Redis, first: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    config = console_config(redis_url, kafka_bootstrap, [first], monkeypatch, first)
    write_batch(redis_url, first, 1, {"a": b'{"id":"a"}'})

    async def body(b: Browser) -> None:
        await b.login(READER)
        page = await b.page(f"/maps/{first}/changes", params={"key": "b"})
        assert f'data-stream="/ui/maps/{first}/changes/stream?key=b"' in page
        async with b.http.get(f"{b.base}/maps/{first}/changes/stream?key=b") as r:
            assert r.status == 200 and r.content_type == "text/event-stream"
            write_batch(redis_url, first, 2, {"a": b'{"id":"a2"}', "b": b'{"id":"b"}'})
            data = None
            while data is None:
                line = (await asyncio.wait_for(r.content.readline(), 30)).decode()
                if line.startswith("data: "):
                    data = orjson.loads(line[6:])
        assert (data["key"], data["op"], data["entity"]) == ("b", "upsert", {"id": "b"})

    asyncio.run(_serve(config, body))


def test_the_map_form_stores_for_a_managing_token_only_and_shows_problems_by_field(
    redis_url: str, kafka_bootstrap: str, first: str, monkeypatch: pytest.MonkeyPatch,
    new_topic: Callable[..., str],
) -> None:  # fmt: skip
    config = console_config(redis_url, kafka_bootstrap, [first], monkeypatch, first)
    name = f"made-{uuid.uuid4().hex[:8]}"
    section = {"source": {"topics": [new_topic(1)], "schema": SCHEMA}, "key": "id"}
    fields = {"name": name, "config": yaml.safe_dump(section)}

    async def body(b: Browser) -> None:
        # A read-only token sees the form, but storing it is refused by the same check as
        # gRPC's CreateMap, and nothing reaches the catalog.
        csrf = await b.login(READER)
        assert 'name="config"' in await b.page("/new-map")
        _, text = await b.post("/new-map", {"csrf": csrf, **fields}, status=403)
        assert "may not call CreateMap" in text
        assert await asyncio.to_thread(stored_maps, config) == {}
        # The same form from a token that may manage maps stores the map, as it was typed.
        csrf = await b.login(ADMIN)
        form = await b.page("/new-map")
        assert 'name="config"' in form
        headers, _ = await b.post("/new-map", {"csrf": csrf, **fields})
        assert headers["Location"] == f"/ui/maps/{name}?done=saved"
        assert await asyncio.to_thread(stored_maps, config) == {name: section}
        _, text = await b.post("/new-map", {"csrf": csrf, "name": "", "config": "a: ["}, 400)
        assert 'data-field="name"' in text and 'data-field="config"' in text
        assert "not valid YAML" in text
        bad = yaml.safe_dump({"source": {"topics": []}, "key": "id"})
        _, text = await b.post("/new-map", {"csrf": csrf, "name": "x-map", "config": bad}, 400)
        problems = re.findall(r'data-field="config">([^<]+)<', text)
        assert problems and any("topics" in p for p in problems), text[:2000]
        assert "source:" in text  # what was typed stays in the form
        _, text = await b.post(
            f"/maps/{first}/actions/delete", {"csrf": csrf, "confirm": "wrong"}, 400
        )
        assert "to confirm" in text
        assert await asyncio.to_thread(stored_maps, config) == {name: section}  # no more

    asyncio.run(_serve(config, body))


def test_an_open_console_keeps_sessions_for_pages_only_and_still_checks_forms(
    redis_url: str, kafka_bootstrap: str, redis_client: redis.Redis, first: str
) -> None:
    config = parse_config(
        {
            "kafka": {"bootstrap_servers": kafka_bootstrap},
            "redis": {"url": redis_url},
            "maps": {first: map_doc(first)},
        }
    )
    report(redis_client, first)
    html = {"Accept": "text/html"}

    async def body(b: Browser) -> None:
        async with b.http.get(f"{b.base}/maps/{first}/history.json") as r:
            assert r.status == 200 and "Set-Cookie" not in r.headers  # nothing stored
        await b.post(f"/maps/{first}/actions/pause", {"csrf": ""}, status=403)
        page = await b.page(f"/maps/{first}", headers=html)
        csrf = csrf_of(page)
        assert 'id="action-pause"' in page and "Log out" not in page
        await b.post(f"/maps/{first}/actions/pause", {"csrf": "forged"}, status=403)
        assert redis_client.hget(control_key(first), "desired") is None
        await b.post(f"/maps/{first}/actions/pause", {"csrf": csrf})
        assert redis_client.hget(control_key(first), "desired") == b"paused"
        # Pages of maps that do not exist, and forms that cannot be stored.
        await b.page("/maps/nope/entities", status=404, headers=html)
        await b.page("/maps/nope/changes", status=404, headers=html)
        bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"
        _, text = await b.post("/new-map", {"csrf": csrf, "name": "m", "config": bomb}, 400)
        assert "aliases" in text
        big = "a: " + "x" * (65 * 1024)
        _, text = await b.post("/new-map", {"csrf": csrf, "name": "m", "config": big}, 400)
        assert "longer than 64 KiB" in text
        # An echo of what was done names an action, never free text.
        page = await b.page(f"/maps/{first}?done=pause", headers=html)
        assert '<p class="notice" id="notice">Done: pause</p>' in page
        page = await b.page(f"/maps/{first}?done=call+555-0100", headers=html)
        assert "555-0100" not in page and 'id="notice"' not in page

    asyncio.run(_serve(config, body))
