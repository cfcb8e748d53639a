package io.materializer.live;

import org.apache.spark.sql.Row;

/** One record of the real-time query, taken out of Spark's row as the writer's thread needs
 * it. The columns are those {@code materializer.live.query} selects, by name. */
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
  final byte[] letterKey;
  final byte[] letterValue;
  final String letterHeaders;

  private Record(Row row) {
    map = row.<Integer>getAs("map");
    topic = row.getAs("topic");
    partition = row.<Integer>getAs("partition");
    offset = row.<Long>getAs("offset");
    timestampUs = row.<Long>getAs("timestamp_us");
    key = row.getAs("key");
    entity = bytes(row.<String>getAs("entity"));
    state = row.getAs("state");
    order = bytes(row.<String>getAs("order"));
    value = row.getAs("value");
    letterKey = row.getAs("letter_key");
    letterValue = row.getAs("letter_value");
    letterHeaders = row.getAs("letter_headers");
  }

  static Record of(Row row) {
    return new Record(row);
  }

  /** Whether the record failed to decode, transform or key: it has no order. */
  boolean failed() {
    return order == null;
  }

  private static byte[] bytes(String text) {
    return text == null ? null : text.getBytes(java.nio.charset.StandardCharsets.UTF_8);
  }
}
