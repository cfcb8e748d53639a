"""Operators' side of a map: what they ask of it (``<map>:__control__``), and a hold on it.

The request record (``Control``) is shared by the command line, the query service's
AdminService and the run that obeys it within one loop and reports in
``<map>:__status__`` (``materializer.contract.status``); ``MapControl`` is the command
line's side, on the same keys (``materializer.contract.redis_layout``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from materializer.clients.redis import Client
from materializer.contract.redis_layout import (
    control_key,
    generation_key,
    meta_key,
    parse_generation,
    physical_name,
    status_key,
    text_fields,
)
from materializer.contract.status import FOLDING, MapReport, effective_state
from materializer.contract.watermark import Watermark
from materializer.errors import MaterializerError

OBEY_TIMEOUT_SECONDS = 180.0
"""A pause waits for the batch in flight; a slow batch on a busy cluster may take minutes."""


class MapBusy(MaterializerError):
    """The map is running, or did not reach the state an operation needs in time."""


@dataclass(frozen=True)
class Control:
    """What operators ask of a map: ``desired`` state, and a restart when ``restart_id`` changes.

    The request is state, not a queue of commands: a materializer that starts
    later still finds a map paused, and two restarts asked at once are one.
    """

    desired: str = "running"
    restart_id: str = ""

    def to_hash(self) -> dict[str, str]:
        """The fields of ``<map>:__control__``."""
        return {"desired": self.desired, "restart_id": self.restart_id}

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> Control:
        """Parse ``HGETALL <map>:__control__``; no hash means run."""
        fields = text_fields(raw)
        desired = fields.get("desired", "running")
        return cls(
            desired=desired if desired in ("running", "paused") else "running",
            restart_id=fields.get("restart_id", ""),
        )


def control_fields(desired: str | None = None, restart: bool = False) -> dict[str, str]:
    """The ``<map>:__control__`` fields of one request (a restart gets a fresh id)."""
    fields: dict[str, str] = {}
    if desired is not None:
        fields["desired"] = desired
    if restart:
        fields["restart_id"] = uuid.uuid4().hex
    return fields


def now_ms() -> int:
    """UTC epoch milliseconds, as reports and watermarks carry them."""
    return int(time.time() * 1000)


class MapControl:
    """One map's control, status, generation and watermark on a synchronous Redis client."""

    def __init__(self, client: Client, map_name: str) -> None:
        self.client = client
        self.map_name = map_name

    def generation(self) -> int:
        """The generation readers use now."""
        return parse_generation(self.client.get(generation_key(self.map_name)))

    def physical(self) -> str:
        """Where the current generation's data lives."""
        return physical_name(self.map_name, self.generation())

    def report(self) -> MapReport | None:
        """The materializer's last report of the map."""
        return MapReport.from_hash(self.client.hgetall(status_key(self.map_name)))

    def _reported(self) -> str:
        report = self.report()
        return report.state if report is not None else "not_started"

    def state(self) -> str:
        """``not_started``, ``running``, ``catching_up``, ``paused``, ``failed`` or ``stopped``
        (gone silent), or another state the run reports (``effective_state``)."""
        return effective_state(self.report(), now_ms())

    def request(self) -> Control:
        """What operators last asked of the map."""
        return Control.from_hash(self.client.hgetall(control_key(self.map_name)))

    def ask(self, desired: str | None = None, restart: bool = False) -> None:
        """Write a request; a running materializer obeys within one loop."""
        fields: dict[Any, Any] = control_fields(desired, restart)
        self.client.hset(control_key(self.map_name), mapping=fields)

    def watermark(self, generation: int | None = None) -> Watermark | None:
        """The watermark of a generation's data (the current one by default)."""
        gen = self.generation() if generation is None else generation
        raw = self.client.hgetall(meta_key(physical_name(self.map_name, gen)))
        return Watermark.from_hash(raw)

    def wait_for(
        self,
        accept: Callable[[str], bool],
        what: str,
        timeout: float = OBEY_TIMEOUT_SECONDS,
    ) -> str:
        """Poll the state until ``accept`` takes it; ``MapBusy`` naming ``what`` on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            if accept(state):
                return state
            if time.monotonic() > deadline:
                raise MapBusy(
                    f"map {self.map_name!r} did not become {what} within {timeout:.0f} s "
                    f"(state: {state})"
                )
            time.sleep(0.2)

    @contextmanager
    def held(self, on_pause: Callable[[], None] | None = None) -> Iterator[bool]:
        """Keep the map from folding for the duration: paused if a materializer runs it.

        Yields whether a running map was paused. Afterwards the request in
        force before is restored, so a map that was running resumes from its
        checkpoint (nothing lost) and one that was paused stays paused. With no
        live materializer nothing is asked: the map is already still.
        """
        if self.state() not in FOLDING:
            yield False
            return
        before = self.request().desired
        self.ask("paused")
        try:
            if on_pause is not None:
                on_pause()
            # What the run itself wrote, not the age-based state: a run busy finishing a
            # long batch reports nothing meanwhile and would look stopped while it writes.
            self.wait_for(lambda _: self._reported() not in FOLDING, "paused")
            yield True
        finally:
            self.ask(before)

    def ensure_still(self) -> None:
        """Refuse while a live materializer runs the map (operations that edit its checkpoint)."""
        state = self.state()
        if state in FOLDING:
            raise MapBusy(
                f"map {self.map_name!r} is {state}: pause it (materializer pause "
                f"{self.map_name}) or stop the materializer first"
            )
