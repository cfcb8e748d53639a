"""Value formats: one module per way a Kafka value becomes the entity's fields.

``source.decode`` picks the module for a map's ``source.format``. Formats the
JVM decodes (declared JSON, Avro from a schema file) are Spark expressions;
formats Spark cannot decode on its own (Confluent's wire format, protobuf)
decode in Python on the executors, one Arrow batch at a time; JSON without a
declared schema keeps each value as a document whose fields are typed per
micro-batch (``json_inferred``, then ``materializer.fold.entity_types``).
"""
