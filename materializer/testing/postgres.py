"""A throwaway PostgreSQL server for change-data-capture tests.

``with PostgresServer() as server: server.execute("CREATE TABLE ...")`` runs ``initdb``
into a temp folder and starts ``postgres`` on a free loopback port with
``wal_level=logical`` (Debezium's pgoutput capture needs it), password authentication
over TCP for its user, and no durability (fsync off): it is gone, folder and processes,
on exit. ``server.postgres`` (a ``Postgres``) says where it is; ``Postgres.from_url``
reaches a server started elsewhere.

The server's binaries come from ``PATH`` or Debian's ``/usr/lib/postgresql/<version>/bin``
(``apt-get install postgresql``). PostgreSQL refuses to run as root, so as root the
server and ``initdb`` run as the ``postgres`` system user that Debian's package creates,
through util-linux's ``setpriv``. SQL goes through ``psql`` (the client ships with the
server): the tests need no PostgreSQL driver.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from materializer.errors import MaterializerError, SetupError
from materializer.testing.ports import free_port
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import wait_until

SYSTEM_USER = "postgres"
"""Who runs the server when the tests run as root (Debian's package creates this user)."""

SETTINGS = (
    "wal_level=logical",
    "max_replication_slots=16",
    "max_wal_senders=16",
    # A test's data is thrown away with the server: no durability, so no waits for the disk.
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
)
"""The server's settings beside its address; ``PostgresServer(settings=...)`` adds more."""

INSTALL = "`apt-get install postgresql` (Debian), or put initdb and postgres on PATH"


class SQLError(MaterializerError):
    """``psql`` refused a statement; ``sql`` is what was sent, the message psql's."""

    def __init__(self, sql: str, message: str) -> None:
        self.sql = sql
        super().__init__(f"{message.strip()}\n-- in:\n{sql}")


def bin_dir() -> Path:
    """The folder holding ``initdb``, ``postgres`` and ``psql``: the one ``initdb`` on
    PATH comes from (its link followed), else Debian's newest version."""
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path is not None:
        candidates.append(Path(on_path).resolve().parent)

    def version(folder: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", folder.parent.name))

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for folder in candidates:
        if all((folder / exe).is_file() for exe in ("initdb", "postgres", "psql")):
            return folder
    raise SetupError(f"PostgreSQL's initdb, postgres and psql not found: {INSTALL}")


def psql() -> Path:
    """``psql``: the server's own where its binaries are, else the one on PATH."""
    try:
        return bin_dir() / "psql"
    except SetupError:
        pass
    found = shutil.which("psql")
    if found is None:
        raise SetupError("psql not found: `apt-get install postgresql-client`")
    return Path(found)


@dataclass(frozen=True)
class Postgres:
    """Where a PostgreSQL database is and who connects to it (a password over TCP)."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str

    @classmethod
    def from_url(cls, url: str) -> Postgres:
        """From a libpq URL, ``postgresql://user:password@host:port/database``."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
            raise ValueError(f"not a postgresql:// URL: {url!r}")
        return cls(
            host=parts.hostname,
            port=parts.port or 5432,
            user=urllib.parse.unquote(parts.username or "postgres"),
            password=urllib.parse.unquote(parts.password or ""),
            database=urllib.parse.unquote(parts.path.lstrip("/")) or "postgres",
        )

    @property
    def url(self) -> str:
        """The libpq URL of the database, password included."""
        quote = urllib.parse.quote
        return (
            f"postgresql://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
            f"@{self.host}:{self.port}/{quote(self.database, safe='')}"
        )

    def execute(self, sql: str, *, database: str | None = None, timeout: float = 60.0) -> str:
        """Run ``sql`` (one or more statements) with ``psql`` as ``user``; what it printed,
        unaligned and tuples only (``a|b`` per row). A failed statement stops the script
        and raises ``SQLError``."""
        done = subprocess.run(
            [
                str(psql()),
                "--no-psqlrc",
                "--quiet",
                "--no-align",
                "--tuples-only",
                "--set=ON_ERROR_STOP=1",
                f"--host={self.host}",
                f"--port={self.port}",
                f"--username={self.user}",
                f"--dbname={database or self.database}",
                "--file=-",
            ],
            input=sql,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PGPASSWORD": self.password, "PGCONNECT_TIMEOUT": "5"},
            check=False,
        )
        if done.returncode != 0:
            raise SQLError(sql, done.stderr or f"psql exited with {done.returncode}")
        return done.stdout


class PostgresServer:
    """One PostgreSQL server and its data folder, on 127.0.0.1 at a free port.

    ``postgres`` says how to reach its database: ``user`` is the bootstrap superuser
    (replication included) and owns ``database``; both take ``password`` over TCP. Unix
    sockets live in the server's folder.
    """

    def __init__(
        self,
        user: str = "materializer",
        password: str = "materializer",  # noqa: S107 - a throwaway test server's
        database: str = "materializer",
        settings: Sequence[str] = (),
    ) -> None:
        self.postgres = Postgres("127.0.0.1", free_port(), user, password, database)
        self._settings = [*SETTINGS, *settings]
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The libpq URL of the database (``postgresql://user:password@host:port/db``)."""
        return self.postgres.url

    def start(self, timeout: float = 60.0) -> Self:
        """initdb, start the server, create ``database``; wait until it answers SQL."""
        binaries = bin_dir()
        pg = self.postgres
        self._tmp = tempfile.TemporaryDirectory(prefix="materializer-postgres-")
        work = Path(self._tmp.name)
        try:
            as_user = self._as_server_user(work)
            data = work / "data"
            pwfile = work / "password"
            pwfile.write_text(pg.password + "\n")
            self._chown(pwfile)
            initdb = subprocess.run(
                [
                    *as_user,
                    str(binaries / "initdb"),
                    f"--pgdata={data}",
                    f"--username={pg.user}",
                    f"--pwfile={pwfile}",
                    "--auth-host=scram-sha-256",
                    "--auth-local=trust",
                    "--encoding=UTF8",
                    "--no-locale",
                    "--no-sync",
                    "--no-instructions",
                ],
                cwd=work,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if initdb.returncode != 0:
                raise SetupError(f"initdb failed:\n{initdb.stdout}{initdb.stderr}")
            pwfile.unlink()
            options = [f"listen_addresses={pg.host}", f"unix_socket_directories={work}"]
            args = [*as_user, str(binaries / "postgres"), "-D", str(data), "-p", str(pg.port)]
            for setting in [*options, *self._settings]:
                args += ["-c", setting]
            self._proc = ManagedProcess(args, work / "postgres.log")
            proc = self._proc
            wait_until(
                "PostgreSQL",
                lambda: self._answers(),
                timeout,
                proc.alive,
                retry_errors=True,
            )
            pg.execute(f'CREATE DATABASE "{pg.database}"', database="postgres")
        except Exception as exc:
            tail = self._proc.tail() if self._proc is not None else ""
            self.stop()
            if isinstance(exc, SetupError):
                raise
            raise SetupError(f"PostgreSQL did not start: {exc}\n{tail}") from None
        return self

    def _as_server_user(self, work: Path) -> list[str]:
        """The prefix that runs a program as the server's user, with SIGINT (a fast
        shutdown, which ends open replication connections too) when the test process dies;
        as root, ``SYSTEM_USER``, who is given ``work``."""
        setpriv = shutil.which("setpriv")
        if os.geteuid() != 0:
            return [setpriv, "--pdeathsig", "INT", "--"] if setpriv else []
        if setpriv is None:
            raise SetupError("running PostgreSQL as root needs util-linux's setpriv")
        try:
            pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            raise SetupError(
                f"PostgreSQL refuses to run as root and there is no {SYSTEM_USER!r} user: "
                f"{INSTALL} (Debian's package creates it), or run the tests as another user"
            ) from None
        self._chown(work)
        return [
            setpriv,
            f"--reuid={SYSTEM_USER}",
            f"--regid={SYSTEM_USER}",
            "--init-groups",
            "--pdeathsig",
            "INT",
            "--",
        ]

    @staticmethod
    def _chown(path: Path) -> None:
        if os.geteuid() == 0:
            shutil.chown(path, SYSTEM_USER, SYSTEM_USER)

    def _answers(self) -> bool:
        return self.postgres.execute("SELECT 1", database="postgres").strip() == "1"

    def execute(self, sql: str, *, database: str | None = None, timeout: float = 60.0) -> str:
        """``Postgres.execute`` on this server."""
        return self.postgres.execute(sql, database=database, timeout=timeout)

    def alive(self) -> bool:
        """Whether the server process is running."""
        return self._proc is not None and self._proc.alive()

    def stop(self) -> None:
        """A fast shutdown (SIGINT: sessions and replication connections are ended), then
        whatever is left killed, and the folder removed."""
        if self._proc is not None:
            proc = self._proc
            if proc.alive():
                proc.proc.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.proc.wait(20)
            proc.stop(timeout=5)
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
