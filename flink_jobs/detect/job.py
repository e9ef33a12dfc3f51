"""The detect job: window-stats records (``infersight.window_stats``, from the metrics job) -> per-series
streaming detectors and the cross-region incident correlator (``core``) -> anomaly and incident events on
``infersight.anomalies`` (JSON) and the detect metrics on ``infersight.metrics`` (to Prometheus through the
sink). Exactly once with checkpoints: the engine's state is keyed state, the sinks are transactional.

The region status (``infersight.region_status``, compacted, from the region status service; empty in the
single-region topology) is a second input, read from its earliest offset so the job knows each region's status
at once: a silence of a region whose link is delayed is a notice, not an outage (``regions.py``).

Run: ``python -m infersight.flink_jobs.detect.job --brokers HOST:PORT --jars <connector jar URLs>``."""

from __future__ import annotations

import argparse

from infersight.flink_jobs.detect.core import EngineParams
from infersight.flink_jobs.detect.stream import JOB
from infersight.schemas.topics import ANOMALIES, DLQ, METRICS, REGION_STATUS, WINDOW_STATS


def build(env, brokers: str, group_id: str, out_of_orderness_s: float, idle_s: float, quiet_s: float,
          input_topic: str = WINDOW_STATS.name, exactly_once: bool = True, start_ms: int | None = None,
          region_status_topic: str = REGION_STATUS.name, warmup_windows: int = EngineParams().established_windows
          ) -> None:
    from pyflink.common import Duration, Types, WatermarkStrategy
    from pyflink.common.serialization import ByteArraySchema
    from pyflink.datastream import OutputTag

    from infersight.flink_jobs.common.kafka_io import event_time, kafka_sink, kafka_source
    from infersight.flink_jobs.detect import functions as F

    dlq_tag = OutputTag("dlq", Types.STRING())
    # the window-stats records' Kafka timestamps are their windows' ends (the metrics job stamps them so)
    windows = env.from_source(kafka_source(brokers, input_topic, group_id, start_ms=start_ms),
                              event_time(out_of_orderness_s, idle_s, quiet_s), "window-stats")
    # The status records are stamped when judged (wall clock, ahead of the windows' event time) and refreshed
    # every few seconds; idle after idle_s (an empty topic, a stopped service) they never hold the windows back.
    # Not the quiet rule of event_time: a wall-clock watermark quiet_s behind would hold back fresh windows.
    statuses = env.from_source(
        kafka_source(brokers, region_status_topic, f"{group_id}-region-status", earliest=True),
        WatermarkStrategy.for_monotonous_timestamps().with_idleness(Duration.of_millis(int(idle_s * 1000))),
        "region-status")
    detect = F.DetectWindows(dlq_tag, EngineParams.with_warmup(warmup_windows))
    out = (windows.connect(statuses).key_by(F.fleet_key, F.fleet_key, key_type=Types.STRING())
           .process(detect, output_type=Types.PICKLED_BYTE_ARRAY()).name("detect"))
    (out.filter(F.is_event).map(F.second, output_type=Types.STRING()).name("events")
     .sink_to(kafka_sink(brokers, ANOMALIES.name, group_id, exactly_once=exactly_once)).name(ANOMALIES.name))
    (out.filter(F.is_metrics).map(F.second, output_type=Types.PRIMITIVE_ARRAY(Types.BYTE())).name("detect-metrics")
     .sink_to(kafka_sink(brokers, METRICS.name, group_id, ByteArraySchema(), exactly_once)).name(METRICS.name))
    (out.get_side_output(OutputTag("dlq", Types.STRING()))
     .sink_to(kafka_sink(brokers, DLQ.name, group_id, exactly_once=exactly_once)).name(DLQ.name))


def main(argv: list[str] | None = None) -> None:
    from infersight.flink_jobs.common.environment import add_jars_option, execution_environment
    from infersight.flink_jobs.common.kafka_io import add_quiet_option, add_start_option

    parser = argparse.ArgumentParser(prog="detect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--group-id", default=JOB)
    parser.add_argument("--input-topic", default=WINDOW_STATS.name,
                        help="window-stats records to read (another topic: a recorded or synthetic feed)")
    parser.add_argument("--region-status-topic", default=REGION_STATUS.name,
                        help="region status records (schemas/region_status.py), read from the earliest offset: a "
                             "silence of a region whose link is delayed is a notice, not an outage")
    parser.add_argument("--out-of-orderness-s", type=float, default=5.0,
                        help="how far behind the newest window's records another series' records of an earlier "
                             "window may come (the metrics job closes request and pod windows separately)")
    parser.add_argument("--idle-s", type=float, default=30.0, help="a source partition silent this long is idle")
    parser.add_argument("--checkpoint-s", type=float, default=5.0, help="checkpoint interval (events' latency)")
    parser.add_argument("--warmup-windows", type=int, default=EngineParams().established_windows,
                        help="windows of a series' history before its detectors may alert and its silence counts "
                             "(fewer: alerts sooner after a deployment, on a less settled baseline)")
    add_quiet_option(parser)
    add_start_option(parser)
    add_jars_option(parser)
    args = parser.parse_args(argv)
    env = execution_environment(args.jars)
    env.enable_checkpointing(int(args.checkpoint_s * 1000))
    build(env, args.brokers, args.group_id, args.out_of_orderness_s, args.idle_s, args.quiet_s, args.input_topic,
          start_ms=args.start_ms, region_status_topic=args.region_status_topic, warmup_windows=args.warmup_windows)
    env.execute(JOB)


if __name__ == "__main__":
    main()
