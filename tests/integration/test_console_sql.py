"""The console's SQL page, rendered by a real query service over two maps' Delta tables:
a statement run as the session's token with its rows, the tables read with versions
and watermarks, the time taken, and the same asked by hand; a long answer cut at what
the page shows; refusals next to the editor with their code and message; a token
granted one map refused the other; values and statements shown as text."""

from __future__ import annotations

import asyncio
import html
import re
import shlex
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import orjson
import pytest

from materializer.config import AppConfig
from tests.helpers.sql_tables import BATCH_ID, USERS, SqlMaps, expected_groups
from tests.integration.test_console_pages import Browser, console

ADMIN = "console-sql-admin-token-0123456789"
READER = "console-sql-reader-token-0123456789"
VIEWER = "console-sql-viewer-token-0123456789"
SCRIPT = "<script>alert('x')</script>"


class AnswerTable(HTMLParser):
    """The cells of the page's ``#sql-answer`` table, as text, row by row."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.header: list[str] = []
        self.rows: list[list[str]] = []
        self._inside = False
        self._cell: list[str] | None = None
        self._in_head = False
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and ("id", "sql-answer") in attrs:
            self._inside = True
        elif self._inside and tag == "thead":
            self._in_head = True
        elif self._inside and tag == "tr" and not self._in_head:
            self.rows.append([])
        elif self._inside and tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._inside = False
        elif tag == "thead":
            self._in_head = False
        elif self._inside and tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell)
            (self.header if self._in_head else self.rows[-1]).append(text)
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def config_of(
    maps: SqlMaps, redis_url: str, kafka: str, monkeypatch: pytest.MonkeyPatch, **query: Any
) -> AppConfig:
    tokens = [
        {"name": "admin", "token": ADMIN, "maps": ["*"], "verbs": ["*"]},
        {"name": "reader", "token": READER, "maps": [maps.users], "verbs": ["query", "status"]},
        {"name": "viewer", "token": VIEWER, "maps": ["*"], "verbs": ["status"]},
    ]
    return maps.config(redis_url, tokens, "CONSOLE_SQL_TEST_TOKENS", monkeypatch, kafka, **query)


async def run(b: Browser, csrf: str, sql: str, params: str = "", status: int = 200) -> str:
    _, page = await b.post("/sql", {"csrf": csrf, "sql": sql, "params": params}, status=status)
    return str(page)


def serve(config: AppConfig, body: Any) -> None:
    async def main() -> None:
        async with console(config) as b:
            await body(b)

    asyncio.run(main())


def test_a_statement_runs_as_the_sessions_token_with_the_tables_it_read(
    redis_url: str, kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    maps = SqlMaps(tmp_path)
    maps.write()
    config = config_of(maps, redis_url, kafka_bootstrap, monkeypatch)

    async def body(b: Browser) -> None:
        csrf = await b.login(ADMIN)
        editor = await b.page("/sql")
        assert 'id="nav-sql"' in editor and 'name="csrf"' in editor and 'id="sql"' in editor
        for name in (maps.users, maps.orders):
            assert f"<code>{name}</code>" in editor  # the tables a statement may name

        page = await run(b, csrf, maps.group_by())
        table = AnswerTable(page)
        assert [h.split()[0] for h in table.header] == ["tier", "orders", "total"]
        assert table.rows == [
            [g["tier"], str(g["orders"]), str(g["total"])] for g in expected_groups()
        ]
        summary = re.search(r'<p id="sql-summary">([^<]*)</p>', page)
        assert summary and re.fullmatch(r"3 rows in \d+(\.\d)? m?s", summary.group(1)), summary
        for name in (maps.users, maps.orders):
            read = re.search(rf'<li class="watermark" data-map="{name}">(.*?)</li>', page, re.S)
            assert read, page
            text = " ".join(re.sub(r"<[^>]+>", "", read.group(1)).split())
            assert text == (
                f"{name}: version 1, watermark batch {BATCH_ID}; "
                f"offsets {name}-events [0] 40, [1] 12"
            )
        assert maps.group_by() in page  # the editor keeps the statement

        # The same by hand: the curl command's request answers the same rows.
        curl = re.search(r'<pre id="command-curl">([^<]*)</pre>', page)
        assert curl
        words = shlex.split(html.unescape(curl.group(1)))
        assert words[0] == "curl" and words[-1] == f"{b.origin}/v1/sql"
        sent = orjson.loads(words[words.index("-d") + 1])
        assert sent == {"sql": maps.group_by()}
        async with b.http.post(
            b.origin + "/v1/sql", json=sent, headers={"Authorization": f"Bearer {ADMIN}"}
        ) as r:
            assert (await r.json())["rows"] == expected_groups()
        cli = re.search(r'<pre id="command-cli">([^<]*)</pre>', page)
        assert cli and "materializer sql --address" in cli.group(1)

        # Parameters, one per line, typed as the CLI types them.
        statement = (
            f"SELECT _key, spend FROM {maps.users} WHERE tier = $1 AND spend > $2 ORDER BY _key"
        )
        page = await run(b, csrf, statement, "gold\n20\n")
        assert AnswerTable(page).rows == [
            [k, str(s)] for k, t, s in USERS if t == "gold" and s > 20
        ]

        # A long answer: the page shows its first 1,000 rows and says there were more.
        cross = (
            f"SELECT u._key, a._key AS a, c._key AS c FROM {maps.users} u "
            f"CROSS JOIN {maps.orders} a CROSS JOIN {maps.orders} c"
        )
        page = await run(b, csrf, cross)
        assert len(AnswerTable(page).rows) == 1000
        assert "the first 1000 shown, the answer has more" in page

        # Refused: the code and message next to the editor, the statement kept.
        page = await run(b, csrf, f"DELETE FROM {maps.users}", status=400)
        error = re.search(r'<p class="error" id="sql-error">(.*?)</p>', page, re.S)
        assert error and "INVALID_ARGUMENT" in error.group(1), page
        assert f"DELETE FROM {maps.users}" in page and 'id="sql-answer"' not in page
        page = await run(b, csrf, "SELECT * FROM nowhere_at_all", status=404)
        assert "NOT_FOUND" in page and "nowhere_at_all" in page
        # No form without the session's CSRF token.
        await b.post("/sql", {"sql": maps.group_by()}, status=403)

        # A token granted one map: the other is refused, naming it.
        await b.post("/logout", {"csrf": csrf})
        csrf = await b.login(READER)
        editor = await b.page("/sql")
        assert f"<code>{maps.users}</code>" in editor and maps.orders not in editor
        page = await run(b, csrf, maps.group_by(), status=403)
        error = re.search(r'<p class="error" id="sql-error">(.*?)</p>', page, re.S)
        assert error and "PERMISSION_DENIED" in error.group(1) and maps.orders in error.group(1)
        page = await run(b, csrf, f"SELECT count(*) AS n FROM {maps.users}")
        assert AnswerTable(page).rows == [[str(len(USERS))]]

        # A token without the query verb: no SQL link, and a statement posted is refused.
        await b.post("/logout", {"csrf": csrf})
        csrf = await b.login(VIEWER)
        overview = await b.page("/")
        assert 'id="nav-sql"' not in overview
        page = await run(b, csrf, f"SELECT count(*) AS n FROM {maps.users}", status=403)
        assert "may not call Execute" in page

    serve(config, body)


def test_values_and_statements_show_as_text_and_sql_can_be_off(
    redis_url: str, kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    maps = SqlMaps(tmp_path)
    maps.write([(key, SCRIPT if key == "u1" else tier, spend) for key, tier, spend in USERS])
    config = config_of(maps, redis_url, kafka_bootstrap, monkeypatch)

    async def body(b: Browser) -> None:
        csrf = await b.login(ADMIN)
        quoted = SCRIPT.replace("'", "''")
        statement = f"SELECT tier, '<b>{quoted}</b>' AS quoted FROM {maps.users} WHERE id = 'u1'"
        page = await run(b, csrf, statement)
        assert SCRIPT not in page and "<b>" not in page
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
        assert AnswerTable(page).rows == [[SCRIPT, f"<b>{SCRIPT}</b>"]]

    serve(config, body)

    off = config_of(maps, redis_url, kafka_bootstrap, monkeypatch, sql={"enabled": False})

    async def turned_off(b: Browser) -> None:
        csrf = await b.login(ADMIN)
        assert 'id="nav-sql"' not in await b.page("/")
        assert 'id="sql-off"' in await b.page("/sql")
        page = await run(b, csrf, f"SELECT * FROM {maps.users}", status=501)
        assert "UNIMPLEMENTED" in page and "query.sql.enabled" in page

    serve(off, turned_off)
