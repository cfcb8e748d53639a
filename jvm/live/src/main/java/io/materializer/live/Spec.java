package io.materializer.live;

import com.google.gson.Gson;
import java.io.Serializable;
import java.util.List;
import java.util.Map;

/**
 * What a real-time query's writer needs to know, as {@code materializer.live.spec} writes it:
 * where Redis is, the Kafka producer's settings, and per map (by its index in the query's
 * {@code map} column) the function to call with its fixed arguments and the topics its
 * changelog and dead letters go to. The writer knows nothing of the maps' key layout or
 * fold: Python computes both, once, for the micro-batch path and this one.
 */
final class Spec implements Serializable {
  private static final long serialVersionUID = 1L;

  /** The name of the query the writer writes for, whose open writers a stop waits for. */
  String query;
  String redisUrl;
  String appId;
  Map<String, String> producer;
  List<MapSpec> maps;
  /** The script that adds a writer's figures to a map's hash ({@code live.freshness.ADD}). */
  String freshnessScript;
  /** The upper bounds of the freshness buckets, microseconds ({@code runtime.freshness}). */
  long[] freshnessBounds;
  /**
   * A task's Kafka transaction at most this often ({@code live.query.COMMIT_EVERY}): what
   * queues meanwhile goes into the next one, merged per key. It holds back the changelog
   * and the dead letters, never Redis.
   */
  long commitEveryMs;
  /** How often a writer adds its figures at most. */
  long freshnessEveryMs;

  /** One map's calls. {@code fixed} are the function's first ten arguments; the third, the
   * batch id, is left empty and filled in with the real-time batch's id. */
  static final class MapSpec implements Serializable {
    private static final long serialVersionUID = 1L;
    String name;
    String function;
    List<String> fixed;
    String meta;
    String changelog;
    String deadLetters;
    /** The map's real-time group, where each transaction commits the position after it. */
    String group;
    /** The prefix of its producers' transactional ids, the source partition after it. */
    String transactionalId;
    /** The map's figures hash ({@code redis_layout.live_freshness_key}). */
    String freshness;
    /** The map's fold as its function reads it ({@code live.query.function_fold}): empty
     * for {@code latest}, else the mode's spec. */
    String fold = "";
    /** Whether the order has the time of the record's fold in it, before the position, as
     * the micro-batch path puts the batch's time in ({@code fold.base.with_batch_time}). */
    boolean batchInOrder;
    /** How a truncate (Debezium's {@code op: t}) deletes every entity of the map. */
    TruncateSpec truncate;
  }

  /** A map's truncate ({@code materializer.redis.truncate}): the function, the key that
   * marks a truncate's record, the map's name in Redis and the names under it that are not
   * entities. */
  static final class TruncateSpec implements Serializable {
    private static final long serialVersionUID = 1L;
    String function;
    String key;
    String map;
    List<String> reserved;
  }

  static Spec parse(String json) {
    Spec spec = new Gson().fromJson(json, Spec.class);
    if (spec.query == null || spec.redisUrl == null || spec.maps == null || spec.maps.isEmpty() || spec.producer == null
        || spec.appId == null || spec.freshnessScript == null || spec.freshnessBounds == null
        || spec.commitEveryMs <= 0) {
      throw new IllegalArgumentException(
          "a live writer's spec needs query, redisUrl, appId, producer, maps and the freshness ones");
    }
    for (MapSpec m : spec.maps) {
      if (m.fixed == null || m.fixed.size() != 10 || m.function == null || m.meta == null
          || m.group == null || m.transactionalId == null || m.changelog == null
          || m.freshness == null || m.fold == null || m.truncate == null
          || m.truncate.function == null || m.truncate.key == null || m.truncate.map == null
          || m.truncate.reserved == null) {
        throw new IllegalArgumentException("map " + m.name + ": function, meta, changelog, "
            + "group, transactionalId, freshness, fold, truncate and 10 fixed arguments");
      }
    }
    return spec;
  }
}
