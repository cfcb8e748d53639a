"""Spark for the materializer: the one place a session is built (``session``)."""
