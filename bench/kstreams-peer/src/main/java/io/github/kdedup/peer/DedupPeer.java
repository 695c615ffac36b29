package io.github.kdedup.peer;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * DedupPeer deduplicates a topic the way Kafka Streams users do: a processor
 * with a persistent RocksDB store keyed by the record key, logged to a
 * changelog topic. Without a window the store is a KeyValueStore and a key is
 * remembered until its tombstone; with --window-ms it is a WindowStore whose
 * retention is the window, and a record is a duplicate when its key was
 * forwarded at a timestamp in [ts - window, ts]. A record is forwarded
 * unchanged (key, value, timestamp, headers) when its key is new, a tombstone
 * deletes the key and is forwarded, and a record without a key is forwarded.
 *
 * <p>With --repartition-json-field=FIELD it deduplicates by a field of the
 * JSON value instead, across partitions, as Kafka Streams users do when the
 * key changes: a processor sets the key to the field's string value (null
 * when the value is not JSON or lacks it), keeping the original key in a
 * header, {@code repartition()} writes the records to an internal topic
 * partitioned by the new key (murmur2), and the dedup processor, after that
 * hop, gives each record it forwards its original key back. The output is
 * then the input records, each event once, in their original form.
 *
 * <p>Flags (--name=value): bootstrap, input, output, application-id,
 * state-dir (required); guarantee (exactly_once_v2 or at_least_once, default
 * at_least_once); window-ms (default 0: no window); commit-interval-ms
 * (default 1000, kdedup's flush interval); threads (num.stream.threads,
 * default 1); repartition-json-field (default none; not with window-ms). It
 * runs until SIGTERM, then closes the streams client (which commits) and
 * exits 0.
 */
public final class DedupPeer {
    static final String STORE = "dedup-store";

