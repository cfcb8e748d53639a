"""Debezium's change events as a map's source (``source.envelope: debezium``).

Debezium writes each change of a table's row as an envelope: ``before`` and ``after``
(the row), ``op`` (``c`` create, ``r`` a snapshot's read, ``u`` update, ``d`` delete,
``t`` truncate), ``source`` (where and when the database made it) and ``ts_ms``; the
record key is the row's primary key as a struct, and a delete is followed by a
tombstone (the key with no value) for Kafka's compaction. The format (``json`` with or
without Connect's ``schema``/``payload`` wrapper, ``json_schema``, ``avro`` through the
registry) says how that envelope is encoded; this package says what it means:

- ``values_json``: the JSON envelope parsed in the JVM, Debezium's encodings of decimals,
  dates, timestamps read into the declared columns (``types``);
- ``values_avro``: the Avro envelope, decoded on the executors, ``after``'s fields typed
  by their Connect names;
- ``keys``: the key struct as the entity's key text;
- ``envelope``: the row becomes the record's fields, ``d`` a delete, the tombstone
  nothing, and a field Debezium could not send (TOAST) one the fold leaves alone.
"""
