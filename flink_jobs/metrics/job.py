"""metrics: request records and pod gauges -> windowed OTLP metrics on ``infersight.metrics``.

Event time is the request's end. Tumbling windows (10 s default) keyed by region, model, model version,
track and engine; a roll-up over regions (``region="global"``) merges the regional windows' buckets
and sketches. Watermarks allow bounded out-of-orderness; idle partitions are marked idle so they do
not hold windows back. A delayed region's backlog (its link was cut; the others moved event time on) still
lands in its own windows up to ``--catchup-s`` (15 min) behind the watermark: catch-up windows, fired once
its records for them stop coming (``--catchup-quiet-s``); the global roll-up's windows it missed are
superseded, their first result marked partial by ``infersight.rollup.regions``. Records later than that, or
arriving after their catch-up window fired, go to ``infersight.late``, are counted in
``infersight.late.records`` and join their series' counters and cumulative histograms (not the
per-window gauges and quantiles), so totals stay complete through outages that delay data.
Pod gauges and cost (from a pricing file) roll up per deployment (region, model, model version, track), per
region over deployments, per deployment over regions and over everything, per window.
Counters and histograms are cumulative per series (kept in keyed state, so checkpointed), each point
stamped with its window's end. Sinks are transactional (exactly-once with checkpoints).
Per regional series and window it also writes the detectors' window statistics (``infersight.window_stats``) and
the quality job's every-request drift signals as bin counts (``infersight.quality_signals``,
``schemas.quality_signals``; on-time and catch-up windows, each stamped with its window's last millisecond), so
neither of those jobs reads every request record.
Client calls (issue #22, ``infersight.client_calls``): each client half is joined by trace with the server half
of the request it called (``client_join``), and the client's TTFT published per region and model (the server
record's) as ``infersight.client.time_to_first_token``; calls with no request within the timeout are counted
in ``infersight.client.unmatched``.

    python -m infersight.flink_jobs.metrics.job --brokers HOST:PORT --jars URL;URL
"""

from __future__ import annotations

import argparse

from infersight.flink_jobs.metrics import client_join, core
from infersight.schemas.topics import CLIENT_CALLS, DLQ, LATE, METRICS, PODS, QUALITY_SIGNALS, REQUESTS, WINDOW_STATS
from infersight.schemas.units import MS

JOB = core.JOB
CATCHUP_S = 900.0  # how far behind the watermark a delayed region's window may end and still be its own window
CATCHUP_QUIET_S = 5.0  # a catch-up window fires this long after its last group (normalize commits every 1 s)


