"""Containers of the project's image, run with podman as the image tests start them.

Each runs on the host network (the tests' broker and Redis listen on the loopback) with
the project's own containers.conf, and is removed, running or not, when the test ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = ROOT / "image" / "containers.conf"
PODMAN_SECONDS = 120.0
"""How long a podman command other than ``wait`` may take."""


class Podman:
    """Containers of one image; ``close`` removes every one started here."""

    def __init__(self, image: str) -> None:
        self.image = image
        self._env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
        self._started: list[Container] = []

    def podman(
        self, *args: str, timeout: float = PODMAN_SECONDS
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args], env=self._env, capture_output=True, text=True, timeout=timeout
        )

    def _run_args(
        self, command: Iterable[str], volumes: Iterable[Path], env: Mapping[str, str]
    ) -> list[str]:
        args = ["--net=host"]
        for path in volumes:  # mounted at the same path, so configs name the same files
            args += ["--volume", f"{path}:{path}"]
        for name, value in env.items():
            args += ["--env", f"{name}={value}"]
        return [*args, self.image, *command]

    def run_once(
        self, command: Iterable[str], volumes: Iterable[Path] = (), env: Mapping[str, str] = {}
    ) -> subprocess.CompletedProcess[str]:
        """A container that runs ``command`` to its end; its output and exit code."""
        return self.podman("run", "--rm", *self._run_args(command, volumes, env))

    def start(
        self, command: Iterable[str], volumes: Iterable[Path] = (), env: Mapping[str, str] = {}
    ) -> Container:
        """A container running ``command`` in the background."""
        name = f"materializer-test-{uuid.uuid4().hex[:10]}"
        done = self.podman(
            "run", "--detach", "--name", name, *self._run_args(command, volumes, env)
        )
        if done.returncode != 0:
            raise RuntimeError(f"podman run failed: {done.stderr.strip()}")
        self._started.append(Container(self, name))
        return self._started[-1]

    def close(self) -> None:
        for container in self._started:
            self.podman("rm", "--force", "--time", "0", container.name)


class Container:
    """One started container, by name."""

    def __init__(self, podman: Podman, name: str) -> None:
        self._podman, self.name = podman, name

    def logs(self) -> str:
        done = self._podman.podman("logs", self.name)
        return done.stdout + done.stderr

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.logs().splitlines()[-lines:])

    def running(self) -> bool:
        done = self._podman.podman("inspect", "--format", "{{.State.Running}}", self.name)
        return done.stdout.strip() == "true"

    def signal(self, sig: signal.Signals) -> None:
        """``sig`` to the container's first process, as Kubernetes and ``podman stop`` send it."""
        done = self._podman.podman("kill", "--signal", sig.name, self.name)
        if done.returncode != 0:
            raise RuntimeError(f"podman kill failed: {done.stderr.strip()}")

    def wait(self, timeout: float) -> int:
        """The container's exit code once it has ended."""
        done = self._podman.podman("wait", self.name, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"podman wait failed: {done.stderr.strip()}")
        return int(done.stdout.strip())
