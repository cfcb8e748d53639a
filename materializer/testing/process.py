"""A child process that is always stopped, whatever happens to its parent's body."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

GRACE_SECONDS = 120.0
"""What the chart gives a pod between SIGTERM and SIGKILL (terminationGracePeriodSeconds):
a run under load may need most of it to finish the batches it has in flight."""


def _dies_with_parent(args: list[str]) -> list[str]:
    """``args`` run so that Linux sends the process SIGTERM when its parent dies, however
    it dies: through util-linux's ``setpriv --pdeathsig``, which sets it and execs them.

    Not ``prctl`` from a ``preexec_fn``: that runs Python in the forked child
    of a parent with other threads, and a child forked while gRPC's threads
    ran in a test process crashed there before its program started.
    """
    setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
    return args if setpriv is None else [setpriv, "--pdeathsig", "TERM", "--", *args]


class ManagedProcess:
    """A process in its own session, so stopping it stops everything it started.

    On Linux it also gets SIGTERM when its parent dies, however it dies
    (SIGKILL included): a killed demo or test run leaves no broker or
    ``redis-server`` behind.
    """

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            _dies_with_parent(args),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc.poll() is None

    def stop(self, timeout: float = GRACE_SECONDS) -> None:
        """SIGTERM the process itself, as an orchestrator would; SIGKILL the group after.

        Only the leader gets SIGTERM so that it can shut its children down in
        order (``materializer run`` finishes its batch before its JVM goes);
        whatever is left of the group after ``timeout`` is killed.
        """
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            self._signal(signal.SIGCONT)  # a paused process takes SIGTERM once it runs again
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait()
        self._signal(signal.SIGKILL)  # children the leader left behind
        self._log.close()

    def kill(self) -> None:
        """SIGKILL the process group at once: a crash, as tests need one."""
        self._signal(signal.SIGKILL)
        self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP the process group: it keeps its sockets open and answers nothing, as a
        machine that hangs (a long GC pause, a frozen VM) would, until ``resume``."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the process group after ``pause``."""
        self._signal(signal.SIGCONT)

    def log(self) -> str:
        """The process's whole log so far (empty before it writes one)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        """The end of the process's log, for error messages."""
        return "\n".join(self.log().splitlines()[-lines:])

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
