package io.materializer.live;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.internals.RecordHeaders;
import redis.clients.jedis.Jedis;

/**
 * Applies records to their maps: one call of the map's function per chunk of its records,
 * then each key's state after the call to the changelog, and each failed record to the
 * dead-letter topic, as the micro-batch path's {@code materializer.redis.apply} does.
 */
final class Fold {
  /** Records per call: as the micro-batch path's chunks ({@code redis.functions.CHUNK}). */
  static final int CHUNK = 1000;

  private static final byte[] EMPTY = new byte[0];
  private static final String BATCH_HEADER = "x-batch-id";
  private static final String APP_HEADER = "x-app-id";

  private final Spec spec;
  private final Jedis redis;
  private final Transactions transactions;
  private final byte[] batch;

  Fold(Spec spec, Jedis redis, Transactions transactions, long batchId) {
    this.spec = spec;
    this.redis = redis;
    this.transactions = transactions;
    this.batch = Long.toString(batchId).getBytes(StandardCharsets.UTF_8);
  }

  /**
   * Applies the records, in order per map, then sends what they produce in one Kafka
   * transaction with the position after them, committed to each map's consumer group: the
   * changelog's states, the dead letters and the position land together or not at all, and
   * a restarted query starts at that position ({@code materializer.live.positions}).
   */
  void apply(List<Record> records) {
    Map<Integer, List<Record>> byMap = new LinkedHashMap<>();
    for (Record r : records) {
      byMap.computeIfAbsent(r.map, m -> new ArrayList<>()).add(r);
    }
    for (Map.Entry<Integer, List<Record>> e : byMap.entrySet()) {
      Spec.MapSpec map = spec.maps.get(e.getKey());
      List<Record> mine = e.getValue();
      Map<String, ProducerRecord<byte[], byte[]>> states = new LinkedHashMap<>();
      List<ProducerRecord<byte[], byte[]>> out = new ArrayList<>();
      for (int from = 0; from < mine.size(); from += CHUNK) {
        call(map, mine.subList(from, Math.min(mine.size(), from + CHUNK)), states, out);
      }
      out.addAll(states.values());
      transactions.commit(map, out, positions(mine));
    }
  }

  private static Map<TopicPartition, OffsetAndMetadata> positions(List<Record> records) {
    Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
    for (Record r : records) {
      next.put(new TopicPartition(r.topic, r.partition),
          new OffsetAndMetadata(r.offset + 1));
    }
    return next;
  }

  /** One call for a chunk of a map's records; each key's state after it into {@code states}
   * (a key's last one is all the changelog needs), each dead letter into {@code letters}. */
  private void call(
      Spec.MapSpec map,
      List<Record> chunk,
      Map<String, ProducerRecord<byte[], byte[]>> states,
      List<ProducerRecord<byte[], byte[]>> letters) {
    List<byte[]> args = new ArrayList<>(12 + 7 * chunk.size());
    for (int i = 0; i < map.fixed.size(); i++) {
      args.add(i == 2 ? batch : map.fixed.get(i).getBytes(StandardCharsets.UTF_8));
    }
    args.add(map.meta.getBytes(StandardCharsets.UTF_8));
    args.add(spec.appId.getBytes(StandardCharsets.UTF_8));
    byte[] route = null;
    for (Record r : chunk) {
      args.add(r.topic.getBytes(StandardCharsets.UTF_8));
      args.add(Integer.toString(r.partition).getBytes(StandardCharsets.UTF_8));
      args.add(Long.toString(r.offset).getBytes(StandardCharsets.UTF_8));
      args.add(r.failed() ? EMPTY : r.entity);
      args.add(r.failed() ? EMPTY : r.state);
      args.add(r.failed() ? EMPTY : r.order);
      args.add(r.failed() || r.value == null ? EMPTY : r.value);
      if (route == null && !r.failed()) {
        route = r.entity;
      }
    }
    if (route == null) {
      route = map.meta.getBytes(StandardCharsets.UTF_8);
    }
    List<?> answers = (List<?>) redis.fcall(map.function.getBytes(StandardCharsets.UTF_8),
        List.of(route), args);
    for (int i = 0; i < chunk.size(); i++) {
      Record r = chunk.get(i);
      Object answer = answers.get(i);
      if (answer instanceof Long code) {
        if (code == 1L) {
          states.put(r.key, changed(map, r, r.value));
        } else if (map.deadLetters != null) {
          // New (0), or applied before (-1) and read again after a crash: the transaction
          // that sent its dead letter then never committed (the query starts after the last).
          letters.add(deadLetter(map, r));
        }
      } else {
        // The state as it stands: the record was applied before, or a newer one was.
        states.put(r.key, changed(map, r, (byte[]) answer));
      }
    }
  }

  private ProducerRecord<byte[], byte[]> changed(Spec.MapSpec map, Record r, byte[] state) {
    RecordHeaders headers = new RecordHeaders();
    headers.add(BATCH_HEADER, batch);
    headers.add(APP_HEADER, spec.appId.getBytes(StandardCharsets.UTF_8));
    return new ProducerRecord<>(map.changelog, null, r.key.getBytes(StandardCharsets.UTF_8),
        state, headers);
  }

  private ProducerRecord<byte[], byte[]> deadLetter(Spec.MapSpec map, Record r) {
    RecordHeaders headers = new RecordHeaders();
    if (r.letterHeaders != null) {
      for (JsonElement h : JsonParser.parseString(r.letterHeaders).getAsJsonArray()) {
        JsonObject header = h.getAsJsonObject();
        JsonElement value = header.get("value");
        headers.add(header.get("key").getAsString(),
            value == null || value.isJsonNull() ? null : Base64.getDecoder().decode(value.getAsString()));
      }
    }
    return new ProducerRecord<>(map.deadLetters, null, r.letterKey, r.letterValue, headers);
  }

}
