"""The quality job: the metrics job's quality signals (``infersight.quality_signals``: per request series and 10 s
window, the bin counts of every request's lengths, TTFT, finish reason and error type; the job never reads the
request records themselves) and evaluation records (``infersight.evaluations``: sampled judge and guardrail results
with their sample rates) -> per (region, model) and event-time window the engine of ``core`` (weighted estimates per
evaluator, the composite, drift of every signal against the baseline) -> quality records and drift events as JSON on
``infersight.quality`` (keyed ``region|model|version|track``), the estimates, distances and alarms on
``infersight.metrics`` (to Prometheus through the sink), dead letters on ``infersight.dlq``.

Windows close in order when the watermark (the slower source's) passes them; both sources have the quiet-traffic
watermarks, so the last windows close in a quiet pipeline. A signals record is stamped with its metrics window's last
millisecond: the quality window (``--window-s``, a multiple of the metrics job's) is a whole number of them. Exactly
once with checkpoints: the engines are keyed state (expiring with ``--state-ttl-s``), the sinks are transactional.
The record sink is declared in SQL because only the SQL Kafka connector writes a record key from a field from Python.

Run: ``python -m infersight.flink_jobs.quality.job --brokers HOST:PORT --jars <connector jar URLs>``."""

from __future__ import annotations

import argparse
from dataclasses import replace

from infersight.flink_jobs.quality.core import EngineParams
from infersight.flink_jobs.quality.drift import DAY_S, DriftParams
from infersight.flink_jobs.quality.stream import JOB
from infersight.schemas.quality import BASELINE_KINDS
from infersight.schemas.topics import DLQ, EVALUATIONS, METRICS, QUALITY, QUALITY_SIGNALS

DAY_BUCKET_S = 900  # the previous-day baseline's buckets: 15 minutes (the engine's own default is 5)
MAX_SERIES = 50  # versions x tracks tracked per model and region


def build(env, brokers: str, group_id: str, params: EngineParams, window_s: int, out_of_orderness_s: float,
          idle_s: float, quiet_s: float, start_ms: int | None = None, max_label_values: str = "",
          label_span_s: float = 3600.0, state_ttl_s: float = 0.0, pinned: str | None = None,
          signals_topic: str = QUALITY_SIGNALS.name, evaluations_topic: str = EVALUATIONS.name,
          quality_topic: str = QUALITY.name, exactly_once: bool = True):
    """The job's graph on ``env``; returns the statement set that writes the records (attached to ``env``)."""
    from pyflink.common import Types
    from pyflink.common.serialization import ByteArraySchema
    from pyflink.datastream import OutputTag

    from infersight.flink_jobs.common.cardinality import limits_of
    from infersight.flink_jobs.common.kafka_io import (
        event_time,
        kafka_sink,
        kafka_source,
        keyed_sink,
    )
    from infersight.flink_jobs.quality import functions as F
    from infersight.flink_jobs.quality.stream import LABELS

    limits = limits_of(max_label_values, LABELS)
    span_ms = int(label_span_s * 1000)

    def read(topic: str, kind: str):
        source = env.from_source(kafka_source(brokers, topic, f"{group_id}-{kind}", start_ms=start_ms),
                                 event_time(out_of_orderness_s, idle_s, quiet_s), kind)
        return source.process(F.ReadBatches(kind, window_s, OutputTag("dlq", Types.STRING()), topic, limits,
                                            span_ms), output_type=Types.PICKLED_BYTE_ARRAY()).name(f"read-{kind}")

    signals, evaluations = read(signals_topic, F.SIGNALS_KIND), read(evaluations_topic, F.EVALUATIONS_KIND)
    (signals.get_side_output(OutputTag("dlq", Types.STRING()))
     .union(evaluations.get_side_output(OutputTag("dlq", Types.STRING())))
     .sink_to(kafka_sink(brokers, DLQ.name, group_id, exactly_once=exactly_once)).name(DLQ.name))
    out = (signals.union(evaluations).key_by(F.engine_key_of, key_type=Types.STRING())
           .process(F.QualityWindows(params, state_ttl_s, pinned), output_type=Types.PICKLED_BYTE_ARRAY())
           .name("quality"))
    (out.filter(F.is_tag("metrics")).map(F.second, output_type=Types.PRIMITIVE_ARRAY(Types.BYTE()))
     .name("quality-metrics").sink_to(kafka_sink(brokers, METRICS.name, group_id, ByteArraySchema(), exactly_once))
     .name(METRICS.name))
    records = out.filter(F.is_tag("event")).map(
        F.second, output_type=Types.ROW_NAMED(["series", "record"], [Types.STRING(), Types.STRING()])).name("records")
    return keyed_sink(env, records, "quality_out", brokers, quality_topic, group_id, "series", "record", exactly_once)


