"""The root of every error Materializer raises on purpose."""

from __future__ import annotations


class MaterializerError(Exception):
    """Base class: callers catch this to tell our errors from bugs."""


class ConfigError(MaterializerError):
    """A configuration file that cannot be used; the message names each bad key path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"invalid configuration {source}:\n{lines}")


class SetupError(MaterializerError):
    """Something the machine must provide is missing (jars, Java, redis-server)."""


def first_line(exc: BaseException) -> str:
    """The headline of an error (Spark's carry a plan and a stack trace below it)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