    public static void main(String[] args) throws InterruptedException {
        Map<String, String> flags = new HashMap<>();
        for (String a : args) {
            if (!a.startsWith("--") || !a.contains("=")) {
                usage("bad argument " + a);
            }
            int eq = a.indexOf('=');
            flags.put(a.substring(2, eq), a.substring(eq + 1));
        }
        String input = required(flags, "input");
        String output = required(flags, "output");
        long windowMs = Long.parseLong(flags.getOrDefault("window-ms", "0"));
        String guarantee = flags.getOrDefault("guarantee", StreamsConfig.AT_LEAST_ONCE);
        if (!guarantee.equals(StreamsConfig.AT_LEAST_ONCE) && !guarantee.equals(StreamsConfig.EXACTLY_ONCE_V2)) {
            usage("--guarantee must be at_least_once or exactly_once_v2, not " + guarantee);
        }

        Properties p = new Properties();
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, required(flags, "bootstrap"));
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, required(flags, "application-id"));
        p.put(StreamsConfig.STATE_DIR_CONFIG, required(flags, "state-dir"));
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, flags.getOrDefault("commit-interval-ms", "1000"));
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, flags.getOrDefault("threads", "1"));
        // One broker: the changelog and any internal topic get one replica.
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, "1");
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

        String field = flags.getOrDefault("repartition-json-field", "");
        if (!field.isEmpty() && windowMs > 0) {
            usage("--repartition-json-field and --window-ms cannot be combined");
        }
        Topology topology = field.isEmpty() ? topology(input, output, windowMs) : repartitionTopology(input, output, field);
        KafkaStreams streams = new KafkaStreams(topology, p);
        CountDownLatch closed = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.err.println("kstreams-peer: state " + before + " -> " + now);
            if (now == KafkaStreams.State.ERROR) {
                closed.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(60));
            closed.countDown();
        }));
        streams.start();
        closed.await();
        if (streams.state() == KafkaStreams.State.ERROR) {
            streams.close(Duration.ofSeconds(10));
            System.exit(1);
        }
    }

    static Topology topology(String input, String output, long windowMs) {
        StoreBuilder<?> store = windowMs > 0
                ? Stores.windowStoreBuilder(
                        Stores.persistentWindowStore(STORE, Duration.ofMillis(windowMs), Duration.ofMillis(windowMs), false),
                        Serdes.Bytes(), Serdes.Long())
                : Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(STORE), Serdes.Bytes(), Serdes.Long());
        Topology t = new Topology();
        t.addSource("input", new ByteArrayDeserializer(), new ByteArrayDeserializer(), input);
        if (windowMs > 0) {
            t.addProcessor("dedup", () -> new WindowDedup(windowMs), "input");
        } else {
            t.addProcessor("dedup", KeyDedup::new, "input");
        }
        t.addStateStore(store, "dedup");
        t.addSink("output", output, new ByteArraySerializer(), new ByteArraySerializer(), "dedup");
        return t;
    }

    /** The name of the repartition step: its topic is {@code <application.id>-by-dedup-key-repartition}. */
    static final String REPARTITION = "by-dedup-key";
    static final String ORIGINAL_KEY = "peer-original-key";
    static final String ORIGINAL_NULL_KEY = "peer-original-key-null";
    /** Marks a record without the field: repartition() drops records with a null key, so it travels under a key of its own. */
    static final String UNKEYED = "peer-unkeyed";

    static Topology repartitionTopology(String input, String output, String field) {
        StreamsBuilder b = new StreamsBuilder();
        b.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(STORE), Serdes.Bytes(), Serdes.Long()));
        b.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .process(() -> new Rekey(field))
                .repartition(Repartitioned.<byte[], byte[]>with(Serdes.ByteArray(), Serdes.ByteArray()).withName(REPARTITION))
                .process(RestoringDedup::new, STORE)
                .to(output, Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        return b.build();
    }

    /** Rekey keys each record by a JSON field of its value, its original key kept in a header. */
    static final class Rekey implements Processor<byte[], byte[], byte[], byte[]> {
        private static final ObjectMapper JSON = new ObjectMapper();
        private final String field;
        private ProcessorContext<byte[], byte[]> ctx;

        Rekey(String field) {
            this.field = field;
        }

        @Override
        public void init(ProcessorContext<byte[], byte[]> ctx) {
            this.ctx = ctx;
        }

        @Override
        public void process(Record<byte[], byte[]> r) {
            byte[] key = null;
            if (r.value() != null) {
                try {
                    JsonNode v = JSON.readTree(r.value()).path(field);
                    if (v.isTextual() && !v.asText().isEmpty()) {
                        key = v.asText().getBytes(StandardCharsets.UTF_8);
                    }
                } catch (IOException notJson) {
                    // no key: forwarded as is
                }
            }
            Headers h = new RecordHeaders(r.headers().toArray());
            if (r.key() != null) {
                h.add(ORIGINAL_KEY, r.key());
            } else {
                h.add(ORIGINAL_NULL_KEY, new byte[0]);
            }
            if (key == null) {
                // Kafka Streams' repartition() filters out null keys: a
                // record without the field gets a key no event has (its
                // position), so it is spread and forwarded, not dropped.
                h.add(UNKEYED, new byte[0]);
                key = ctx.recordMetadata()
                        .map(m -> "\u0000" + m.partition() + "/" + m.offset())
                        .orElse("\u0000" + System.nanoTime())
                        .getBytes(StandardCharsets.UTF_8);
            }
            ctx.forward(r.withKey(key).withHeaders(h));
        }
    }

    /** RestoringDedup is KeyDedup after the repartition hop: it forwards records with their original key. */
    static final class RestoringDedup implements Processor<byte[], byte[], byte[], byte[]> {
        private ProcessorContext<byte[], byte[]> ctx;
        private KeyValueStore<Bytes, Long> seen;

        @Override
        public void init(ProcessorContext<byte[], byte[]> ctx) {
            this.ctx = ctx;
            this.seen = ctx.getStateStore(STORE);
        }

        @Override
        public void process(Record<byte[], byte[]> r) {
            if (r.headers().lastHeader(UNKEYED) == null) {
                Bytes k = Bytes.wrap(r.key());
                if (r.value() == null) {
                    seen.delete(k);
                } else if (seen.get(k) != null) {
                    return;
                } else {
                    seen.put(k, r.timestamp());
                }
            }
            Headers h = new RecordHeaders(r.headers().toArray());
            Header orig = h.lastHeader(ORIGINAL_KEY);
            h.remove(ORIGINAL_KEY);
            h.remove(ORIGINAL_NULL_KEY);
            h.remove(UNKEYED);
            ctx.forward(r.withKey(orig == null ? null : orig.value()).withHeaders(h));
        }
    }

    /** KeyDedup remembers each forwarded key (with its record's timestamp) until its tombstone. */
    static final class KeyDedup implements Processor<byte[], byte[], byte[], byte[]> {
        private ProcessorContext<byte[], byte[]> ctx;
        private KeyValueStore<Bytes, Long> seen;

        @Override
        public void init(ProcessorContext<byte[], byte[]> ctx) {
            this.ctx = ctx;
            this.seen = ctx.getStateStore(STORE);
        }

        @Override
        public void process(Record<byte[], byte[]> r) {
            if (r.key() == null) {
                ctx.forward(r);
                return;
            }
            Bytes k = Bytes.wrap(r.key());
            if (r.value() == null) {
                seen.delete(k);
                ctx.forward(r);
                return;
            }
            if (seen.get(k) != null) {
                return;
            }
            seen.put(k, r.timestamp());
            ctx.forward(r);
        }
    }

    /**
     * WindowDedup remembers a forwarded key at its record's timestamp; the
     * store drops it once stream time has passed it by the window (segment
     * by segment), and a lookup only sees entries within the window.
     */
    static final class WindowDedup implements Processor<byte[], byte[], byte[], byte[]> {
        private final long windowMs;
        private ProcessorContext<byte[], byte[]> ctx;
        private WindowStore<Bytes, Long> seen;

        WindowDedup(long windowMs) {
            this.windowMs = windowMs;
        }

        @Override
        public void init(ProcessorContext<byte[], byte[]> ctx) {
            this.ctx = ctx;
            this.seen = ctx.getStateStore(STORE);
        }

        @Override
        public void process(Record<byte[], byte[]> r) {
            if (r.key() == null) {
                ctx.forward(r);
                return;
            }
            Bytes k = Bytes.wrap(r.key());
            long ts = r.timestamp();
            if (r.value() == null) {
                // A window store has no delete by key: remove each entry.
                java.util.List<Long> at = new java.util.ArrayList<>();
                try (WindowStoreIterator<Long> it = seen.fetch(k, ts - windowMs, ts)) {
                    while (it.hasNext()) {
                        KeyValue<Long, Long> e = it.next();
                        at.add(e.key);
                    }
                }
                for (long start : at) {
                    seen.put(k, null, start);
                }
                ctx.forward(r);
                return;
            }
            try (WindowStoreIterator<Long> it = seen.fetch(k, ts - windowMs, ts)) {
                if (it.hasNext()) {
                    return;
                }
            }
            seen.put(k, ts, ts);
            ctx.forward(r);
        }
    }

    private static String required(Map<String, String> flags, String name) {
        String v = flags.get(name);
        if (v == null || v.isEmpty()) {
            usage("--" + name + " is required");
        }
        return v;
    }

    private static void usage(String why) {
        System.err.println("kstreams-peer: " + why);
        System.err.println("usage: java -jar kstreams-peer.jar --bootstrap=HOST:PORT --input=TOPIC --output=TOPIC"
                + " --application-id=ID --state-dir=DIR [--guarantee=at_least_once|exactly_once_v2]"
                + " [--window-ms=0] [--commit-interval-ms=1000] [--threads=1] [--repartition-json-field=FIELD]");
        System.exit(2);
    }

    private DedupPeer() {}
}
