"""Console logins: a cookie for the browser, the session behind it in Redis.

A bearer token is typed once into the login form; the browser then holds only a
random session id in an HttpOnly, SameSite=Strict cookie, and Redis holds the
session under the id's digest (``console_session_key``): the token's digest, its
name and the session's CSRF token, expiring with the session. Kept in Redis, a
session is known to every replica behind a load balancer and survives a restart;
removing its token from the tokens document ends it at the next page.

Without ``query.auth`` the console is as open as the API, but a browser still
gets a session: its CSRF token is what keeps another site's form from acting
through an operator's browser.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from aiohttp import web

from materializer.clients.redis import AsyncClient
from materializer.contract.redis_layout import console_session_key, text_fields
from query_service.auth import Authorizer, Grant

COOKIE = "materializer_session"
ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Session:
    """Who is logged in: the token's name and grant (None: auth is off) and the form token."""

    name: str
    grant: Grant | None
    csrf: str

    def may(self, verb: str) -> bool:
        """Whether the session's token may do this kind of call: buttons follow it."""
        return self.grant is None or self.grant.allows_verb(verb)

    def csrf_matches(self, sent: str | None) -> bool:
        """The form or header token of a state-changing request is this session's."""
        if not self.csrf or sent is None:
            return False  # a session that was never stored accepts no form
        return hmac.compare_digest(sent.encode(), self.csrf.encode())


SESSION = web.RequestKey("session", Session)
"""Where the middleware puts the request's session for the pages."""


def _key(cookie: str) -> str:
    return console_session_key(hashlib.sha256(cookie.encode()).hexdigest())


class Sessions:
    """Creates, finds and ends console sessions."""

    def __init__(
        self, client: AsyncClient, authorizer: Authorizer | None, lifetime: timedelta
    ) -> None:
        self._client = client
        self._authorizer = authorizer
        self.lifetime = lifetime

    @property
    def open(self) -> bool:
        """No tokens configured: every browser gets a session without logging in."""
        return self._authorizer is None

    async def login(self, token: str) -> tuple[str, Session]:
        """A session for a token (``Unauthenticated`` if it is unknown): the cookie and it."""
        if self._authorizer is None:
            return await self._create("", ANONYMOUS, None)
        digest, grant = self._authorizer.login(token)
        return await self._create(digest, grant.name, grant)

    async def anonymous(self) -> tuple[str, Session]:
        """A session of an open console, kept for the pages that post forms."""
        return await self._create("", ANONYMOUS, None)

    @staticmethod
    def passing() -> Session:
        """An open console's caller without a session asking for data, not a page (a script,
        a probe): nothing is stored for it, and it can post nothing."""
        return Session(name=ANONYMOUS, grant=None, csrf="")

    async def _create(self, digest: str, name: str, grant: Grant | None) -> tuple[str, Session]:
        cookie = secrets.token_urlsafe(32)
        session = Session(name=name, grant=grant, csrf=secrets.token_urlsafe(24))
        key = _key(cookie)
        pipe = self._client.pipeline(transaction=False)
        pipe.hset(key, mapping={"grant": digest, "name": name, "csrf": session.csrf})
        pipe.pexpire(key, int(self.lifetime.total_seconds() * 1000))
        await pipe.execute()
        return cookie, session

    async def find(self, cookie: str | None) -> Session | None:
        """The live session of a cookie; None when it expired, ended or its token went."""
        if not cookie:
            return None
        raw = await self._client.hgetall(_key(cookie))
        if not raw:
            return None
        fields = text_fields(raw)
        digest = fields.get("grant", "")
        if self._authorizer is None:
            grant = None
        else:
            grant = self._authorizer.grant_of(digest) if digest else None
            if grant is None:  # auth turned on since, or the token was removed
                return None
        return Session(name=fields.get("name", ""), grant=grant, csrf=fields.get("csrf", ""))

    async def end(self, cookie: str | None) -> None:
        """Log out: the session is gone for every replica."""
        if cookie:
            await self._client.delete(_key(cookie))
