"""What a map's checkpoint position and the topics' offsets say is gone, and how it reads."""

from __future__ import annotations

from materializer.checkpoints.source_loss import Gap, SourceDataLoss, find_gaps
from materializer.ops.rebuild import within


def test_records_deleted_under_the_position_are_named_by_partition_and_range():
    gaps = find_gaps(["t"], {"t": {0: 4, 1: 16}}, {"t": {0: (9, 12), 1: (0, 20)}})
    assert gaps == [Gap("t", 0, "deleted", 4, 4, 8)]
    assert str(SourceDataLoss("users", gaps)) == (
        "map users cannot read on from its checkpoint: topic t partition 0: offsets 4 to 8 "
        "were deleted before the map read them (the map's next offset is 4, the partition now "
        "starts at 9). To go on, skip them with `materializer reset-offsets users --to "
        "earliest` (what the map holds stays; records it reads again change nothing), or fold "
        "it again from what the topics still hold with `materializer rebuild users`; then "
        "`materializer restart users` (or start the run again)."
    )


def test_a_position_inside_the_log_loses_nothing():
    # At the log start, at the end, in between; a topic the map no longer reads is not asked.
    position = {"t": {0: 9, 1: 20, 2: 5}, "old": {0: 3}}
    bounds = {"t": {0: (9, 12), 1: (0, 20), 2: (0, 7)}}
    assert find_gaps(["t"], position, bounds) == []


def test_a_partition_new_to_the_map_counts_from_zero():
    gaps = find_gaps(["t"], {"t": {0: 3}}, {"t": {0: (0, 3), 1: (0, 5), 2: (1, 5)}})
    assert gaps == [Gap("t", 2, "deleted", None, 0, 0)]
    assert gaps[0].describe() == (
        "topic t partition 2 (new to the map): offset 0 was deleted before the map read it "
        "(the partition starts at 1)"
    )


def test_a_topic_created_again_behind_the_map_asks_for_a_rebuild():
    gaps = find_gaps(["t", "u"], {"t": {0: 20, 1: 7}, "u": {0: 2}}, {"t": {0: (0, 5)}})
    assert gaps == [
        Gap("t", 0, "past_end", 20, 5, 19),
        Gap("t", 1, "partition_gone", 7, 7, 7),
        Gap("u", 0, "topic_gone", 2, 2, 2),
    ]
    loss = SourceDataLoss("users", gaps)
    assert loss.topic_recreated
    assert str(loss) == (
        "map users cannot read on from its checkpoint: topic t partition 0: the map's next "
        "offset 20 is past the partition's end 5 (offsets 5 to 19 were removed: the topic was "
        "deleted and created again, or truncated); topic t partition 1 no longer exists (the "
        "map's next offset in it was 7; the topic was deleted, or created again with fewer "
        "partitions); topic u partition 0: the topic no longer exists (the map's next offset "
        "in it was 2). Its state orders events by the old topic's offsets, so the new records "
        "would be folded wrongly: fold it again from what the topics hold now with "
        "`materializer rebuild users`, then `materializer restart users` (or start the run "
        "again)."
    )


def test_a_rebuild_switches_once_it_holds_what_the_topics_hold():
    live = {"t": {0: 20, 1: 7}, "gone": {0: 4}}
    assert within(live, {"t": {0: 5}}) == {"t": {0: 5}, "gone": {}}
