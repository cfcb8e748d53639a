package io.materializer.capture;

import io.debezium.embedded.Connect;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import java.lang.management.ManagementFactory;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import javax.management.MBeanServer;
import javax.management.ObjectName;
import org.apache.kafka.connect.source.SourceRecord;

/**
 * Captures a PostgreSQL database with Debezium's embedded engine and PostgreSQL connector
 * (pgoutput) and writes the change events to Kafka with a Kafka Connect converter.
 *
 * <pre>
 * java -cp 'jvm/lib/debezium/*' io.materializer.capture.Capture key=value... @file.properties...
 * </pre>
 *
 * (the settings: {@link CaptureConfig}). It snapshots the included tables (op {@code r}),
 * then streams their changes, truncates included. On standard output it says, one line each:
 * {@code capture: streaming} once the snapshot is done and the replication stream is open;
 * {@code capture: stopped after N change events} after SIGTERM, the engine closed and every
 * change event acknowledged by Kafka; {@code capture: failed: <why>} when the engine stops by
 * itself (exit code 1), or {@code capture: bad settings: <why>} (exit code 2).
 */
public final class Capture {
    private static final long STOP_WAIT_SECONDS = 30;

    private Capture() {}

    public static void main(String[] args) throws Exception {
        CaptureConfig config;
        Converters converters;
        try {
            config = CaptureConfig.parse(args);
            config.debezium();
            converters = Converters.of(config);
        } catch (IllegalArgumentException e) {
            say("bad settings: " + e.getMessage());
            System.exit(2);
            return;
        }
        KafkaWriter writer = new KafkaWriter(config, converters);
        AtomicReference<String> failure = new AtomicReference<>();
        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
                .using(config.debezium())
                .using((success, message, error) -> {
                    if (!success) {
                        failure.set(error != null ? message + ": " + error : message);
                    }
                })
                .notifying(writer)
                .build();

        AtomicBoolean stopping = new AtomicBoolean();
        CountDownLatch ended = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopping.set(true);
            try {
                engine.close();
            } catch (Exception e) {
                // Already stopped (a failure): nothing left to close.
            }
            try {
                ended.await(STOP_WAIT_SECONDS, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            writer.close();
            say("stopped after " + writer.written() + " change events");
        }, "capture-stop"));

        Thread watch = new Thread(() -> awaitStreaming(ended), "capture-watch");
        watch.setDaemon(true);
        watch.start();

        engine.run();
        ended.countDown();
        if (stopping.get()) {
            return; // SIGTERM: the shutdown hook flushes and reports
        }
        String why = failure.get();
        say("failed: " + (why != null ? why : "the engine stopped by itself"));
        System.exit(1);
    }

    /**
     * Says {@code capture: streaming} once the connector's streaming metrics report it
     * connected: the snapshot is over and the replication stream is open. (The slot was
     * made before the snapshot, so a change committed from then on is captured anyway.)
     */
    private static void awaitStreaming(CountDownLatch ended) {
        MBeanServer server = ManagementFactory.getPlatformMBeanServer();
        try {
            ObjectName streaming = new ObjectName("debezium.postgres:type=connector-metrics,context=streaming,*");
            while (ended.getCount() > 0) {
                for (ObjectName name : server.queryNames(streaming, null)) {
                    if (Boolean.TRUE.equals(server.getAttribute(name, "Connected"))) {
                        say("streaming");
                        return;
                    }
                }
                if (ended.await(100, TimeUnit.MILLISECONDS)) {
                    return;
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (Exception e) {
            say("cannot read the connector's metrics: " + e);
        }
    }

    private static void say(String line) {
        System.out.println("capture: " + line);
        System.out.flush();
    }
}
