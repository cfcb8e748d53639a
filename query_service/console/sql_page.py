"""The console's SQL page: one statement over the maps, its rows, and the tables it read.

The statement runs as a POST of the page's form, with the session's CSRF token as every
form carries, although it changes nothing: a statement may be far longer than a URL
(``statement.MAX_SQL_CHARS``), and its text and parameters are the operator's, so they
are kept out of URLs, proxies' access logs and the browser's history. SameSite cookies
already keep another site from running one as the operator; the token keeps the rule
simple: every POST carries it.

The answer is asked for with a ``limit`` of ``SHOWN_ROWS`` and one more, so a large
answer costs what the page shows and still says it was cut, where the API would end it
with ``query.sql.max_rows``.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

import grpc
import orjson
from aiohttp import web

from materializer.v1 import sql_service_pb2 as sql_pb
from query_service import sql_text
from query_service.console.page import Page
from query_service.console.sessions import SESSION, Session
from query_service.errors import QueryServiceError
from query_service.http import sql_answers
from query_service.http.calls import HTTP_STATUS, HttpAbort
from query_service.sql.executor import Answer

SHOWN_ROWS = 1000
"""Rows a page shows at most; an answer with more says it was cut."""

NUMERIC = ("int", "uint", "float", "double", "decimal", "halffloat")
"""Arrow types whose columns are right-aligned, as figures are."""


def _params(text: str) -> list[str]:
    """The parameters' lines, blank ones left out (``""`` is an empty string)."""
    return [line.strip() for line in text.splitlines() if line.strip()]


class SqlPage(Page):
    """The editor, and a statement's run as the session's token."""

    async def form(self, request: web.Request) -> web.Response:
        """The editor, empty."""
        return self._page(request, statement="", params="")

    async def run(self, request: web.Request) -> web.Response:
        """Run the form's statement: its rows (at most ``SHOWN_ROWS``), the tables read
        with their versions and watermarks, and the time taken; a refusal's code and
        message next to the editor, with the HTTP status the API answers it with."""
        form = await request.post()
        statement = str(form.get("sql", ""))
        params = str(form.get("params", ""))
        session: Session = request[SESSION]
        started = time.perf_counter()
        try:
            values = [sql_text.text_param(p) for p in _params(params)]
            message = sql_pb.ExecuteRequest(
                sql=statement,
                params=[sql_answers.sql_param(v, i) for i, v in enumerate(values)],
                limit=SHOWN_ROWS + 1,
            )
            answer = await self._calls.sql(message, request, session.grant)
            try:
                result = await _read(answer)
            finally:
                await answer.close()
        except HttpAbort as exc:
            return self._refused(request, statement, params, exc.code, exc.message)
        except QueryServiceError as exc:  # a statement that failed once started
            return self._refused(request, statement, params, exc.code, str(exc))
        result["seconds"] = time.perf_counter() - started
        return self._page(
            request,
            statement=statement,
            params=params,
            result=result,
            commands=self._commands(request, statement, values),
        )

    def _refused(
        self,
        request: web.Request,
        statement: str,
        params: str,
        code: grpc.StatusCode,
        message: str,
    ) -> web.Response:
        return self._page(
            request,
            http_status=HTTP_STATUS.get(code, 500),
            statement=statement,
            params=params,
            error={"code": code.name, "message": message},
        )

    def _page(self, request: web.Request, http_status: int = 200, **values: Any) -> web.Response:
        session: Session = request[SESSION]
        tables = sorted(
            name
            for name in self._live.config.maps
            if session.grant is None or session.grant.allows_map(name)
        )
        return self.render(
            request,
            "sql.html",
            http_status,
            tables=tables,
            shown_rows=SHOWN_ROWS,
            **values,
        )

    def _commands(self, request: web.Request, statement: str, values: list[Any]) -> dict[str, str]:
        """The HTTP and CLI commands that ask the same; the token stays ``$TOKEN``."""
        query = self._live.config.query
        url = f"{request.scheme}://{request.host}/v1/sql"
        body: dict[str, Any] = {"sql": statement}
        if values:
            body["params"] = values
        granted = request[SESSION].grant is not None
        auth = ' -H "Authorization: Bearer $TOKEN"' if granted else ""
        curl = (
            f"curl{auth} -H 'Content-Type: application/json' "
            f"-d {shlex.quote(orjson.dumps(body).decode())} {shlex.quote(url)}"
        )
        address = f"{request.host.rsplit(':', 1)[0]}:{query.port}"
        cli = ["materializer", "sql", "--address", address]
        if query.tls is not None:
            cli.append("--tls")
        for value in values:
            cli += ["-p", _as_typed(value)]
        env = "MATERIALIZER_TOKEN=$TOKEN " if granted else ""
        # After "--", a statement that starts with "-" (a comment) is not read as an option.
        return {"curl": curl, "cli": env + shlex.join([*cli, "--", statement])}


def _as_typed(value: Any) -> str:
    """A parameter as the console and the CLI type one from text: a text that would read
    as another type (``42``, ``null``) goes as a JSON string."""
    if isinstance(value, str) and sql_text.text_param(value) == value:
        return value
    return orjson.dumps(value).decode()


async def _read(answer: Answer) -> dict[str, Any]:
    """The answer's first ``SHOWN_ROWS`` rows as cell texts, its columns and tables read."""
    rows: list[list[str | None]] = []
    async for batch, _ in answer.batches():
        for row in zip(*(column.to_pylist() for column in batch.columns), strict=True):
            rows.append([None if v is None else sql_text.text_of(v) for v in row])
    columns = [
        {**column, "numeric": column["type"].startswith(NUMERIC)}
        for column in sql_text.columns(answer.schema)
    ]
    return {
        "columns": columns,
        "rows": rows[:SHOWN_ROWS],
        "cut": len(rows) > SHOWN_ROWS,
        "tables": [sql_answers.table_json(t) for t in answer.tables],
    }
