"""Process logging for both commands: text for a terminal, one JSON object per line for
log collectors.

A JSON line carries the record's structured fields as keys of their own (a batch's
``query``, ``batch``, ``rows_in``, ...: whatever the caller passed as ``extra``), so a
collector filters and charts them without parsing the message. Spark's JVM logs through
log4j, not Python: in JSON mode its driver gets a log4j2 configuration whose pattern
writes the same keys, so the two streams never interleave plain text with JSON.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
from enum import StrEnum
from types import TracebackType
from typing import TextIO

import orjson


class LogFormat(StrEnum):
    """JSON for log collectors, text for a terminal."""

    JSON = "json"
    TEXT = "text"


class LogLevel(StrEnum):
    """Levels offered on the command line."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


# What every LogRecord has; anything else on a record came in through ``extra``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

_format = LogFormat.TEXT


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the record's own fields
    and the exception, if any."""

    def __init__(self) -> None:
        super().__init__()
        self.converter = time.gmtime

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON; fields that are not JSON become their text."""
        entry: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: str, log_format: LogFormat, *, own_stderr: bool = False) -> None:
    """Root logging for the process, in UTC; Spark sessions built later follow the format.

    ``own_stderr`` (JSON only, for a command's whole process) also turns whatever else
    writes to file descriptor 2 into JSON lines: the JVM's launcher, librdkafka, a
    traceback. Lines that already are JSON objects (Spark's log4j) pass as they are.
    """
    global _format
    _format = log_format
    handler = logging.StreamHandler()
    if log_format is LogFormat.JSON:
        if own_stderr:
            handler.setStream(_own_stderr(handler))
        formatter: logging.Formatter = JsonFormatter()
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # py4j logs every callback from the JVM (each batch's foreachBatch) at INFO, and the
    # schema registry client's HTTP library every request.
    for chatty in ("py4j", "httpx", "httpx2"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))


def _own_stderr(handler: logging.Handler) -> TextIO:
    """Point descriptor 2 at a pipe that a thread reads line by line; return the real stderr.

    Children inherit the pipe, so the JVM and the native Kafka client write into it too.
    At exit descriptor 2 goes back to the real stderr and the thread drains what is left.
    """
    real = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    # A failing handler would report on descriptor 2, that is into the pipe this thread
    # drains while the handler's lock is held: it stays silent instead.
    logging.raiseExceptions = False

    def pump() -> None:
        with os.fdopen(read_end, "rb") as pipe:
            for raw in pipe:
                # The pipe must keep draining whatever one line does: a writer blocked on
                # a full pipe would be the JVM or the Kafka client.
                with contextlib.suppress(Exception):
                    _pass_on(raw.decode(errors="replace").rstrip(), handler, real)

    reader = threading.Thread(target=pump, name="stderr-lines", daemon=True)
    reader.start()

    def restore() -> None:
        os.dup2(real.fileno(), 2)
        # Spark's JVM holds the pipe until it exits after this process: no end to wait for.
        reader.join(timeout=1)

    atexit.register(restore)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread
    return real


def _pass_on(text: str, handler: logging.Handler, real: TextIO) -> None:
    """One line from descriptor 2: a JSON object as it is, anything else as a record of
    logger ``stderr``, whatever the level (it may be the reason a command failed)."""
    if not text:
        return
    if _is_json_object(text):
        with _locked(handler):
            real.write(text + "\n")
        return
    handler.handle(
        logging.makeLogRecord(
            {"name": "stderr", "levelno": logging.WARNING, "levelname": "WARNING", "msg": text}
        )
    )


def _is_json_object(text: str) -> bool:
    if not text.startswith("{"):
        return False
    try:
        return isinstance(orjson.loads(text), dict)
    except orjson.JSONDecodeError:
        return False


class _locked:
    """A handler's lock as a context: a passed-through line never splits a logged one."""

    def __init__(self, handler: logging.Handler) -> None:
        self._handler = handler

    def __enter__(self) -> None:
        self._handler.acquire()

    def __exit__(self, *_: object) -> None:
        self._handler.release()


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """An uncaught exception as one JSON line instead of a traceback in plain text."""
    logging.getLogger("materializer").critical(
        "uncaught %s", kind.__name__, exc_info=(kind, exc, tb)
    )


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None:
        _log_uncaught(args.exc_type, args.exc_value, args.exc_traceback)


# Spark's driver (and, in local mode, its executors) log through log4j2. The pattern
# writes the keys JsonFormatter writes; %enc{...}{JSON} escapes quotes and newlines.
_LOG4J2_JSON = """\
status = warn
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = \
{"time":"%d{yyyy-MM-dd'T'HH:mm:ss.SSS'Z'}{UTC}","level":"%level{WARN=WARNING,FATAL=CRITICAL}","logger":"%enc{%c}{JSON}",\
"message":"%enc{%m}{JSON}"%notEmpty{,"exception":"%enc{%throwable}{JSON}"}}%n%throwable{none}
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
"""


def spark_log4j2() -> str | None:
    """The log4j2 configuration Spark's JVM needs to log in the process's format, or None
    where Spark's own (text) configuration already is that format."""
    return _LOG4J2_JSON if _format is LogFormat.JSON else None
