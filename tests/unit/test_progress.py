"""The batch log line, from the progress Spark reports as JSON."""

from __future__ import annotations

import logging

import pytest

from materializer.runtime.progress import BatchLog


def _progress(end, latest) -> dict:
    return {
        "name": "users.fold",
        "batchId": 7,
        "numInputRows": 12,
        "batchDuration": 345,
        "timestamp": "2026-11-25T01:02:03.456Z",
        "sources": [{"endOffset": end, "latestOffset": latest}],
    }


def _logged(caplog, progress) -> dict:
    log = BatchLog()
    log.rows_out("users.fold", 7, 5)
    with caplog.at_level(logging.INFO, logger="materializer.batches"):
        log.progress(progress)
    (record,) = caplog.records
    return {k: getattr(record, k) for k in ("query", "batch", "rows_in", "rows_out", "lag")}


def test_a_line_per_batch_with_rows_out_and_the_lag_available_but_not_read(caplog):
    # Spark's JSON carries the Kafka offsets as objects.
    end = {"t": {"0": 5, "1": 7}}
    latest = {"t": {"0": 9, "1": 7, "2": 3}}
    assert _logged(caplog, _progress(end, latest)) == {
        "query": "users.fold",
        "batch": 7,
        "rows_in": 12,
        "rows_out": 5,
        "lag": 4 + 0 + 3,
    }


@pytest.mark.parametrize(
    ("end", "latest"),
    [(None, {"t": {"0": 1}}), ({"t": {"0": 1}}, ""), ({"t": {"0": 1}}, "not json"), ({}, [1, 2])],
)
def test_offsets_a_source_cannot_report_give_no_lag_rather_than_an_error(caplog, end, latest):
    assert _logged(caplog, _progress(end, latest))["lag"] == 0
