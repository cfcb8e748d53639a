package io.materializer.live;

import java.net.URI;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;
import redis.clients.jedis.Jedis;

/**
 * The real-time query's sink: each record goes to Redis as soon as it arrives.
 *
 * <p>Spark calls {@code process} on the task's thread for every record of its Kafka
 * partition; a call only queues it. A thread of the writer's own takes whatever has queued
 * (one record when they trickle in, up to {@link #MOST} when they pour) and applies it in
 * one Redis call per map ({@link Fold}), so a record waits for one round trip, not for a
 * batch to fill; what they owe Kafka goes out on another thread ({@link Transactions}), so
 * Redis does not wait for Kafka, but for a producer's start before the first record of each
 * map and source partition. {@code close}, at the end of the real-time batch, waits until
 * every queued record is applied and its Kafka transaction committed, then Spark checkpoints
 * the batch. A failure (a refused call, a transaction Kafka did not commit)
 * fails the next {@code process} or the {@code close}: the task fails, and with it the
 * query, which starts again where the maps' committed positions say; the Redis Functions
 * recognise by source position what it applied before.
 */
public final class FoldWriter extends ForeachWriter<Row> {
  /**
   * How long a Redis call may take: Jedis's default of 2 s cut calls short that waited
   * behind other writers' calls on a busy server (a backlog folded by many tasks at once),
   * and failed their maps; the Python side waits without a bound.
   */
  static final int REDIS_TIMEOUT_MS = 60_000;

  private static final long serialVersionUID = 1L;

  /** The most records one round of calls takes: a few Redis calls' worth. */
  static final int MOST = 2000;

  /** How long a task's end waits for its queued records' calls and transactions. */
  static final long DRAIN_MS = 60_000;

  /** The writers of this JVM between their open and the end of their close, per query. */
  private static final ConcurrentHashMap<String, AtomicInteger> OPEN = new ConcurrentHashMap<>();

  private final String specJson;
  private transient Spec spec;
  private transient Jedis redis;
  private transient Fold fold;
  private transient Figures figures;
  private transient Transactions transactions;
  private transient LinkedBlockingQueue<Record> queue;
  private transient Thread applier;
  private transient volatile boolean closing;
  private transient volatile Throwable failure;
  private transient boolean counted;
  /** Where each column is in the rows, found at the first row. */
  private transient Record.Columns columns;

  public FoldWriter(String specJson) {
    this.specJson = specJson;
    Spec.parse(specJson); // a bad spec fails the query's start, not its first task
  }

  @Override
  public boolean open(long partitionId, long epochId) {
    spec = Spec.parse(specJson);
    redis = new Jedis(URI.create(spec.redisUrl), REDIS_TIMEOUT_MS);
    transactions = new Transactions(spec, partitionId);
    figures = new Figures(spec);
    fold = new Fold(spec, redis, figures, epochId);
    queue = new LinkedBlockingQueue<>();
    closing = false;
    failure = null;
    applier = new Thread(this::apply, "materializer-live-" + partitionId);
    applier.setDaemon(true);
    applier.start();
    counted = true;
    open(spec.query).incrementAndGet();
    return true;
  }

  private void apply() {
    List<Record> taken = new ArrayList<>();
    try {
      while (true) {
        Record first = queue.poll(50, TimeUnit.MILLISECONDS);
        if (first == null) {
          if (closing && queue.isEmpty()) {
            figures.flush(redis, true);
            return;
          }
          figures.flush(redis, false);
          continue;
        }
        taken.add(first);
        queue.drainTo(taken, MOST - 1);
        transactions.ready(taken);
        for (Effects effects : fold.apply(taken)) {
          transactions.submit(effects);
        }
        taken.clear();
        figures.flush(redis, false);
      }
    } catch (Throwable t) {
      failure = t;
    }
  }

  @Override
  public void process(Row row) {
    Throwable failed = failure;
    if (failed != null) {
      throw new IllegalStateException("the live fold failed: " + failed.getMessage(), failed);
    }
    transactions.check();
    if (columns == null) {
      columns = new Record.Columns(row.schema());
    }
    queue.add(Record.of(row, columns));
  }

  @Override
  public void close(Throwable error) {
    // A stop of the query interrupts the task's thread: the records already queued were
    // applied to Redis, or are about to be, so their Kafka transactions are committed all
    // the same before the task ends (a graceful stop leaves nothing to the next start).
    closing = true;
    long deadline = System.currentTimeMillis() + DRAIN_MS;
    boolean interrupted = Thread.interrupted();
    try {
      interrupted |= joinUntil(applier, deadline);
      if (transactions != null) {
        interrupted |= transactions.close(deadline);
        transactions.check();
      }
    } catch (RuntimeException e) {
      failure = e;
    } finally {
      if (redis != null) {
        redis.close();
      }
      if (counted) {
        counted = false;
        open(spec.query).decrementAndGet();
      }
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
    Throwable failed = failure;
    if (failed != null && error == null) {
      throw new IllegalStateException("the live fold failed: " + failed.getMessage(), failed);
    }
  }

  /**
   * How many writers of the query named {@code query} are open in this JVM: a stopped query's
   * tasks end after the query does, and its writers commit what they applied meanwhile, so
   * whoever starts the next query of the same maps waits for none to be open first (its
   * fencing would abort their last transactions). The other queries' writers go on.
   */
  public static int openWriters(String query) {
    return open(query).get();
  }

  private static AtomicInteger open(String query) {
    return OPEN.computeIfAbsent(query, q -> new AtomicInteger());
  }

  /**
   * Waits for {@code thread} to end, or until {@code deadline} (epoch ms), through any
   * interrupt; whether one came (the caller then interrupts itself again).
   */
  static boolean joinUntil(Thread thread, long deadline) {
    boolean interrupted = false;
    while (thread != null && thread.isAlive()) {
      long left = deadline - System.currentTimeMillis();
      if (left <= 0) {
        break;
      }
      try {
        thread.join(left);
      } catch (InterruptedException e) {
        interrupted = true;
      }
    }
    return interrupted;
  }
}
