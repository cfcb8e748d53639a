package io.materializer.live;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;
import redis.clients.jedis.Jedis;

/**
 * Applies records to their maps: one call of the map's function per chunk of its records;
 * each key's state after the call is owed to the changelog, and each failed record to the
 * dead-letter topic, as on the micro-batch path ({@code materializer.redis.apply}).
 */
final class Fold {
  /** Records per call: as the micro-batch path's chunks ({@code redis.functions.CHUNK}). */
  static final int CHUNK = 1000;
  /**
   * Records per call of a map that folds ({@code merge}, {@code aggregate}): each costs Redis
   * 15 to 25 µs, so that a call holds Redis's other clients up for 5 ms at most.
   */
  static final int FOLD_CHUNK = 200;

  private static final byte[] EMPTY = new byte[0];
  /** The bytes of a record's position at the end of its order ({@code fold.base.position}). */
  static final int POSITION_WIDTH = 29;
  private static final String BATCH_HEADER = "x-batch-id";
  private static final String APP_HEADER = "x-app-id";

  private final Spec spec;
  private final Jedis redis;
  private final Figures figures;
  private final byte[] batch;
  private long lastMs;

  Fold(Spec spec, Jedis redis, Figures figures, long batchId) {
    this.spec = spec;
    this.redis = redis;
    this.figures = figures;
    this.batch = Long.toString(batchId).getBytes(StandardCharsets.UTF_8);
  }

  /**
   * Applies the records to Redis, in order per map; what each map's records owe Kafka
   * ({@link Effects}), which {@link Transactions} then commits with the position after them.
   */
  List<Effects> apply(List<Record> records) {
    Map<Integer, List<Record>> byMap = new LinkedHashMap<>();
    for (Record r : records) {
      byMap.computeIfAbsent(r.map, m -> new ArrayList<>()).add(r);
    }
    List<Effects> out = new ArrayList<>();
    for (Map.Entry<Integer, List<Record>> e : byMap.entrySet()) {
      Effects effects = new Effects(spec.maps.get(e.getKey()));
      List<Record> mine = e.getValue();
      int chunk = effects.map.fold.isEmpty() ? CHUNK : FOLD_CHUNK;
      // A truncate applies after the records before it and before those after it.
      int start = 0;
      for (int i = 0; i <= mine.size(); i++) {
        boolean truncate = i < mine.size() && truncates(effects.map, mine.get(i));
        if (i < mine.size() && !truncate) {
          continue;
        }
        for (int from = start; from < i; from += chunk) {
          call(e.getKey(), effects, mine.subList(from, Math.min(i, from + chunk)));
        }
        if (truncate) {
          truncate(effects, mine.get(i));
        }
        start = i + 1;
      }
      out.add(effects);
    }
    return out;
  }

  /**
   * One call for a chunk of the records of map {@code index}, what it owes Kafka into
   * {@code effects}, how fresh they were into the figures.
   */
  private void call(int index, Effects effects, List<Record> chunk) {
    Spec.MapSpec map = effects.map;
    List<byte[]> args = new ArrayList<>(13 + 8 * chunk.size());
    for (int i = 0; i < map.fixed.size(); i++) {
      args.add(i == 2 ? batch : map.fixed.get(i).getBytes(StandardCharsets.UTF_8));
    }
    args.add(map.meta.getBytes(StandardCharsets.UTF_8));
    args.add(spec.appId.getBytes(StandardCharsets.UTF_8));
    args.add(map.fold.getBytes(StandardCharsets.UTF_8));
    byte[] now = map.batchInOrder
        ? String.format(Locale.ROOT, "%020d", clock()).getBytes(StandardCharsets.UTF_8)
        : null;
    byte[] route = null;
    for (Record r : chunk) {
      args.add(r.topic.getBytes(StandardCharsets.UTF_8));
      args.add(Integer.toString(r.partition).getBytes(StandardCharsets.UTF_8));
      args.add(Long.toString(r.offset).getBytes(StandardCharsets.UTF_8));
      args.add(r.failed() ? EMPTY : r.entity);
      args.add(r.failed() ? EMPTY : r.state);
      args.add(r.failed() ? EMPTY : now == null ? r.order : timed(r.order, now));
      args.add(r.failed() || r.value == null ? EMPTY : r.value);
      args.add(r.failed() || r.aux == null ? EMPTY : r.aux);
      if (route == null && !r.failed()) {
        route = r.entity;
      }
    }
    if (route == null) {
      route = map.meta.getBytes(StandardCharsets.UTF_8);
    }
    List<?> answers;
    try {
      answers = (List<?>) redis.fcall(map.function.getBytes(StandardCharsets.UTF_8),
          List.of(route), args);
    } catch (RuntimeException e) {
      throw new MapFailure(map.name, e);
    }
    Instant landed = Instant.now();
    long landedUs = landed.getEpochSecond() * 1_000_000L + landed.getNano() / 1_000;
    for (int i = 0; i < chunk.size(); i++) {
      Record r = chunk.get(i);
      Object answer = answers.get(i);
      effects.passed(r);
      if (!r.failed()) {
        figures.folded(index, r.timestampUs, landedUs);
      }
      if (answer instanceof Long code) {
        if (code == 1L) {
          effects.states.put(r.key, changed(map, r.key, r.value));
        } else if (map.deadLetters != null) {
          // New (0), or applied before (-1) and read again after a crash: the transaction
          // that sent its dead letter then never committed (the query starts after the last).
          effects.letters.add(deadLetter(map, r));
          figures.deadLetter(index);
        }
      } else {
        // The state as it stands: the record was applied before, or a newer one was.
        effects.states.put(r.key, changed(map, r.key, (byte[]) answer));
      }
    }
  }

