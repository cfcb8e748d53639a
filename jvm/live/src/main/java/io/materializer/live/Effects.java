package io.materializer.live;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * What a map's records applied to Redis owe Kafka: each key's state after them (a key's
 * last state is all the changelog needs), their dead letters, and the source position
 * after them. Rounds of one map merge into one, which one transaction commits.
 */
final class Effects {
  final Spec.MapSpec map;
  final Map<String, ProducerRecord<byte[], byte[]>> states = new LinkedHashMap<>();
  final List<ProducerRecord<byte[], byte[]>> letters = new ArrayList<>();
  final Map<TopicPartition, OffsetAndMetadata> positions = new HashMap<>();

  Effects(Spec.MapSpec map) {
    this.map = map;
  }

  void passed(Record r) {
    positions.merge(new TopicPartition(r.topic, r.partition), new OffsetAndMetadata(r.offset + 1),
        (a, b) -> a.offset() >= b.offset() ? a : b);
  }

  /** Takes a later round's effects of the same map in. */
  void merge(Effects later) {
    states.putAll(later.states);
    letters.addAll(later.letters);
    later.positions.forEach((tp, at) ->
        positions.merge(tp, at, (a, b) -> a.offset() >= b.offset() ? a : b));
  }

  /** The records to send: the dead letters, then the states. */
  List<ProducerRecord<byte[], byte[]>> records() {
    List<ProducerRecord<byte[], byte[]>> out = new ArrayList<>(letters);
    out.addAll(states.values());
    return out;
  }
}
