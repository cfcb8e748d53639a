"""A process that runs the real-time query of some maps until it is stopped, as tests need
one to kill: ``python -m tests.helpers.live_process <config> <checkpoint> <map>...``."""

from __future__ import annotations

import sys
from pathlib import Path

from materializer.config import load_config
from materializer.live.query import LiveMap, start_live
from materializer.spark.session import build_spark_session

CHECKPOINT_EVERY = "5 seconds"
"""The query's batches: short, so that a test's crash lands after a checkpoint or two."""


def main(argv: list[str]) -> None:
    config_path, checkpoint, *maps = argv
    config = load_config(Path(config_path))
    spark = build_spark_session(config.spark)
    members = [LiveMap(name) for name in maps]
    query = start_live(spark, config, members, checkpoint, batch_duration=CHECKPOINT_EVERY)
    print("live query started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(sys.argv[1:])