  private static boolean truncates(Spec.MapSpec map, Record r) {
    return !r.failed() && map.truncate.key.equals(r.key);
  }

  /**
   * A truncate's record: every entity of the map deleted at its order in one call, each
   * one's value after it owed to the changelog ({@code materializer.redis.truncate}).
   */
  private void truncate(Effects effects, Record r) {
    Spec.MapSpec map = effects.map;
    List<byte[]> args = new ArrayList<>();
    for (int i = 0; i < map.fixed.size(); i++) {
      args.add(i == 2 ? batch : map.fixed.get(i).getBytes(StandardCharsets.UTF_8));
    }
    args.add(map.meta.getBytes(StandardCharsets.UTF_8));
    args.add(spec.appId.getBytes(StandardCharsets.UTF_8));
    args.add(map.fold.getBytes(StandardCharsets.UTF_8));
    args.add(r.topic.getBytes(StandardCharsets.UTF_8));
    args.add(Integer.toString(r.partition).getBytes(StandardCharsets.UTF_8));
    args.add(Long.toString(r.offset).getBytes(StandardCharsets.UTF_8));
    byte[] now = map.batchInOrder
        ? String.format(Locale.ROOT, "%020d", clock()).getBytes(StandardCharsets.UTF_8)
        : null;
    args.add(now == null ? r.order : timed(r.order, now));
    args.add(map.truncate.map.getBytes(StandardCharsets.UTF_8));
    for (String name : map.truncate.reserved) {
      args.add(name.getBytes(StandardCharsets.UTF_8));
    }
    List<?> answers;
    try {
      answers = (List<?>) redis.fcall(map.truncate.function.getBytes(StandardCharsets.UTF_8),
          List.of(map.meta.getBytes(StandardCharsets.UTF_8)), args);
    } catch (RuntimeException e) {
      throw new MapFailure(map.name, e);
    }
    effects.passed(r);
    for (int i = 0; i + 1 < answers.size(); i += 2) {
      String key = new String((byte[]) answers.get(i), StandardCharsets.UTF_8);
      effects.states.put(key, changed(map, key, (byte[]) answers.get(i + 1)));
    }
  }

  /**
   * The wall clock in milliseconds, never behind a time this writer handed out before: a
   * later record of its partition never gets an earlier time, should the clock step back.
   */
  private long clock() {
    lastMs = Math.max(lastMs, System.currentTimeMillis());
    return lastMs;
  }

  /**
   * The order with the time of its fold put between the event time and the position (the
   * order's last {@value #POSITION_WIDTH} bytes): a record folded later wins over one of the
   * key folded before from another partition, as a later micro-batch's does. The position
   * guard makes a record's fold happen once, so its time need not be the same at a replay.
   */
  private static byte[] timed(byte[] order, byte[] now) {
    int place = order.length - POSITION_WIDTH;
    byte[] out = new byte[order.length + now.length];
    System.arraycopy(order, 0, out, 0, place);
    System.arraycopy(now, 0, out, place, now.length);
    System.arraycopy(order, place, out, place + now.length, POSITION_WIDTH);
    return out;
  }

  private ProducerRecord<byte[], byte[]> changed(Spec.MapSpec map, String key, byte[] state) {
    RecordHeaders headers = new RecordHeaders();
    headers.add(BATCH_HEADER, batch);
    headers.add(APP_HEADER, spec.appId.getBytes(StandardCharsets.UTF_8));
    return new ProducerRecord<>(map.changelog, null, key.getBytes(StandardCharsets.UTF_8),
        state, headers);
  }

  private ProducerRecord<byte[], byte[]> deadLetter(Spec.MapSpec map, Record r) {
    RecordHeaders headers = new RecordHeaders();
    if (r.letterHeaders != null) {
      for (JsonElement h : JsonParser.parseString(r.letterHeaders).getAsJsonArray()) {
        JsonObject header = h.getAsJsonObject();
        JsonElement value = header.get("value");
        headers.add(header.get("key").getAsString(), value == null || value.isJsonNull()
            ? null : Base64.getDecoder().decode(value.getAsString()));
      }
    }
    return new ProducerRecord<>(map.deadLetters, null, r.letterKey, r.letterValue, headers);
  }
}
