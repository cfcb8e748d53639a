"""Spark for the materializer: the one place a session is built (``session``), and its stop
signals routed to one drain (``signals``)."""
