"""How the console writes figures: unknown is a dash, never a zero; trend lines skip gaps."""

from __future__ import annotations

from query_service.console import figures


def test_durations_counts_and_sizes_read_as_people_write_them() -> None:
    assert figures.duration(0.25) == "250 ms"
    assert figures.duration(12.44) == "12.4 s"
    assert figures.duration(185) == "3 min 5 s"
    assert figures.duration(7800) == "2 h 10 min"
    assert figures.count(12) == "12" and figures.count(2.5) == "2.5"
    assert figures.count(3400) == "3.4 k" and figures.count(1_200_000) == "1.2 M"
    assert figures.size(512) == "512 B" and figures.size(3 * 2**20) == "3.0 MiB"
    for unknown in (None, -1, -1.0):
        assert figures.duration(unknown) == figures.count(unknown) == figures.size(unknown)
        assert figures.duration(unknown) == figures.DASH


def test_a_trend_line_spans_its_box_and_leaves_unknown_values_out() -> None:
    points = figures.sparkline([0.0, 5.0, 10.0], width=100, height=22)
    xy = [tuple(map(float, p.split(","))) for p in points.split()]
    assert [x for x, _ in xy] == [0.0, 50.0, 100.0]
    assert xy[0][1] == 21.0 and xy[2][1] == 1.0  # zero at the bottom, the top at the top
    gappy = figures.sparkline([1.0, None, 3.0], width=100, height=22).split()
    assert [p.split(",")[0] for p in gappy] == ["0.0", "100.0"]
    assert figures.sparkline([None, 2.0]) == "" and figures.sparkline([]) == ""
    flat = figures.sparkline([0.0, 0.0])
    assert flat  # a flat line still draws
