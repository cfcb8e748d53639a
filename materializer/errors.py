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
