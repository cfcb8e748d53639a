"""The console's OpenAPI document: every route its application serves, what each takes and
what it may answer.

The console is for browsers, not programs, and has a document of its own beside the
API's: its answers are HTML pages (and one JSON series for the charts, and a change
stream), its requests carry the login session's cookie and, when they post, the
session's CSRF token; the API's carry a bearer token. The routes are those
``Console.application`` declares and ``mount_console`` adds, under the base path; a test
compares this table with the routes the running console serves and fuzzes each
operation from the document, as the API is held to its own.

A page shows a refused call as an error page with the call's HTTP status (the API's
mapping), a form's problems as the form again with 400; a page asked for without a
session goes to the login form (303), a fragment or a post without one is a 401.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from materializer import __version__
from materializer.config import MAP_NAME
from query_service.console.app import CSRF_FIELD, CSRF_HEADER
from query_service.console.map_page import ACTIONS, OPERATIONS
from query_service.console.sessions import COOKIE
from query_service.http.endpoints import JSON, MAP, SSE, Param
from query_service.http.openapi import change_events, parameters
from query_service.http.shapes import SQL_QUERY

HTML = "text/html"
FORM = "application/x-www-form-urlencoded"
TEXT = "text/plain"
OCTETS = "application/octet-stream"


@dataclass(frozen=True)
class Route:
    """One route of the console, described for OpenAPI."""

    method: str
    path: str
    """Below the base path; empty for the base path itself."""
    name: str
    """The OpenAPI operation id."""
    summary: str
    params: tuple[Param, ...] = ()
    form: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The form's fields (each a string on the wire) and their schemas; none: no body."""
    required: tuple[str, ...] = ()
    """The form's fields the route cannot do without."""
    answers: dict[int, str] = field(default_factory=lambda: {200: HTML})
    """The media type of each status it answers with besides the errors every page may
    give: what was asked, done (``ANSWERS`` says what each status means)."""
    session: bool = True
    """Whether it needs the login session (and, as a post, its CSRF token)."""


def _query(name: str, description: str) -> Param:
    """A query parameter the page takes as any text (what it cannot use, it ignores or shows
    as the call's error on the page)."""
    return Param(name, "query", description)


KEY = _query("key", "keys to show, comma-separated (none: every change)")
ACTION = Param(
    "action",
    "path",
    "the button: a control call, an operation the run carries out, or deletion",
    {"type": "string", "enum": [*ACTIONS, *OPERATIONS, "delete"]},
    required=True,
)
SECTION = {
    "type": "string",
    "description": "the map's section of the configuration, in YAML (at most 64 KiB, no "
    "aliases); its problems are shown next to the field, with 400",
}
STATEMENT = {
    "type": "string",
    "pattern": SQL_QUERY,
    "description": "one SELECT or WITH statement, as POST /v1/sql takes it; a refusal is "
    "shown next to the editor with the API's status for it",
}
CHECKED = {
    "type": "string",
    "description": "any value: on (a checkbox); absent: off",
}
SAVED = {303: TEXT, 400: HTML}
"""A form that stores something: to the page of what it stored, or the form again."""

ROUTES: tuple[Route, ...] = (
    Route("GET", "", "to_console", "To the console's front page", answers={308: TEXT},
          session=False),
    Route("GET", "/", "overview", "Every map the token may see, its state, lag and freshness; "
          "the enrichments and the workers"),
    Route("GET", "/fragments/overview", "overview_rows",
          "The overview's table alone, for htmx to swap in every few seconds"),
    Route("GET", "/login", "login_form", "The form a token is typed into",
          (_query("next", "the console's page to go to after logging in"),),
          answers={200: HTML, 303: TEXT}, session=False),
    Route("POST", "/login", "login",
          "Log in with a bearer token: a session cookie, and on to the page asked for",
          form={"token": {"type": "string", "description": "a bearer token of query.auth"},
                "next": {"type": "string",
                         "description": "the console's page to go to; another is ignored"}},
          answers={303: TEXT, 401: HTML, 403: HTML}, session=False),
    Route("POST", "/logout", "logout", "End the session everywhere and forget the cookie",
          answers={303: TEXT}),
    Route("GET", "/new-map", "new_map_form", "The form that creates a map"),
    Route("POST", "/new-map", "new_map",
          "Create a map (CreateMap): to its page, or the form again with its problems",
          form={"name": {"type": "string", "pattern": MAP_NAME.pattern,
                         "description": "the map's name"},
                "config": SECTION},
          required=("name", "config"), answers=SAVED),
    Route("GET", "/maps/{map}", "map_page",
          "A map: its summary, charts, dead letters, definition, Delta table and buttons",
          (MAP, _query("done", "what was just done, said on the page (one of the buttons, "
                               "or saved; anything else is not echoed)"))),
    Route("GET", "/maps/{map}/summary", "map_summary",
          "The map's summary alone, for htmx to swap in every few seconds", (MAP,)),
    Route("GET", "/maps/{map}/history.json", "map_history",
          "The map's chart series: sample times and each figure's values",
          (MAP, _query("since", "epoch milliseconds; anything else, or none: an hour ago")),
          answers={200: JSON}),
    Route("GET", "/maps/{map}/entities", "entities",
          "The entity browser: Get, BatchGet, a filtered Query with paging, an as-of read, "
          "each beside the curl and grpcurl commands that ask the same",
          (MAP,
           _query("op", "get, batch, query or asof; anything else: the form alone"),
           _query("key", "the key, for get and asof"),
           _query("keys", "keys separated by commas or lines, for batch"),
           _query("where", "a SQL filter, for query"),
           _query("page_size", "rows per page, for query (1 to 500; else 50)"),
           _query("page_token", "the next page's token, for query"),
           _query("as_of", "a Delta version or an RFC 3339 time, for asof"))),
    Route("GET", "/maps/{map}/changes", "changes_page",
          "The page that shows the map's changes as they happen", (MAP, KEY)),
    Route("GET", "/maps/{map}/changes/stream", "changes_stream",
          "The map's changes as Server-Sent Events, from now (the API's change stream)",
          (MAP, KEY), answers={200: SSE}),
    Route("GET", "/maps/{map}/edit", "edit_map_form", "The form that edits a map", (MAP,)),
    Route("POST", "/maps/{map}/edit", "edit_map",
          "Change a map (PutMapConfig): to its page, or the form again with its problems",
          (MAP,),
          form={"config": SECTION,
                "rebuild": {**CHECKED, "description": "let a change its state cannot "
                            "follow through (any value: on)"}},
          required=("config",), answers=SAVED),
    Route("POST", "/maps/{map}/actions/{action}", "map_action",
          "One of the map page's buttons: to the map's page (the front page after deletion)",
          (MAP, ACTION),
          form={"confirm": {"type": "string", "description": "the map's name, typed: "
                            "rehydrate, rebuild and delete need it (400 otherwise)"},
                "purge": {**CHECKED, "description": "with delete: remove its data too "
                          "(any value: on)"}},
          answers={303: TEXT}),
    Route("GET", "/sql", "sql_form", "The SQL editor"),
    Route("POST", "/sql", "run_sql",
          "Run a statement: its rows (the first 1000), the tables read with their versions, "
          "and the commands that ask the same",
          form={"sql": STATEMENT,
                "params": {"type": "string", "description": "the values of $1, $2, ..., one "
                           "per line: JSON numbers, true, false, null or JSON strings; other "
                           "text as it is"}},
          required=("sql",)),
    Route("GET", "/static/{filename}", "static", "The console's scripts, styles and icon",
          (Param("filename", "path", "a file of the console's static directory",
                 required=True),),
          answers={200: "*/*", 403: HTML, 404: OCTETS}, session=False),
)  # fmt: skip
"""The console's routes, as ``Console.application`` declares them (and the redirect of the
bare base path that ``mount_console`` adds)."""

