"""The demo's figures: lag and freshness from a watermark and the producer's deliveries."""

from __future__ import annotations

from materializer.contract.status import MapReport
from materializer.contract.watermark import Watermark
from materializer.demo.domain import ORDERS, USER_EVENTS, USER_ORDERS, USERS
from materializer.demo.monitor import folded_users, progress
from materializer.demo.producer import Delivery, DeliveryLog

NOW_MS = 1_750_000_100_000


def _log() -> DeliveryLog:
    log = DeliveryLog()
    # user-events: partition 0 gets offsets 0..5, partition 1 offsets 0..3, 1 s apart per offset.
    for partition, count in ((0, 6), (1, 4)):
        for offset in range(count):
            log.delivered(
                Delivery(USER_EVENTS, partition, offset, f"u-{partition}{offset}", 1000.0 + offset)
            )
    log.delivered(Delivery(ORDERS, 0, 0, "u-00", 1001.5))
    return log


def test_lag_is_the_log_end_minus_the_watermark_and_freshness_the_newest_folded_event():
    mark = Watermark(batch_id=3, offsets={USER_EVENTS: {0: 4, 1: 2}}, updated_at_ms=1_004_500)
    report = MapReport("running", reported_at_ms=NOW_MS, processed_rows_per_second=12.0)
    users = progress(USERS, mark, report, _log(), NOW_MS)
    assert (users.produced, users.folded, users.lag) == (10, 6, 4)
    # Folded up to offset 3 (produced at 1003.0) and offset 1 (1001.0): 1004.5 - 1003.0.
    assert users.freshness == 1.5
    assert (users.state, users.batch_id, users.rows_per_second) == ("running", 3, 12.0)


def test_a_map_without_a_batch_or_a_report_is_starting_and_a_silent_run_is_named():
    orders = progress(USER_ORDERS, None, None, _log(), NOW_MS)
    assert (orders.produced, orders.folded, orders.lag, orders.freshness) == (1, 0, 1, None)
    assert orders.state == "starting"
    old = MapReport("running", reported_at_ms=NOW_MS - 60_000)
    assert progress(USER_ORDERS, None, old, _log(), NOW_MS).state == "silent"


def test_produce_times_below_a_watermark_are_forgotten():
    log = _log()
    assert log.produced_at(USER_EVENTS, 0, 2) == 1002.0
    assert log.produced_at(USER_EVENTS, 0, 5) == 1005.0
    assert log.produced_at(USER_EVENTS, 0, 2) is None
    assert log.produced_at(USER_EVENTS, 0, 5) == 1005.0


def test_sample_users_are_the_latest_whose_profile_events_are_folded():
    mark = Watermark(batch_id=1, offsets={USER_EVENTS: {0: 4, 1: 4}})
    # Newest first: u-13 .. u-10 on partition 1 are folded, u-05 and u-04 on partition 0 are
    # not; the order (the newest delivery of all) is not a profile event.
    assert folded_users(_log(), mark, 3) == ["u-13", "u-12", "u-11"]
    assert folded_users(_log(), None, 3) == []
