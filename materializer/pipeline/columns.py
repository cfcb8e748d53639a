"""Names of the internal columns that flow between the pipeline's stages.

Decoded records carry these beside the entity; the fold's output (one row per
key per batch) carries ``KEY``, ``DELETED``, ``ENTITY``, ``PARTITION`` and ``OFFSET``.
"""

KEY = "_key"
"""The entity key as a string: the Redis key suffix and the Delta merge key."""
DELETED = "_deleted"
ENTITY = "_entity"
ERROR_STAGE = "_error_stage"
ERROR_MESSAGE = "_error_message"
CORRUPT = "_corrupt_record"

# Spark's kafka source columns.
TOPIC = "topic"
PARTITION = "partition"
OFFSET = "offset"
KAFKA_KEY = "key"
VALUE = "value"
HEADERS = "headers"
TIMESTAMP = "timestamp"
