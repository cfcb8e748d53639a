package io.materializer.live;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import redis.clients.jedis.Jedis;

/**
 * A writer's fold figures per map, as the micro-batch path's {@code Applied} counts them:
 * each folded record's age when its Redis call returned, in the buckets of {@code
 * runtime.freshness}, the newest Kafka timestamp folded and the dead letters. Added to the
 * map's hash in Redis ({@code live.freshness}) at most every {@code freshnessEveryMs}, and
 * at the task's end; the run takes them from there into the map's metrics.
 */
final class Figures {
  private final Spec spec;
  private final long[][] counts;
  private final long[] sum;
  private final long[] max;
  private final long[] newest;
  private final long[] dead;
  private long due;

  Figures(Spec spec) {
    this.spec = spec;
    int n = spec.maps.size();
    counts = new long[n][spec.freshnessBounds.length + 1];
    sum = new long[n];
    max = new long[n];
    newest = new long[n];
    dead = new long[n];
    clear();
    due = System.currentTimeMillis() + spec.freshnessEveryMs;
  }

  /** A record of map {@code map} folded, its Redis call having returned at {@code landedUs}. */
  void folded(int map, long timestampUs, long landedUs) {
    long age = Math.max(0, landedUs - timestampUs);
    int bucket = Arrays.binarySearch(spec.freshnessBounds, age);
    counts[map][bucket >= 0 ? bucket : -bucket - 1]++;
    sum[map] += age;
    max[map] = Math.max(max[map], age);
    newest[map] = Math.max(newest[map], timestampUs);
  }

  void deadLetter(int map) {
    dead[map]++;
  }

  /**
   * Adds the figures to Redis when due (or {@code now}); kept for the next time if Redis
   * refuses: the next fold call then fails the task for the same cause.
   */
  void flush(Jedis redis, boolean now) {
    if (!now && System.currentTimeMillis() < due) {
      return;
    }
    due = System.currentTimeMillis() + spec.freshnessEveryMs;
    for (int m = 0; m < counts.length; m++) {
      if (newest[m] < 0 && dead[m] == 0) {
        continue;
      }
      List<String> args = new ArrayList<>();
      args.add(Long.toString(newest[m]));
      args.add(Long.toString(max[m]));
      args.add(Long.toString(sum[m]));
      args.add(Long.toString(dead[m]));
      for (int b = 0; b < counts[m].length; b++) {
        if (counts[m][b] > 0) {
          args.add(Integer.toString(b));
          args.add(Long.toString(counts[m][b]));
        }
      }
      try {
        redis.eval(spec.freshnessScript, List.of(spec.maps.get(m).freshness), args);
      } catch (RuntimeException e) {
        return;
      }
      clearMap(m);
    }
  }

  private void clear() {
    for (int m = 0; m < counts.length; m++) {
      clearMap(m);
    }
  }

  private void clearMap(int m) {
    Arrays.fill(counts[m], 0);
    sum[m] = 0;
    max[m] = -1;
    newest[m] = -1;
    dead[m] = 0;
  }
}
