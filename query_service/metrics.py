"""The query service's Prometheus metrics, served over HTTP on ``query.metrics_port``.

Requests are counted per method and status code, and timed per method, by
the one wrapper around every servicer method (``interceptors.MethodCall``,
gRPC and HTTP alike), so every call is measured the same way whatever its
kind or transport; codes are gRPC's names (``OK``, ``NOT_FOUND``...).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

REQUESTS = Counter(
    "materializer_query_requests",
    "RPCs answered, by method and status code.",
    ["method", "code"],
)
LATENCY = Histogram(
    "materializer_query_request_seconds",
    "Time from a call's arrival to its last response, by method.",
    ["method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
STORE_ERRORS = Counter(
    "materializer_query_store_errors",
    "Calls that failed because a store (Redis, a Delta table) could not be reached.",
    ["method"],
)


def serve_metrics(port: int, host: str = "0.0.0.0") -> None:  # noqa: S104 - scraped from the pod network
    """Expose ``/metrics`` on a daemon thread (the default registry)."""
    start_http_server(port, addr=host)
