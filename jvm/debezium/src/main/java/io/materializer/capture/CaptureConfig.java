package io.materializer.capture;

import java.io.IOException;
import java.io.Reader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;

/**
 * The capture's settings, from {@code key=value} arguments and {@code @file} properties files
 * (read in order, a later key winning), split into what Debezium, the converters and the
 * producer each take.
 *
 * <pre>
 * postgres.host, postgres.port, postgres.db, postgres.user, postgres.password
 * tables             Debezium's table.include.list (schema.table, comma-separated regexes)
 * topic.prefix       topics are &lt;prefix&gt;.&lt;schema&gt;.&lt;table&gt;, as Debezium names them
 * bootstrap.servers  the Kafka the change events go to
 * converter          json (schemas.enable=true) | json-plain (schemas.enable=false) | avro
 * registry.url       avro: Apicurio Registry, its Confluent API (…/apis/ccompat/v7) or its own v2 API
 * slot, publication  the replication slot and publication (default: capture_&lt;prefix&gt;)
 * offsets            a file for Debezium's offsets (default: in memory, and the slot is
 *                    dropped on stop, as nothing could resume from it)
 * topic.partitions   partitions of the topics the capture creates (default: the broker's)
 * debezium.K=V       any Debezium or engine property, e.g. debezium.decimal.handling.mode=string
 * converter.K=V      any property of the key and value converters
 * producer.K=V       any Kafka producer property
 * </pre>
 */
final class CaptureConfig {
    enum ConverterKind {
        JSON,
        JSON_PLAIN,
        AVRO
    }

    final Map<String, String> settings = new LinkedHashMap<>();

    static CaptureConfig parse(String[] args) throws IOException {
        CaptureConfig config = new CaptureConfig();
        for (String arg : args) {
            if (arg.startsWith("@")) {
                Properties file = new Properties();
                try (Reader in = Files.newBufferedReader(Path.of(arg.substring(1)), StandardCharsets.UTF_8)) {
                    file.load(in);
                }
                for (String key : file.stringPropertyNames()) {
                    config.settings.put(key, file.getProperty(key));
                }
                continue;
            }
            int eq = arg.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("not key=value or @file: " + arg);
            }
            config.settings.put(arg.substring(0, eq), arg.substring(eq + 1));
        }
        return config;
    }

    String required(String key) {
        String value = settings.get(key);
        if (value == null || value.isEmpty()) {
            throw new IllegalArgumentException("missing setting " + key);
        }
        return value;
    }

    String get(String key, String fallback) {
        String value = settings.get(key);
        return value == null || value.isEmpty() ? fallback : value;
    }

    ConverterKind converter() {
        String name = get("converter", "json");
        return switch (name) {
            case "json" -> ConverterKind.JSON;
            case "json-plain" -> ConverterKind.JSON_PLAIN;
            case "avro" -> ConverterKind.AVRO;
            default -> throw new IllegalArgumentException(
                    "converter is json, json-plain or avro, not " + name);
        };
    }

    String topicPrefix() {
        return required("topic.prefix");
    }

    /** A replication slot's name: lower-case letters, digits and underscores, at most 63. */
    String slot() {
        String derived = ("capture_" + topicPrefix()).toLowerCase(Locale.ROOT).replaceAll("[^a-z0-9_]", "_");
        return get("slot", derived.length() > 63 ? derived.substring(0, 63) : derived);
    }

    /** The settings under {@code prefix}, the prefix taken off. */
    Map<String, String> under(String prefix) {
        Map<String, String> out = new LinkedHashMap<>();
        settings.forEach((key, value) -> {
            if (key.startsWith(prefix)) {
                out.put(key.substring(prefix.length()), value);
            }
        });
        return out;
    }

    /** The engine's and the PostgreSQL connector's properties. */
    Properties debezium() {
        Properties props = new Properties();
        String prefix = topicPrefix();
        String slot = slot();
        props.setProperty("name", "capture-" + prefix);
        props.setProperty("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
        props.setProperty("database.hostname", get("postgres.host", "127.0.0.1"));
        props.setProperty("database.port", get("postgres.port", "5432"));
        props.setProperty("database.dbname", required("postgres.db"));
        props.setProperty("database.user", required("postgres.user"));
        props.setProperty("database.password", get("postgres.password", ""));
        props.setProperty("topic.prefix", prefix);
        String tables = settings.get("tables");
        if (tables != null && !tables.isEmpty()) {
            props.setProperty("table.include.list", tables);
        }
        props.setProperty("plugin.name", "pgoutput");
        props.setProperty("slot.name", slot);
        props.setProperty("publication.name", get("publication", slot));
        // A publication of the included tables only (all_tables would need a superuser).
        props.setProperty("publication.autocreate.mode", "filtered");
        props.setProperty("snapshot.mode", "initial");
        // Debezium skips truncates unless told otherwise ("t" is the default).
        props.setProperty("skipped.operations", "none");
        String offsets = settings.get("offsets");
        if (offsets == null || offsets.isEmpty()) {
            props.setProperty("offset.storage", "org.apache.kafka.connect.storage.MemoryOffsetBackingStore");
            props.setProperty("slot.drop.on.stop", "true");
        } else {
            props.setProperty("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore");
            props.setProperty("offset.storage.file.filename", offsets);
            props.setProperty("slot.drop.on.stop", "false");
        }
        props.setProperty("offset.flush.interval.ms", "1000");
        // A test's capture fails at once (exit code 1, its reason printed) rather than
        // retrying a refused connection for ever.
        props.setProperty("errors.max.retries", "0");
        if (converter() == ConverterKind.AVRO) {
            // Names Avro accepts for the records Debezium names after topics and columns.
            props.setProperty("schema.name.adjustment.mode", "avro");
            props.setProperty("field.name.adjustment.mode", "avro");
        }
        under("debezium.").forEach(props::setProperty);
        return props;
    }

    /** The native (v2) API of the Apicurio Registry that {@code registry.url} names. */
    String registryV2Url() {
        String url = required("registry.url").replaceAll("/+$", "");
        int ccompat = url.indexOf("/apis/ccompat/");
        if (ccompat >= 0) {
            return url.substring(0, ccompat) + "/apis/registry/v2";
        }
        return url;
    }
}