def engine_params(args: argparse.Namespace) -> EngineParams:
    """The engine's parameters from the command line (the rest as ``core``'s defaults)."""
    drift = replace(DriftParams(), day_bucket_s=args.day_bucket_s, reference_s=args.reference_s)
    return EngineParams(baseline=args.baseline, drift=drift, max_series=args.max_series)


def main(argv: list[str] | None = None) -> None:
    from infersight.flink_jobs.common.environment import add_jars_option, execution_environment
    from infersight.flink_jobs.common.kafka_io import add_quiet_option, add_start_option

    parser = argparse.ArgumentParser(prog="quality", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--group-id", default=JOB)
    parser.add_argument("--window-s", type=int, default=60,
                        help="event-time window (s): one quality record per series and one drift evaluation per "
                             "window")
    parser.add_argument("--baseline", choices=BASELINE_KINDS, default="previous_day",
                        help="what drift is measured against (docs/quality.md): the same hours of the previous "
                             "day, the stable track of the same model and region, a pinned reference (--pinned), "
                             "or the series' own first --reference-s seconds")
    parser.add_argument("--reference-s", type=int, default=DriftParams().reference_s,
                        help="the reference baseline: this long from a series' first window with data, then frozen")
    parser.add_argument("--pinned", default=None,
                        help='the pinned baseline: a JSON file {"region|model|signal": {"counts": [...], "n": N}}')
    parser.add_argument("--day-bucket-s", type=int, default=DAY_BUCKET_S,
                        help="the previous-day baseline keeps a day of histograms in buckets this long (the state "
                             "per series: ~170 KB at 900 s with every signal, ~400 KB at 300 s)")
    parser.add_argument("--max-series", type=int, default=MAX_SERIES,
                        help="series (version x track) tracked per model and region; more are counted, not tracked")
    parser.add_argument("--out-of-orderness-s", type=float, default=10.0,
                        help="how far behind its partition's newest record a record may come and still make its "
                             "window (evaluation results come after their requests: they have their own times)")
    parser.add_argument("--idle-s", type=float, default=30.0, help="a source partition silent this long is idle")
    parser.add_argument("--checkpoint-s", type=float, default=5.0,
                        help="checkpoint interval: records and metrics reach read_committed readers at checkpoints")
    parser.add_argument("--max-label-values", default="",
                        help="cardinality bound: distinct values a label may take within --label-span-s before "
                             "further ones fold into _OTHER (Flink metric folded_<label>); N for every label or "
                             "label=N,... for region, model, model_version, track, evaluator (default 1000 each)")
    parser.add_argument("--label-span-s", type=float, default=3600.0,
                        help="a label value unseen this long frees its place in the bound")
    parser.add_argument("--state-ttl-s", type=float, default=float(DAY_S + 7200),
                        help="a model silent in a region this long loses its engine (baselines included): keyed "
                             "state stays bounded; keep it over a day for the previous-day baseline. 0: never")
    parser.add_argument("--signals-topic", default=QUALITY_SIGNALS.name,
                        help="the every-request drift signals per request series and window, as the metrics job "
                             "writes them (its --quality-signals-topic); this job never reads the request records")
    parser.add_argument("--evaluations-topic", default=EVALUATIONS.name)
    parser.add_argument("--quality-topic", default=QUALITY.name)
    add_quiet_option(parser)
    add_start_option(parser)
    add_jars_option(parser)
    args = parser.parse_args(argv)
    if args.baseline == "pinned" and not args.pinned:
        parser.error("--baseline pinned needs --pinned FILE")
    env = execution_environment(args.jars)
    env.enable_checkpointing(int(args.checkpoint_s * 1000))
    build(env, args.brokers, args.group_id, engine_params(args), args.window_s, args.out_of_orderness_s,
          args.idle_s, args.quiet_s, start_ms=args.start_ms, max_label_values=args.max_label_values,
          label_span_s=args.label_span_s, state_ttl_s=args.state_ttl_s, pinned=args.pinned,
          signals_topic=args.signals_topic, evaluations_topic=args.evaluations_topic,
          quality_topic=args.quality_topic)
    env.execute(JOB)


if __name__ == "__main__":
    main()