ERRORS = {
    400: "the form or the address asked for something the call refused: the page says what",
    401: "no session, or one that ended: the login form (a fragment or a post: log in again)",
    403: "the token may not use this map or verb, or a post without the session's CSRF "
    "token, or from another site",
    404: "no such map, button or page",
    409: "the map exists already, or cannot take the operation now",
    413: "more than the service takes at once",
    503: "Redis does not answer, or the map is being restored: retry",
    504: "the call's deadline passed",
}
"""What a page with a session may answer besides its own answers, each an error page."""


ANSWERS = {
    200: "the page, the data or the file asked for",
    303: "done: to the page that shows it (the login form, after logging out)",
    308: "the front page, at the base path with its slash",
    400: "the form again, with its problems next to the fields",
    401: "an unknown token: the login form again, saying so",
    403: "refused: a login posted from another site, or a directory asked for as a file",
    404: "no such file (an empty body)",
}
"""What each status of a route's own answers means."""


def console_document(base: str) -> dict[str, Any]:
    """The document of the console served at ``base`` (``query.console.base_path``)."""
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for route in ROUTES:
        paths.setdefault(base + route.path, {})[route.method.lower()] = _operation(route, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Materializer console",
            "version": __version__,
            "description": "The web console's pages, fragments and forms on the query "
            "service's HTTP port, for browsers: a login session's cookie, and its CSRF "
            "token on every post.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "session": {"type": "apiKey", "in": "cookie", "name": COOKIE},
                "csrf": {"type": "apiKey", "in": "header", "name": CSRF_HEADER},
            },
        },
    }


def _operation(route: Route, schemas: dict[str, Any]) -> dict[str, Any]:
    responses: dict[str, Any] = {
        str(status): {"description": ANSWERS[status], "content": _content(media, schemas)}
        for status, media in route.answers.items()
    }
    if route.session:
        for status, text in ERRORS.items():
            media = {HTML: {"schema": {"type": "string"}}}
            if status == 401:
                media[TEXT] = {"schema": {"type": "string"}}
            responses.setdefault(str(status), {"description": text, "content": media})
        if route.method == "GET" and 303 not in route.answers:
            responses["303"] = {"description": "no session: to the login form"}
    operation: dict[str, Any] = {
        "operationId": route.name,
        "summary": route.summary,
        "parameters": parameters(route.params),
        "responses": responses,
        "security": [{"session": [], "csrf": []} if route.method == "POST" else {"session": []}]
        if route.session
        else [],
    }
    form = dict(route.form)
    if route.session and route.method == "POST":
        form[CSRF_FIELD] = {
            "type": "string",
            "description": f"the session's CSRF token, when the {CSRF_HEADER} header does "
            "not carry it (as the pages' forms send it)",
        }
    if form:
        # Other fields are ignored, as a form's are: no additionalProperties: false.
        body: dict[str, Any] = {"type": "object", "properties": form}
        if route.required:
            body["required"] = list(route.required)
        operation["requestBody"] = {
            "required": bool(route.required),
            "content": {FORM: {"schema": body}},
        }
    return operation


def _content(media: str, schemas: dict[str, Any]) -> dict[str, Any]:
    if media == SSE:
        return {SSE: {"schema": change_events(schemas)}}
    return {media: {"schema": {"type": "object"} if media == JSON else {"type": "string"}}}
