package io.materializer.live;

import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * A task's Kafka transactions: each round's changelog and dead-letter records with the
 * source position after them, committed to the map's consumer group, as Kafka's own
 * exactly-once pipelines commit theirs.
 *
 * <p>One transactional producer per source partition a task reads, its {@code
 * transactional.id} named after the map and the partition: a task started again for the
 * partition (after a crash, or on another worker) fences the one before it, whose
 * transaction then can no longer commit.
 */
final class Transactions implements AutoCloseable {
  private final Spec spec;
  private KafkaProducer<byte[], byte[]> producer;
  private String transactionalId;

  Transactions(Spec spec) {
    this.spec = spec;
  }

  void commit(
      Spec.MapSpec map,
      List<ProducerRecord<byte[], byte[]>> records,
      Map<TopicPartition, OffsetAndMetadata> positions) {
    TopicPartition first = positions.keySet().iterator().next();
    KafkaProducer<byte[], byte[]> p = producerFor(map.transactionalId + "." + first);
    p.beginTransaction();
    try {
      for (ProducerRecord<byte[], byte[]> r : records) {
        p.send(r);
      }
      p.sendOffsetsToTransaction(positions, new ConsumerGroupMetadata(map.group));
      p.commitTransaction();
    } catch (RuntimeException e) {
      close();
      throw e;
    }
  }

  private KafkaProducer<byte[], byte[]> producerFor(String id) {
    if (producer != null && id.equals(transactionalId)) {
      return producer;
    }
    close();
    Properties props = new Properties();
    props.putAll(spec.producer);
    props.put("enable.idempotence", "true");
    props.put("acks", "all");
    props.put("transactional.id", id);
    producer = new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
    transactionalId = id;
    producer.initTransactions();
    return producer;
  }

  @Override
  public void close() {
    if (producer != null) {
      producer.close(java.time.Duration.ofSeconds(10));
      producer = null;
      transactionalId = null;
    }
  }
}
