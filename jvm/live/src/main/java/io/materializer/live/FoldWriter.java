package io.materializer.live;

import java.net.URI;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
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
 * Redis never waits for Kafka. {@code close}, at the end of the real-time batch, waits until
 * every queued record is applied and its Kafka transaction committed, then Spark checkpoints
 * the batch. A failure (a refused call, a transaction Kafka did not commit)
 * fails the next {@code process} or the {@code close}: the task fails, and with it the
 * query, which starts again where the maps' committed positions say; the Redis Functions
 * recognise by source position what it applied before.
 */
public final class FoldWriter extends ForeachWriter<Row> {
  private static final long serialVersionUID = 1L;

  /** The most records one round of calls takes: a few Redis calls' worth. */
  static final int MOST = 2000;

  private final String specJson;
  private transient Spec spec;
  private transient Jedis redis;
  private transient Fold fold;
  private transient Transactions transactions;
  private transient LinkedBlockingQueue<Record> queue;
  private transient Thread applier;
  private transient volatile boolean closing;
  private transient volatile Throwable failure;

  public FoldWriter(String specJson) {
    this.specJson = specJson;
    Spec.parse(specJson); // a bad spec fails the query's start, not its first task
  }

  @Override
  public boolean open(long partitionId, long epochId) {
    spec = Spec.parse(specJson);
    redis = new Jedis(URI.create(spec.redisUrl));
    transactions = new Transactions(spec, partitionId);
    fold = new Fold(spec, redis, epochId);
    queue = new LinkedBlockingQueue<>();
    closing = false;
    failure = null;
    applier = new Thread(this::apply, "materializer-live-" + partitionId);
    applier.setDaemon(true);
    applier.start();
    return true;
  }

  private void apply() {
    List<Record> taken = new ArrayList<>();
    try {
      while (true) {
        Record first = queue.poll(50, TimeUnit.MILLISECONDS);
        if (first == null) {
          if (closing && queue.isEmpty()) {
            return;
          }
          continue;
        }
        taken.add(first);
        queue.drainTo(taken, MOST - 1);
        for (Effects effects : fold.apply(taken)) {
          transactions.submit(effects);
        }
        taken.clear();
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
    queue.add(Record.of(row));
  }

  @Override
  public void close(Throwable error) {
    closing = true;
    try {
      if (applier != null) {
        applier.join();
      }
      if (transactions != null) {
        transactions.close();
        transactions.check();
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      failure = e;
    } catch (RuntimeException e) {
      failure = e;
    } finally {
      if (redis != null) {
        redis.close();
      }
    }
    Throwable failed = failure;
    if (failed != null && error == null) {
      throw new IllegalStateException("the live fold failed: " + failed.getMessage(), failed);
    }
  }
}
