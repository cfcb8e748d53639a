package io.materializer.live;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * A task's Kafka transactions, on a thread of their own so that Redis does not wait for
 * Kafka (but for a producer's start, once per map and source partition, before the first
 * record it carries): the rounds of {@link Effects} that queue go out together, one transaction at most
 * every {@code commitEveryMs} of the spec, with the source position after them committed to the
 * map's group, as Kafka's own exactly-once pipelines commit theirs.
 *
 * <p>One transactional producer per map and source partition a task reads, its {@code
 * transactional.id} the map's prefix and the partition: a task started again for the
 * partition (after a crash, or on another worker) fences the one before it, whose open
 * transaction Kafka aborts. Each is started ({@link #ready}) before the first record it will
 * carry reaches Redis: a worker that took the map over fences the ids, and a producer
 * started only after that (a paused worker waking up with records it applied before the
 * takeover) would be the newest and commit them over the new owner's.
 */
final class Transactions {
  /** Rounds queued at most: past it, the Redis side waits for Kafka to catch up. */
  static final int MOST_QUEUED = 64;

  private final Spec spec;
  private final LinkedBlockingQueue<Effects> queue = new LinkedBlockingQueue<>(MOST_QUEUED);
  private final Thread committer;
  private volatile boolean closing;
  private volatile Throwable failure;
  /** The started producers, by {@code transactional.id}. */
  private final Map<String, KafkaProducer<byte[], byte[]>> producers = new HashMap<>();
  /** Set once the producers are closed: none starts after (it would outlive the writer). */
  private boolean released;
  /** The map and source partition of the last record {@link #ready} saw. */
  private int readyMap = -1;
  private String readyTopic;
  private int readyPartition = -1;

  Transactions(Spec spec, long partitionId) {
    this.spec = spec;
    committer = new Thread(this::commitAll, "materializer-live-kafka-" + partitionId);
    committer.setDaemon(true);
    committer.start();
  }

  /** Queues a round's effects, waiting while the queue is full; fails if a transaction
   * failed (its thread then takes no more). */
  void submit(Effects effects) throws InterruptedException {
    do {
      check();
    } while (!queue.offer(effects, 100, TimeUnit.MILLISECONDS));
  }

  /**
   * Starts the producer of each map and source partition of {@code records} not started yet
   * (Kafka's {@code initTransactions}, which fences the producers before it of the same id);
   * called before the records go to Redis.
   */
  void ready(List<Record> records) {
    for (Record r : records) {
      if (r.map == readyMap && r.partition == readyPartition && r.topic.equals(readyTopic)) {
        continue;
      }
      producerFor(spec.maps.get(r.map).transactionalId + "." + r.topic + "-" + r.partition);
      readyMap = r.map;
      readyTopic = r.topic;
      readyPartition = r.partition;
    }
  }

  /** Raises the failure of a transaction, if one failed. */
  void check() {
    Throwable failed = failure;
    if (failed != null) {
      throw new IllegalStateException("Kafka did not commit a transaction: "
          + failed.getMessage(), failed);
    }
  }

  /**
   * Waits until every queued round is committed (or {@code deadline}, epoch ms), then
   * releases the producer; whether an interrupt came meanwhile.
   */
  boolean close(long deadline) {
    closing = true;
    boolean interrupted = FoldWriter.joinUntil(committer, deadline);
    if (!committer.isAlive()) {
      release();
    }
    return interrupted;
  }

  private void commitAll() {
    List<Effects> taken = new ArrayList<>();
    Map<String, Effects> pending = new LinkedHashMap<>();
    long due = 0;
    try {
      while (true) {
        long wait = pending.isEmpty() ? 50 : Math.max(1, due - System.currentTimeMillis());
        Effects first = queue.poll(wait, TimeUnit.MILLISECONDS);
        if (first != null) {
          taken.add(first);
          queue.drainTo(taken);
          for (Effects e : taken) {
            pending.merge(e.map.name, e, (a, b) -> {
              a.merge(b);
              return a;
            });
          }
          taken.clear();
        }
        boolean last = closing && queue.isEmpty();
        if (!pending.isEmpty() && (last || System.currentTimeMillis() >= due)) {
          for (Effects e : pending.values()) {
            try {
              commit(e);
            } catch (RuntimeException failed) {
              throw new MapFailure(e.map.name, failed);
            }
          }
          pending.clear();
          due = System.currentTimeMillis() + spec.commitEveryMs;
        }
        if (last && pending.isEmpty()) {
          return;
        }
      }
    } catch (Throwable t) {
      failure = t;
      release();
    }
  }

  private void commit(Effects effects) {
    TopicPartition first = effects.positions.keySet().iterator().next();
    KafkaProducer<byte[], byte[]> p = producerFor(effects.map.transactionalId + "." + first);
    p.beginTransaction();
    for (ProducerRecord<byte[], byte[]> r : effects.records()) {
      p.send(r);
    }
    p.sendOffsetsToTransaction(effects.positions, new ConsumerGroupMetadata(effects.map.group));
    p.commitTransaction();
  }

  /**
   * The producer of {@code id}, started if it was not: the applier's thread starts them, the
   * committer's uses them. The start (which may wait on Kafka's coordinator) holds no lock.
   */
  private KafkaProducer<byte[], byte[]> producerFor(String id) {
    synchronized (this) {
      closedCheck();
      KafkaProducer<byte[], byte[]> known = producers.get(id);
      if (known != null) {
        return known;
      }
    }
    Properties props = new Properties();
    props.putAll(spec.producer);
    props.put("enable.idempotence", "true");
    props.put("acks", "all");
    props.put("transactional.id", id);
    KafkaProducer<byte[], byte[]> producer =
        new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
    try {
      producer.initTransactions();
      synchronized (this) {
        closedCheck();
        producers.put(id, producer);
      }
      return producer;
    } catch (RuntimeException e) {
      producer.close(Duration.ZERO);
      throw e;
    }
  }

  private void closedCheck() {
    if (released) {
      throw new IllegalStateException("the writer's Kafka producers are closed");
    }
  }

  private synchronized void release() {
    released = true;
    for (KafkaProducer<byte[], byte[]> producer : producers.values()) {
      producer.close(Duration.ofSeconds(10));
    }
    producers.clear();
  }
}
