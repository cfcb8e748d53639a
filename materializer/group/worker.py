"""A ``materializer run`` as a worker of a group: which maps it runs now.

``Worker.share`` answers, every loop of the run, which of the maps in force this
worker owns (their slots are in its assignment), which it lost, and gives a slot
to a map that has none yet. A group whose workers run on several hosts must keep
its checkpoints where all of them reach them (``check_hosts``).
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from pathlib import Path

from materializer.clients.redis import client_for
from materializer.config import AppConfig
from materializer.errors import ConfigError
from materializer.group.membership import Membership
from materializer.group.slots import Slots

log = logging.getLogger(__name__)

WORKERS_DIR = "_workers"
"""In a local checkpoint root: a file per worker that ever joined the group from it."""


@dataclass(frozen=True)
class Share:
    """This worker's maps now."""

    owned: frozenset[str]
    lost: frozenset[str]
    version: int


class Worker:
    """This run's membership of its group and the slots of the maps."""

    def __init__(self, config: AppConfig) -> None:
        worker = config.worker
        assert worker.group is not None
        self.id = worker.worker_id()
        self.group = worker.group
        self._config = config
        self.slots = Slots(config, client_for(config.redis))
        self.membership = Membership(config, self.id, self.slots.topic)
        self.membership.on_change = self._moved
        self._slot_of: dict[str, int] = {}
        self._checked = -1
        self._vetted = False
        self.acted = 0
        """The assignment version the run's maps were last brought to."""

    def start(self) -> None:
        """Make the slots topic ready and join the group."""
        self.slots.ensure_partitions(1)
        self._sign_in()
        self.membership.start()
        log.info("worker %s joining group %s", self.id, self.group)

    def share(self, names: list[str]) -> Share:
        """Which of ``names`` (the maps in force) this worker owns and lost; slots given to
        the maps without one, and freed for deleted maps whose slot this worker holds."""
        slots = self.slots.read()
        missing = [name for name in names if name not in slots]
        if missing:
            slots |= self.slots.give(missing)
        assignment = self.membership.assignment()
        for name, slot in slots.items():
            if name not in names and slot in assignment.owned:
                self.slots.free(name)
                log.info("worker group %s: slot %d of deleted map %s freed", self.group, slot, name)
        self._slot_of = {name: slots[name] for name in names}
        if assignment.version != self._checked:
            self._checked = assignment.version
            self.check_hosts()
        lost = self.membership.take_lost()
        return Share(
            owned=frozenset(n for n in names if self._slot_of[n] in assignment.owned),
            lost=frozenset(n for n in names if self._slot_of[n] in lost),
            version=assignment.version,
        )

    def owns(self, name: str) -> bool:
        """Whether the group gives this worker the map now."""
        slot = self._slot_of.get(name)
        return slot is not None and slot in self.membership.assignment().owned

    def fenced(self, name: str) -> None:
        """Another worker fenced this one out of the map: not taken again until reassigned."""
        slot = self._slot_of.get(name)
        if slot is not None:
            self.membership.fenced(slot)

    def release(self, version: int) -> None:
        """The run's maps match the assignment of ``version``."""
        self.membership.release(version)

    def check_hosts(self) -> None:
        """Refuse a group spread over hosts whose checkpoints are in a folder they do not share.

        A local checkpoint root is fine for workers on one host, and for workers on
        several when it is a volume they all mount (a ReadWriteMany claim): each worker
        leaves a file named after it in the root before it joins, so a worker sees
        whether the folder it holds is the one a member on another host wrote to.
        """
        root = self._local_root()
        if root is None:
            return
        try:
            members = self.membership.members()
        except Exception as exc:  # noqa: BLE001 - checked again at the next rebalance
            log.warning("worker group %s: cannot list its members yet: %s", self.group, exc)
            self._checked = -1
            return
        here = {host for worker_id, host, _ in members if worker_id == self.id}
        elsewhere = [(w, h) for w, h, _ in members if here and h not in here]
        unseen = [(w, h) for w, h in elsewhere if not (root / WORKERS_DIR / w).exists()]
        vetted, self._vetted = self._vetted, True
        if unseen:
            who = ", ".join(f"{w} on {h}" for w, h in unseen)
            error = ConfigError(
                "",
                [
                    f"spark.checkpoint_root: {self._config.spark.checkpoint_root} is a local "
                    f"folder that workers of group {self.group} on other hosts ({who}) do not "
                    "share: a map taken over on another host would not find its checkpoints. "
                    "Put them in the object store (s3a://...) or on a volume every worker "
                    "mounts (a ReadWriteMany claim)"
                ],
            )
            if not vetted:  # this worker joined so: it stops before it runs anything
                raise error
            # A worker that joined later is the one at fault: it refuses itself.
            log.error("worker group %s: %s", self.group, "; ".join(error.problems))

    def _local_root(self) -> Path | None:
        """The checkpoint root when it is a local folder (None: an object store's)."""
        root = self._config.spark.checkpoint_root
        if root.startswith("file:"):
            return Path(root.removeprefix("file:").removeprefix("//"))
        return None if "://" in root else Path(root)

    def _sign_in(self) -> None:
        """Leave this worker's file in a local checkpoint root (``check_hosts``)."""
        root = self._local_root()
        if root is not None:
            (root / WORKERS_DIR).mkdir(parents=True, exist_ok=True)
            (root / WORKERS_DIR / self.id).write_text(socket.gethostname())

    def close(self) -> None:
        """Leave the group (after the run's maps drained)."""
        self.membership.close()
        log.info("worker %s left group %s", self.id, self.group)

    def _moved(self, why: str, slots: frozenset[int]) -> None:
        names = sorted(n for n, s in self._slot_of.items() if s in slots)
        unnamed = sorted(slots - {self._slot_of[n] for n in names})
        what = ", ".join(names + [f"slot {s}" for s in unnamed])
        reason = {
            "assigned": "assigned to this worker (a worker joined or left the group)",
            "revoked": "moving to another worker (a worker joined, or this one is leaving)",
            "lost": "lost: this worker was out of the group past its session; others run them",
        }[why]
        log.info("worker group %s rebalanced: %s %s", self.group, what, reason)
