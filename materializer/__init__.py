"""Materializer: fold Kafka topics into Delta Lake tables and Redis maps."""

__version__ = "0.1.0"
