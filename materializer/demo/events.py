"""The demo's event stream: users sign up, change a field or two, place orders, and leave.

The stream is a pure function of ``(seed, start_us, rate)``: event ``i`` happens
at ``start_us + i / rate`` seconds and everything else comes from one seeded
``random.Random``. A test replays it in-process and folds it with the
reference folds to know exactly what the maps must hold after ``n`` events,
and a producer that keeps to the schedule stamps events with (about) the time
it sends them.

Every event is keyed by its user's id, so a user's events keep their order in
one partition and a tombstone (``value is None``) deletes the user. Times are
ISO 8601 UTC with microseconds, the form the materializer writes timestamps
in, so a folded entity shows the very strings that were produced.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from materializer.demo.domain import ORDERS, USER_EVENTS

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

FIRST_NAMES = [
    "Ada",
    "Alan",
    "Amara",
    "Ana",
    "Bea",
    "Carlos",
    "Chen",
    "Dara",
    "Elif",
    "Emma",
    "Farah",
    "Grace",
    "Hana",
    "Ines",
    "Ivan",
    "Jon",
    "Kai",
    "Lea",
    "Lina",
    "Luca",
    "Maya",
    "Mei",
    "Nils",
    "Noor",
    "Omar",
    "Priya",
    "Raj",
    "Rosa",
    "Sami",
    "Sofia",
    "Tom",
    "Yara",
    "Yusuf",
    "Zoe",
]
LAST_NAMES = [
    "Abara",
    "Berg",
    "Costa",
    "Dubois",
    "Eriksen",
    "Fischer",
    "Garcia",
    "Haddad",
    "Ito",
    "Jansen",
    "Kowalski",
    "Larsen",
    "Moreau",
    "Nakamura",
    "Novak",
    "Okafor",
    "Patel",
    "Quinn",
    "Rossi",
    "Silva",
    "Tanaka",
    "Urban",
    "Varga",
    "Weber",
    "Yilmaz",
    "Zhang",
]
EMAIL_DOMAINS = ("example.com", "mail.example.org", "post.example.net", "inbox.example.io")
COUNTRIES = ("DE", "US", "FR", "GB", "NL", "ES", "IT", "SE", "PL", "BR", "IN", "JP")
COUNTRY_WEIGHTS = (16, 20, 10, 10, 6, 7, 6, 4, 5, 6, 6, 4)
PLANS = ("free", "pro", "business")
PLAN_WEIGHTS = (60, 30, 10)
ORDER_STATUSES = ("completed", "pending", "cancelled", "refunded")
STATUS_WEIGHTS = (78, 12, 7, 3)
PLAN_SPEND = {"free": 3.3, "pro": 3.9, "business": 4.6}
"""``mu`` of a user's lognormal order amount: business accounts buy more."""

MIN_USERS = 20
"""Below this many users the stream signs up new ones, so orders have someone to belong to."""


@dataclass(frozen=True)
class DemoEvent:
    """One record to produce: its topic, its user (the Kafka key) and its value."""

    topic: str
    user_id: str
    value: dict[str, Any] | None
    """``None`` is a tombstone: the user is deleted."""

    @property
    def key(self) -> bytes:
        """The Kafka key: the user id."""
        return self.user_id.encode()

    def encoded(self) -> bytes | None:
        """The Kafka value: compact JSON, or ``None`` for a tombstone."""
        return None if self.value is None else orjson.dumps(self.value)


def iso_time(epoch_us: int) -> str:
    """``2025-06-01T12:00:00.000000Z``: how the materializer writes a UTC timestamp."""
    return (_EPOCH + timedelta(microseconds=epoch_us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventGenerator(Iterator[DemoEvent]):
    """An endless, seeded stream of user-events and orders, on a schedule of ``rate`` per second.

    About 8% of events sign a user up (with a full profile), 58% are orders by
    a random current user, 32% change one profile field, and 1.5% delete a
    user with a tombstone; a deleted user never comes back.
    """

    def __init__(self, seed: int, start_us: int, rate: float) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self._rng = random.Random(seed)  # noqa: S311 - a replayable sample, not a secret
        self._start_us = start_us
        self._rate = rate
        self._index = 0
        self._users: list[str] = []
        self._profiles: dict[str, dict[str, Any]] = {}
        self._next_user = 1
        self._next_order = 1

    def __next__(self) -> DemoEvent:
        at = iso_time(self._start_us + round(self._index * 1_000_000 / self._rate))
        self._index += 1
        r = self._rng.random()
        if len(self._users) < MIN_USERS or r < 0.08:
            return self._signup(at)
        if r < 0.66:
            return self._order(at)
        if r < 0.985:
            return self._update(at)
        return self._delete()

    def _pick_user(self) -> str:
        return self._users[self._rng.randrange(len(self._users))]

    def _email(self, name: str, number: int) -> str:
        first, last = name.lower().split()
        return f"{first}.{last}{number}@{self._rng.choice(EMAIL_DOMAINS)}"

    def _signup(self, at: str) -> DemoEvent:
        number = self._next_user
        self._next_user += 1
        user_id = f"u-{number:05d}"
        name = f"{self._rng.choice(FIRST_NAMES)} {self._rng.choice(LAST_NAMES)}"
        profile = {
            "id": user_id,
            "name": name,
            "email": self._email(name, number),
            "country": self._rng.choices(COUNTRIES, COUNTRY_WEIGHTS)[0],
            "plan": self._rng.choices(PLANS, PLAN_WEIGHTS)[0],
            "signed_up_at": at,
            "updated_at": at,
        }
        self._users.append(user_id)
        self._profiles[user_id] = profile
        return DemoEvent(USER_EVENTS, user_id, dict(profile))

    def _order(self, at: str) -> DemoEvent:
        user_id = self._pick_user()
        mu = PLAN_SPEND[self._profiles[user_id]["plan"]]
        amount = round(min(max(self._rng.lognormvariate(mu, 0.7), 1.0), 5000.0), 2)
        order = {
            "order_id": f"o-{self._next_order:07d}",
            "user_id": user_id,
            "amount": amount,
            "status": self._rng.choices(ORDER_STATUSES, STATUS_WEIGHTS)[0],
            "ordered_at": at,
        }
        self._next_order += 1
        return DemoEvent(ORDERS, user_id, order)

    def _update(self, at: str) -> DemoEvent:
        user_id = self._pick_user()
        profile = self._profiles[user_id]
        change: dict[str, Any]
        kind = self._rng.choices(("plan", "email", "country", "name"), (40, 25, 20, 15))[0]
        if kind == "plan":
            change = {"plan": self._rng.choice([p for p in PLANS if p != profile["plan"]])}
        elif kind == "email":
            change = {"email": self._email(profile["name"], int(user_id[2:]))}
        elif kind == "country":
            change = {"country": self._rng.choices(COUNTRIES, COUNTRY_WEIGHTS)[0]}
        else:
            first = profile["name"].split()[0]
            change = {"name": f"{first} {self._rng.choice(LAST_NAMES)}"}
        change["updated_at"] = at
        profile.update(change)
        return DemoEvent(USER_EVENTS, user_id, {"id": user_id, **change})

    def _delete(self) -> DemoEvent:
        index = self._rng.randrange(len(self._users))
        user_id = self._users[index]
        self._users[index] = self._users[-1]
        self._users.pop()
        del self._profiles[user_id]
        return DemoEvent(USER_EVENTS, user_id, None)
