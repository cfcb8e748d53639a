"""Operations on maps outside the streaming jobs: status, control, rehydrate, rebuild, verify,
offset resets. Each works from Redis, Kafka, the Delta tables and the checkpoints, without Spark
unless it replays events."""
