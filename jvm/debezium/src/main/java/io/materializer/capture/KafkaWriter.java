package io.materializer.capture;

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.storage.SimpleHeaderConverter;

/**
 * Debezium's change events to Kafka, as a Connect worker would write them: each record's key
 * and value converted by the capture's converters, on the topic Debezium named, tombstones
 * (a null value after a delete) included.
 *
 * <p>A batch is marked processed only once every record of it is acknowledged by the
 * broker ({@code acks=all}, idempotent producer): the offsets Debezium keeps never run
 * ahead of the topic. A topic the broker does not have is created first, with the broker's
 * defaults (or {@code topic.partitions}); the tests' broker creates none by itself.
 */
final class KafkaWriter implements DebeziumEngine.ChangeConsumer<RecordChangeEvent<SourceRecord>>, AutoCloseable {
    private final Converters converters;
    private final SimpleHeaderConverter headerConverter = new SimpleHeaderConverter();
    private final KafkaProducer<byte[], byte[]> producer;
    private final Admin admin;
    private final Optional<Integer> partitions;
    private final Set<String> topics = new HashSet<>();
    private volatile long written;

    KafkaWriter(CaptureConfig config, Converters converters) {
        this.converters = converters;
        headerConverter.configure(Map.of());
        String bootstrap = config.required("bootstrap.servers");
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
        props.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        props.put(ProducerConfig.CLIENT_ID_CONFIG, "capture-" + config.topicPrefix());
        props.putAll(config.under("producer."));
        producer = new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
        Properties adminProps = new Properties();
        adminProps.put("bootstrap.servers", bootstrap);
        admin = Admin.create(adminProps);
        String count = config.get("topic.partitions", "");
        partitions = count.isEmpty() ? Optional.empty() : Optional.of(Integer.parseInt(count));
    }

    @Override
    public void handleBatch(
            List<RecordChangeEvent<SourceRecord>> events,
            DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer)
            throws InterruptedException {
        List<Future<RecordMetadata>> sent = new ArrayList<>(events.size());
        for (RecordChangeEvent<SourceRecord> event : events) {
            sent.add(send(event.record()));
        }
        for (Future<RecordMetadata> ack : sent) {
            try {
                ack.get();
            } catch (ExecutionException e) {
                throw new IllegalStateException("Kafka refused a change event", e.getCause());
            }
        }
        for (RecordChangeEvent<SourceRecord> event : events) {
            committer.markProcessed(event);
        }
        committer.markBatchFinished();
        written += events.size();
    }

    @Override
    public boolean supportsTombstoneEvents() {
        return true;
    }

    long written() {
        return written;
    }

    private Future<RecordMetadata> send(SourceRecord record) throws InterruptedException {
        String topic = record.topic();
        ensureTopic(topic);
        RecordHeaders headers = new RecordHeaders();
        for (Header header : record.headers()) {
            headers.add(header.key(), headerConverter.fromConnectHeader(topic, header.key(), header.schema(), header.value()));
        }
        byte[] key = converters.key.fromConnectData(topic, headers, record.keySchema(), record.key());
        byte[] value = converters.value.fromConnectData(topic, headers, record.valueSchema(), record.value());
        return producer.send(new ProducerRecord<>(topic, null, record.timestamp(), key, value, headers));
    }

    private void ensureTopic(String topic) throws InterruptedException {
        if (topics.contains(topic)) {
            return;
        }
        try {
            admin.createTopics(List.of(new NewTopic(topic, partitions, Optional.empty()))).all().get();
        } catch (ExecutionException e) {
            if (!(e.getCause() instanceof TopicExistsException)) {
                throw new IllegalStateException("cannot create topic " + topic, e.getCause());
            }
        }
        topics.add(topic);
    }

    /** Send what is buffered and wait for it, then close the clients. */
    @Override
    public void close() {
        producer.flush();
        producer.close(Duration.ofSeconds(10));
        admin.close(Duration.ofSeconds(5));
    }
}
