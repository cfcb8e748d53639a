"""A test server run from one of the resolved jars, with a temp folder of its own.

Subclasses say how to start (``start``, through ``_launch``) and what "ready" means;
the base owns the process and the folder, and removes both however the test ends.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from materializer.errors import SetupError
from materializer.testing.process import ManagedProcess


class JavaServer:
    """One JVM process and its temp folder (``workdir``)."""

    name = "server"

    def __init__(self, heap: str = "256m") -> None:
        self._heap = heap
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: ManagedProcess | None = None

    @property
    def workdir(self) -> Path:
        """The server's temp folder, made on first use and removed by ``stop``."""
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"materializer-{self.name}-")
        return Path(self._tmp.name)

    def _launch(self, *args: str) -> ManagedProcess:
        """Start ``java -Xmx<heap> <args>``, its output in the temp folder."""
        java = shutil.which("java")
        if java is None:
            raise SetupError(f"java not found: Java 17 or newer runs the {self.name}")
        self._proc = ManagedProcess(
            [java, f"-Xmx{self._heap}", *args], self.workdir / f"{self.name}.log"
        )
        return self._proc

    def start(self) -> Self:
        """Start the server and wait until it is ready."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the process and remove the folder."""
        if self._proc is not None:
            self._proc.stop(timeout=20)
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def started(self) -> Self:
        """``start``; a server that does not come up is stopped and reported as a
        ``SetupError`` carrying the end of its log (which goes with its folder)."""
        try:
            return self.start()
        except Exception:
            tail = self._proc.tail() if self._proc is not None else ""
            self.stop()
            raise SetupError(f"the {self.name} did not start:\n{tail}") from None

    def __enter__(self) -> Self:
        return self.started()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
