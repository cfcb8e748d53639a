"""The lag in each batch's log line, from the offsets Spark reports."""

from __future__ import annotations

from materializer.pipeline.progress import offsets_lag


def test_lag_sums_what_is_available_but_not_read():
    end = '{"t":{"0":5,"1":7}}'
    latest = '{"t":{"0":9,"1":7,"2":3}}'
    assert offsets_lag(end, latest) == 4 + 0 + 3


def test_offsets_a_source_cannot_report_give_no_lag_rather_than_an_error():
    assert offsets_lag(None, '{"t":{"0":1}}') == 0
    assert offsets_lag('{"t":{"0":1}}', "") == 0
    assert offsets_lag('{"t":{"0":1}}', "not json") == 0
    assert offsets_lag('{"t":{"0":1}}', "[1, 2]") == 0