def build(env, brokers: str, group_id: str, window_s: float, out_of_orderness_s: float, idle_s: float,
          pricing: core.Pricing, exactly_once: bool = True, max_label_values: str = "",
          label_span_s: float = 3600.0, quiet_s: float = 60.0, state_ttl_s: float = 7200.0,
          requests_topic: str = REQUESTS.name, pods_topic: str = PODS.name,
          window_stats_topic: str = WINDOW_STATS.name, start_ms: int | None = None,
          client_calls_topic: str = CLIENT_CALLS.name, client_timeout_s: float = client_join.DEFAULT_TIMEOUT_S,
          client_tolerance_s: float = client_join.DEFAULT_TOLERANCE_S, catchup_s: float = CATCHUP_S,
          catchup_quiet_s: float = CATCHUP_QUIET_S, quality_signals_topic: str = QUALITY_SIGNALS.name) -> None:
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.serialization import ByteArraySchema
    from pyflink.datastream import OutputTag

    from infersight.flink_jobs.common.cardinality import GAUGE_LABELS, REQUEST_LABELS, limits_of
    from infersight.flink_jobs.common.kafka_io import event_time, kafka_sink, kafka_source
    from infersight.flink_jobs.metrics import functions as F
    from infersight.flink_jobs.metrics.window_stats import window_of_groups

    window_ms = int(window_s * 1000)
    span_ms = int(label_span_s * 1000)
    window_ns = window_ms * MS
    catchup_ms = int(catchup_s * 1000)
    # catch-up windows (a delayed region's backlog within the bound): fired by processing time once quiet; the
    # state remembering fired windows (and the roll-up's merged windows) lasts as long as the bound
    quiet_ms, catchup_ttl_s = (int(catchup_quiet_s * 1000), catchup_s) if catchup_ms > 0 else (0, 0.0)
    # unit cost: a half behind the watermark answers this long after its burst's last; a half waits this long for
    # the other (a source quiet for quiet_s trails the other by about that much: its reader follows the wall clock)
    unit_settle_ms, unit_wait_s = int(catchup_quiet_s * 1000), 2 * quiet_s + window_s

    def pickled():  # fresh type objects too: a used one holds a Java handle
        return Types.PICKLED_BYTE_ARRAY()

    def source(topic: str, name: str):  # per-partition watermarks from the records' Kafka timestamps
        return env.from_source(kafka_source(brokers, topic, f"{group_id}-{name}", start_ms=start_ms),
                               event_time(out_of_orderness_s, idle_s, quiet_s), name)

    # ---- requests: regional windows (on time, or catch-up: a delayed region's), roll-up, cumulative series ----
    late_tag = OutputTag("late", pickled())
    dlq_tag = OutputTag("dlq", Types.STRING())  # what cannot be parsed or validated, as DLQ records
    catchup_tag = OutputTag("catchup", pickled())
    groups = (source(requests_topic, "requests")
              .process(F.PreAggregate(window_ms, OutputTag("late", pickled()), OutputTag("dlq", Types.STRING()),
                                      limits_of(max_label_values, REQUEST_LABELS), span_ms, requests_topic,
                                      catchup_ms),
                       output_type=pickled())
              .name("pre-aggregate"))
    on_time = (groups.key_by(F.first, key_type=Types.STRING())
               .process(F.WindowGroups(window_of_groups, quiet_ms, catchup_ttl_s, OutputTag("late", pickled()),
                                       OutputTag("catchup", pickled())), output_type=pickled())
               .name("regional-windows"))
    catchup = on_time.get_side_output(catchup_tag)  # no event timestamp of their windows: kept out of Flink windows
    regional = on_time.union(catchup)
    rollup = (regional.key_by(F.global_window_key, key_type=Types.STRING())
              .process(F.RollupWindows(catchup_ttl_s), output_type=pickled()).name("global-rollup"))
    def byte_array():
        return Types.PRIMITIVE_ARRAY(Types.BYTE())

    # ---- late records (beyond the catch-up bound, or after their window fired): to their topic, counted, and
    # into the series' running totals ----
    late = groups.get_side_output(late_tag).union(on_time.get_side_output(late_tag))
    late_totals = late.flat_map(F.late_series, output_type=pickled()).name("late-totals")
    series_out = (regional.union(rollup, late_totals).key_by(F.first, key_type=Types.STRING())
                  .process(F.CumulateSeries(window_ns, ttl_s=state_ttl_s), output_type=byte_array())
                  .name("series-metrics"))

    late.flat_map(F.late_json, output_type=Types.STRING()).name("late-json") \
        .sink_to(kafka_sink(brokers, LATE.name, group_id, exactly_once=exactly_once)).name(LATE.name)
    late_out = (late.key_by(F.late_region, key_type=Types.STRING())
                .process(F.CountLate(), output_type=byte_array()).name("late-count"))

    # ---- pods: roll-ups per deployment, region and everywhere, and cost; unit cost joins cost with output tokens ----
    pods = (source(pods_topic, "pods")
            .process(F.PreAggregatePods(window_ms, OutputTag("dlq", Types.STRING()),
                                        limits_of(max_label_values, GAUGE_LABELS), span_ms, pods_topic, catchup_ms),
                     output_type=pickled()).name("parse-pods"))
    pod_on_time = (pods.key_by(F.first, key_type=Types.STRING())
                   .process(F.WindowGroups(core.merged_pod_windows, quiet_ms, catchup_ttl_s,
                                           catchup_tag=OutputTag("catchup", pickled())), output_type=pickled())
                   .name("pod-windows"))
    pod_catchup = pod_on_time.get_side_output(catchup_tag)
    pod_results = (pod_on_time.union(pod_catchup.map(F.catchup_marked, output_type=pickled()))
                   .key_by(F.first, key_type=Types.STRING())
                   .process(F.CumulatePods(window_ns, pricing, state_ttl_s), output_type=pickled()).name("pod-metrics"))
    pod_out = pod_results.filter(F.is_metrics).map(F.third, output_type=byte_array())
    # unit cost joins on-time windows' cost and tokens, either half waiting for the other; a catch-up window's
    # cost and tokens are counted (pod-windows' catchup_windows, late_unit_cost_tokens), never placed in a wrong
    # window
    tokens = on_time.flat_map(F.output_tokens, output_type=pickled())
    costs = pod_results.filter(F.is_cost)
    unit_out = (costs.union(tokens).key_by(F.unit_cost_key, key_type=Types.STRING())
                .process(F.UnitCostWindows(unit_settle_ms, unit_wait_s), output_type=byte_array())
                .name("unit-cost"))
    late_tokens = catchup.process(F.CountLateTokens(), output_type=byte_array()).name("late-unit-cost-tokens")

    # ---- the client's TTFT (issue #22): client and server halves joined per trace, totals per region and model ----
    halves = (env.from_source(kafka_source(brokers, client_calls_topic, f"{group_id}-client-calls", start_ms=start_ms),
                              WatermarkStrategy.no_watermarks(), "client-calls")  # processing time: a join, no windows
              .process(F.ParseClientCalls(OutputTag("dlq", Types.STRING()), client_calls_topic), output_type=pickled())
              .name("parse-client-calls"))
    client_out = (halves.key_by(F.first, key_type=Types.STRING())
                  .process(F.JoinClientCalls(int(client_timeout_s * 1000), int(client_tolerance_s * 1e9)),
                           output_type=pickled()).name("client-join")
                  .key_by(F.first, key_type=Types.STRING())
                  .process(F.CumulateClient(state_ttl_s), output_type=byte_array()).name("client-metrics"))

    # ---- dead letters: every batch or item the job cannot parse or validate, never a crash loop ----
    (groups.get_side_output(dlq_tag).union(pods.get_side_output(OutputTag("dlq", Types.STRING())),
                                           halves.get_side_output(OutputTag("dlq", Types.STRING())))
     .sink_to(kafka_sink(brokers, DLQ.name, group_id, exactly_once=exactly_once)).name(DLQ.name))

    # ---- window stats for the detect job: one record per series (and deployment) and window ----
    # (their Kafka timestamps are the detect job's event time: a catch-up window is stamped with its window's end,
    # as an on-time one is by its event-time timer; no watermarks needed past this point, a sink)
    def stamped(results):
        return results.assign_timestamps_and_watermarks(
            WatermarkStrategy.no_watermarks().with_timestamp_assigner(F.WindowEndStamp()))

    stamped_catchup = stamped(catchup)
    (on_time.union(pod_on_time, stamped_catchup, stamped(pod_catchup))
     .flat_map(F.WindowStatsRecords(window_s), output_type=Types.STRING())
     .name("window-stats").sink_to(kafka_sink(brokers, window_stats_topic, group_id, exactly_once=exactly_once))
     .name(WINDOW_STATS.name))

    # ---- quality signals for the quality job: per regional request series and window, the every-request drift
    # signals' bin counts (so it never reads every request record); stamped as the window stats ----
    (on_time.union(stamped_catchup)
     .flat_map(F.QualitySignalRecords(window_ms), output_type=Types.STRING())
     .name("quality-signals")
     .sink_to(kafka_sink(brokers, quality_signals_topic, group_id, exactly_once=exactly_once))
     .name(QUALITY_SIGNALS.name))

    metrics_sink = kafka_sink(brokers, METRICS.name, group_id, ByteArraySchema(), exactly_once)
    series_out.union(late_out, pod_out, unit_out, client_out, late_tokens).sink_to(metrics_sink).name(METRICS.name)


