"""How a ``materializer run`` shares the maps with others: its worker group."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator, model_validator

from materializer.config.base import MAP_NAME, _Model
from materializer.config.durations import Duration, PositiveDuration


def _session_bounds(value: timedelta) -> timedelta:
    """Kafka brokers accept sessions between 6 s and 30 min unless their operators change
    ``group.min/max.session.timeout.ms``."""
    if not timedelta(seconds=6) <= value <= timedelta(minutes=30):
        raise ValueError("must be between 6 s and 30 minutes (the brokers' default bounds)")
    return value


class WorkerConfig(_Model):
    """A worker group: runs that share the maps, as Kafka Connect's distributed workers do.

    Runs with the same ``worker.group`` (or ``materializer run --group``) split the
    maps between them through Kafka's consumer-group protocol: each map is one
    partition (a *work slot*) of the group's topic, a worker runs the maps of the
    slots it is assigned, and a worker that leaves or is lost has its maps taken
    over by the others (docs/worker-group.md).
    """

    group: str | None = None
    """The group's name, also its Kafka ``group.id``; None: this run runs every map alone."""
    id: str | None = None
    """This worker's name in statuses, logs and metrics (Kafka Connect's ``worker_id``);
    None: ``<host>-<pid>``. It must be unique within the group."""
    session_timeout: Annotated[Duration, AfterValidator(_session_bounds)] = timedelta(seconds=6)
    """How long a worker that stopped answering keeps its maps before the others take them
    over: Kafka's ``session.timeout.ms``, within the brokers' default bounds."""
    heartbeat_interval: PositiveDuration = timedelta(seconds=1)
    """How often a worker tells the group it is alive, and hears of a rebalance."""
    topic: str | None = None
    """The topic whose partitions are the group's work slots; None: ``<group>.slots``.
    Created on first use, it holds no records; its partitions grow with the maps."""
    replication_factor: Annotated[int, Field(ge=-1, le=32767)] = -1
    """Of the slots topic when it is created; -1 takes the broker's default."""

    @field_validator("group", "id")
    @classmethod
    def _group_name(cls, group: str | None) -> str | None:
        if group is not None and not MAP_NAME.match(group):
            raise ValueError(
                "letters, digits, '_', '.' and '-' only, starting with a letter or digit"
            )
        return group

    @model_validator(mode="after")
    def _heartbeat_within_session(self) -> WorkerConfig:
        if self.heartbeat_interval >= self.session_timeout:
            raise ValueError(
                "worker.heartbeat_interval must be shorter than worker.session_timeout "
                "(a third of it or less, as Kafka advises)"
            )
        return self

    def worker_id(self) -> str:
        """This worker's name: ``id``, or ``<host>-<pid>``."""
        return self.id or f"{socket.gethostname()}-{os.getpid()}"

    def slots_topic(self) -> str:
        """The group's slots topic."""
        assert self.group is not None
        return self.topic or f"{self.group}.slots"
