package io.infersight.flink;

import java.util.concurrent.atomic.AtomicLong;

import org.apache.flink.api.common.eventtime.Watermark;
import org.apache.flink.api.common.eventtime.WatermarkGenerator;
import org.apache.flink.api.common.eventtime.WatermarkGeneratorSupplier;
import org.apache.flink.api.common.eventtime.WatermarkOutput;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.util.clock.RelativeClock;

/**
 * Bounded out-of-orderness watermarks with idle partitions, plus one rule Flink has no built-in for: when the
 * whole source reader has read nothing for {@code quietMs}, event time follows the wall clock, {@code quietMs}
 * behind it, so the windows of the last traffic before a silence close (a quiet fleet's dashboards would
 * otherwise freeze on old numbers until traffic returns).
 *
 * <p>Hand-written because no Flink strategy advances on silence: {@code withIdleness} only stops a quiet
 * partition from holding the others back, and a reader whose partitions are all idle stops emitting.
 *
 * <p>Quiet is measured on the reader's input-activity clock, which stands still while the reader is
 * back-pressured: a backlog waiting behind a slow job is not silence. Only the reader as a whole counts
 * (one shared clock per source subtask): a quiet partition beside busy ones is idle as before, never a
 * wall-clock watermark that would hold the busy ones back. Records arriving after such an advance are late
 * and follow the job's late-data rules.
 */
public final class QuietWatermarks<T> implements WatermarkStrategy<T> {
    private static final long serialVersionUID = 1L;

    private final long outOfOrdernessMs;
    private final long idleMs;
    private final long quietMs;
    // One per deserialized copy, i.e. per source subtask: shared by its per-partition generators.
    private transient AtomicLong readerLastEvent;
    private transient RelativeClock readerClock;

    private QuietWatermarks(long outOfOrdernessMs, long idleMs, long quietMs) {
        if (outOfOrdernessMs < 0 || idleMs <= 0 || quietMs < idleMs) {
            throw new IllegalArgumentException("want 0 <= out-of-orderness, 0 < idle <= quiet; got "
                    + outOfOrdernessMs + ", " + idleMs + ", " + quietMs + " ms");
        }
        this.outOfOrdernessMs = outOfOrdernessMs;
        this.idleMs = idleMs;
        this.quietMs = quietMs;
    }

    public static <T> WatermarkStrategy<T> of(long outOfOrdernessMs, long idleMs, long quietMs) {
        return new QuietWatermarks<>(outOfOrdernessMs, idleMs, quietMs);
    }

    @Override
    public synchronized WatermarkGenerator<T> createWatermarkGenerator(WatermarkGeneratorSupplier.Context context) {
        if (readerClock == null) {
            readerClock = context.getInputActivityClock();
            readerLastEvent = new AtomicLong(readerClock.relativeTimeMillis()); // a fresh reader waits quietMs
        }
        return new Generator<>(outOfOrdernessMs, idleMs, quietMs, readerClock, readerLastEvent);
    }

    static final class Generator<T> implements WatermarkGenerator<T> {
        private final long outOfOrdernessMs;
        private final long idleMs;
        private final long quietMs;
        private final RelativeClock clock;
        private final AtomicLong readerLastEvent;
        private long maxTimestamp = Long.MIN_VALUE;
        private long lastEvent;
        private long emitted = Long.MIN_VALUE;

        Generator(long outOfOrdernessMs, long idleMs, long quietMs, RelativeClock clock, AtomicLong readerLastEvent) {
            this.outOfOrdernessMs = outOfOrdernessMs;
            this.idleMs = idleMs;
            this.quietMs = quietMs;
            this.clock = clock;
            this.readerLastEvent = readerLastEvent;
            this.lastEvent = clock.relativeTimeMillis();
        }

        @Override
        public void onEvent(T event, long eventTimestamp, WatermarkOutput output) {
            maxTimestamp = Math.max(maxTimestamp, eventTimestamp);
            lastEvent = clock.relativeTimeMillis();
            readerLastEvent.set(lastEvent);
        }

        @Override
        public void onPeriodicEmit(WatermarkOutput output) {
            long now = clock.relativeTimeMillis();
            long fromEvents = maxTimestamp == Long.MIN_VALUE ? Long.MIN_VALUE : maxTimestamp - outOfOrdernessMs - 1;
            if (now - readerLastEvent.get() >= quietMs) {
                emit(output, Math.max(fromEvents, System.currentTimeMillis() - quietMs));
            } else if (now - lastEvent >= idleMs) {
                output.markIdle();
            } else if (fromEvents != Long.MIN_VALUE) {
                emit(output, fromEvents);
            }
        }

        private void emit(WatermarkOutput output, long watermark) {
            emitted = Math.max(emitted, watermark); // never backwards
            output.emitWatermark(new Watermark(emitted));
        }
    }
}
