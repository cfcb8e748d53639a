package io.materializer.live;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.types.StructType;

/** One record of the real-time query, taken out of Spark's row as the writer's thread needs
 * it. The columns are those {@code materializer.live.columns} selects, found by name once
 * per writer ({@link Columns}): a lookup by name for each column of each record was a
 * twentieth of the query's CPU. */
final class Record {
  final int map;
  final String topic;
  final int partition;
  final long offset;
  /** The Kafka timestamp, microseconds since the epoch. */
  final long timestampUs;
  final String key;
  final byte[] entity;
  final byte[] state;
  final byte[] order;
  final byte[] value;
  /** The mode's own text: for {@code merge}, the fields the record sets to null. */
  final byte[] aux;
  final byte[] letterKey;
  final byte[] letterValue;
  final String letterHeaders;

  /** Where each column is in the query's rows. */
  static final class Columns {
    final int map, topic, partition, offset, timestampUs, key, entity, state, order, value,
        aux, letterKey, letterValue, letterHeaders;

    Columns(StructType schema) {
      map = schema.fieldIndex("map");
      topic = schema.fieldIndex("topic");
      partition = schema.fieldIndex("partition");
      offset = schema.fieldIndex("offset");
      timestampUs = schema.fieldIndex("timestamp_us");
      key = schema.fieldIndex("key");
      entity = schema.fieldIndex("entity");
      state = schema.fieldIndex("state");
      order = schema.fieldIndex("order");
      value = schema.fieldIndex("value");
      aux = schema.fieldIndex("aux");
      letterKey = schema.fieldIndex("letter_key");
      letterValue = schema.fieldIndex("letter_value");
      letterHeaders = schema.fieldIndex("letter_headers");
    }
  }

  private Record(Row row, Columns at) {
    map = row.<Integer>getAs(at.map);
    topic = row.getAs(at.topic);
    partition = row.<Integer>getAs(at.partition);
    offset = row.<Long>getAs(at.offset);
    timestampUs = row.<Long>getAs(at.timestampUs);
    key = row.getAs(at.key);
    entity = bytes(row.<String>getAs(at.entity));
    state = row.getAs(at.state);
    order = bytes(row.<String>getAs(at.order));
    value = row.getAs(at.value);
    aux = bytes(row.<String>getAs(at.aux));
    letterKey = row.getAs(at.letterKey);
    letterValue = row.getAs(at.letterValue);
    letterHeaders = row.getAs(at.letterHeaders);
  }

  static Record of(Row row, Columns at) {
    return new Record(row, at);
  }

  /** Whether the record failed to decode, transform or key: it has no order. */
  boolean failed() {
    return order == null;
  }

  private static byte[] bytes(String text) {
    return text == null ? null : text.getBytes(java.nio.charset.StandardCharsets.UTF_8);
  }
}
