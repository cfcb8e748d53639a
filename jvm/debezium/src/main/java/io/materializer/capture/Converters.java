package io.materializer.capture;

import io.apicurio.registry.utils.converter.AvroConverter;
import java.util.HashMap;
import java.util.Map;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.storage.Converter;

/**
 * The key and value converters a capture writes with, configured as a Kafka Connect worker's
 * {@code key.converter} and {@code value.converter} would be.
 *
 * <p>Avro goes through Apicurio's converter in Confluent's wire format: magic byte 0, then
 * the schema's 4-byte id (Legacy4ByteIdHandler, {@code as-confluent}), the id being the
 * content id, which is what the registry's Confluent API serves as {@code /schemas/ids/{id}}
 * (Apicurio 2.x without legacy-id-mode); no id in record headers. Schemas are registered
 * under the topic's {@code <topic>-key} and {@code <topic>-value} subjects (artifacts of
 * the default group), each whole (no references to other subjects), a changed one as a new
 * version.
 */
final class Converters {
    final Converter key;
    final Converter value;

    private Converters(Converter key, Converter value) {
        this.key = key;
        this.value = value;
    }

    static Converters of(CaptureConfig config) {
        Map<String, Object> settings = new HashMap<>();
        Converter key;
        Converter value;
        switch (config.converter()) {
            case JSON, JSON_PLAIN -> {
                settings.put("schemas.enable", config.converter() == CaptureConfig.ConverterKind.JSON);
                key = new JsonConverter();
                value = new JsonConverter();
            }
            case AVRO -> {
                settings.put("apicurio.registry.url", config.registryV2Url());
                settings.put("apicurio.registry.auto-register", true);
                settings.put("apicurio.registry.as-confluent", true);
                settings.put("apicurio.registry.use-id", "contentId");
                settings.put("apicurio.registry.headers.enabled", false);
                // One self-contained schema per subject: without this, a record field (the
                // envelope's source block) goes to a subject of its own as a reference.
                settings.put("apicurio.registry.dereference-schema", true);
                key = new AvroConverter<>();
                value = new AvroConverter<>();
            }
            default -> throw new IllegalStateException();
        }
        settings.putAll(config.under("converter."));
        key.configure(settings, true);
        value.configure(settings, false);
        return new Converters(key, value);
    }
}