def main(argv: list[str] | None = None) -> None:
    from infersight.flink_jobs.common.environment import add_jars_option, execution_environment
    from infersight.flink_jobs.common.kafka_io import add_quiet_option, add_start_option

    parser = argparse.ArgumentParser(prog="metrics", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--group-id", default=JOB)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--out-of-orderness-s", type=float, default=3.0,
                        help="how far behind its partition's newest a request's end may be and still make its "
                             "window; it waits in every window's freshness. Pods must export within it: set "
                             "OTEL_BSP_SCHEDULE_DELAY <= 2000 (the SDK's default 5 s makes late records: counted, "
                             "but not in their window's gauges and quantiles) or raise this")
    parser.add_argument("--idle-s", type=float, default=30.0,
                        help="a source partition silent this long is idle (keep it above the checkpoint interval: "
                             "read_committed readers get each transaction's records at once, at checkpoints)")
    parser.add_argument("--catchup-s", type=float, default=CATCHUP_S,
                        help="catch-up bound, default %(default)s s (issue #25 item 3): a request whose window "
                             "ended behind the watermark "
                             "by at most this much (a delayed region's backlog: its link was cut, the other regions "
                             "moved event time on) still counts in its own window, fired --catchup-quiet-s after "
                             "its last records arrive; the regional window, the global roll-up (superseded, see "
                             "infersight.rollup.regions) and the window stats get it. Older ones are late "
                             "(infersight.late, counted). Keep Prometheus' out_of_order_time_window above it. "
                             "0: no catch-up (every record behind the watermark is late)")
    parser.add_argument("--catchup-quiet-s", type=float, default=CATCHUP_QUIET_S,
                        help="a catch-up window fires once no records came for it this long (processing time, "
                             "default %(default)s s); keep "
                             "it above the upstream commit interval (normalize's checkpoints): records arriving "
                             "after it fired are late")
    parser.add_argument("--max-label-values", default="",
                        help="cardinality bound: distinct values a label may take within --label-span-s before "
                             "further ones fold into _OTHER (counted per label in the folded_<label> Flink "
                             "metric); N for every label or label=N,... for region, model, model_version, "
                             "error_type (default 1000 each)")
    parser.add_argument("--label-span-s", type=float, default=3600.0,
                        help="a label value unseen this long frees its place in the bound")
    parser.add_argument("--state-ttl-s", type=float, default=7200.0,
                        help="a series (or deployment) with no window this long loses its running totals (keyed "
                             "state stays bounded); if it comes back its counters start over. 0: never")
    parser.add_argument("--requests-topic", default=REQUESTS.name,
                        help="read request records from this topic (a second pipeline on one cluster, a test)")
    parser.add_argument("--pods-topic", default=PODS.name, help="read pod gauges from this topic")
    parser.add_argument("--window-stats-topic", default=WINDOW_STATS.name,
                        help="write the detectors' window statistics to this topic")
    parser.add_argument("--quality-signals-topic", default=QUALITY_SIGNALS.name,
                        help="write the quality job's every-request drift signals (per series and window) to this "
                             "topic")
    parser.add_argument("--client-calls-topic", default=CLIENT_CALLS.name,
                        help="read the client and server halves of called requests from this topic (issue #22)")
    parser.add_argument("--client-join-timeout-s", type=float, default=client_join.DEFAULT_TIMEOUT_S,
                        help="how long a client or server half waits for its other half (processing time); a client "
                             "call still alone then counts in infersight.client.unmatched. Keyed state holds about "
                             "(called requests per second x this)")
    parser.add_argument("--client-join-tolerance-s", type=float, default=client_join.DEFAULT_TOLERANCE_S,
                        help="clock skew allowed between client and server hosts when a call is joined by time "
                             "(its request span is not the client span's child)")
    parser.add_argument("--pricing", default=None, help="GPU $/hour JSON (default: the packaged pricing.json)")
    parser.add_argument("--checkpoint-s", type=float, default=2.0,
                        help="checkpoint interval: a closed window's metrics reach the sink (a read_committed "
                             "reader) at the next checkpoint, so up to this much is on the freshness path "
                             "(the cluster default is 5 s)")
    add_quiet_option(parser)
    add_start_option(parser)
    add_jars_option(parser)
    args = parser.parse_args(argv)
    env = execution_environment(args.jars)
    env.enable_checkpointing(int(args.checkpoint_s * 1000))
    build(env, args.brokers, args.group_id, args.window_s, args.out_of_orderness_s, args.idle_s,
          core.Pricing.load(args.pricing), max_label_values=args.max_label_values,
          label_span_s=args.label_span_s, quiet_s=args.quiet_s, state_ttl_s=args.state_ttl_s,
          requests_topic=args.requests_topic, pods_topic=args.pods_topic, window_stats_topic=args.window_stats_topic,
          start_ms=args.start_ms, client_calls_topic=args.client_calls_topic,
          client_timeout_s=args.client_join_timeout_s, client_tolerance_s=args.client_join_tolerance_s,
          catchup_s=args.catchup_s, catchup_quiet_s=args.catchup_quiet_s,
          quality_signals_topic=args.quality_signals_topic)
    env.execute(JOB)


if __name__ == "__main__":
    main()
