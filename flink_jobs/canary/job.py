"""The canary job: request records (``infersight.requests``) -> one bake per model and region and per model
overall, starting when the model's canary appears -> a verdict event per look on the compacted
``infersight.rollout.verdicts`` (keyed by rollout: ``model/canary_version/region``), the verdict metrics on
``infersight.metrics`` (to Prometheus through the sink), dead letters on ``infersight.dlq``. Exactly once with
checkpoints: the bakes are keyed state, the sinks are transactional. The verdict sink is declared in SQL
because only the SQL Kafka connector writes a record key from a field (``key.fields``) from Python.

Run: ``python -m infersight.flink_jobs.canary.job --brokers HOST:PORT --jars <connector jar URLs>``."""

from __future__ import annotations

import argparse

from infersight.flink_jobs.canary.core import BakeConfig
from infersight.flink_jobs.canary.reservoir import DEFAULT_CAPACITY
from infersight.flink_jobs.canary.stream import JOB
from infersight.schemas.topics import DLQ, EVALUATIONS, METRICS, REQUESTS, ROLLOUT_VERDICTS


def build(env, brokers: str, group_id: str, config: BakeConfig, out_of_orderness_s: float, idle_s: float,
          quiet_s: float, input_topic: str = REQUESTS.name, verdicts_topic: str = ROLLOUT_VERDICTS.name,
          start_ms: int | None = None, evaluations_topic: str = EVALUATIONS.name):
    """The job's graph on ``env``; returns the statement set that writes the verdicts (attached to ``env``)."""
    from pyflink.common import Types
    from pyflink.common.serialization import ByteArraySchema

    from infersight.flink_jobs.canary import functions as F
    from infersight.flink_jobs.common.kafka_io import event_time, kafka_sink, kafka_source, keyed_sink

    routed = (env.from_source(kafka_source(brokers, input_topic, group_id, start_ms=start_ms),
                              event_time(out_of_orderness_s, idle_s, quiet_s), "requests")
              .flat_map(F.Route(), output_type=Types.PICKLED_BYTE_ARRAY()).name("route"))
    # the judges' results of the sampled requests (quality score, guardrail flags), into the same bakes
    results = (env.from_source(kafka_source(brokers, evaluations_topic, f"{group_id}-evaluations", start_ms=start_ms),
                               event_time(out_of_orderness_s, idle_s, quiet_s), "evaluations")
               .flat_map(F.Route(evaluations=True), output_type=Types.PICKLED_BYTE_ARRAY()).name("route-evaluations"))
    routed = routed.union(results)
    (routed.filter(F.is_tag("dlq")).map(F.second, output_type=Types.STRING()).name("dead-letters")
     .sink_to(kafka_sink(brokers, DLQ.name, group_id)).name(DLQ.name))
    judged = (routed.filter(F.is_tag("records"))
              .map(F.second, output_type=Types.TUPLE([Types.STRING(), Types.PICKLED_BYTE_ARRAY()])).name("records")
              .key_by(F.records_key, key_type=Types.STRING())
              .process(F.Judge(config), output_type=Types.PICKLED_BYTE_ARRAY()).name("judge"))
    (judged.filter(F.is_tag("metrics")).map(F.second, output_type=Types.PRIMITIVE_ARRAY(Types.BYTE()))
     .name("canary-metrics").sink_to(kafka_sink(brokers, METRICS.name, group_id, ByteArraySchema()))
     .name(METRICS.name))
    verdicts = judged.filter(F.is_tag("verdict")).map(
        F.second, output_type=Types.ROW_NAMED(["rollout", "event"], [Types.STRING(), Types.STRING()])).name("verdicts")
    return keyed_sink(env, verdicts, "verdicts_out", brokers, verdicts_topic, group_id, "rollout", "event")


def main(argv: list[str] | None = None) -> None:
    from infersight.flink_jobs.common.environment import add_jars_option, execution_environment
    from infersight.flink_jobs.common.kafka_io import add_quiet_option, add_start_option

    defaults = BakeConfig()
    parser = argparse.ArgumentParser(prog="canary", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--group-id", default=JOB)
    parser.add_argument("--input-topic", default=REQUESTS.name)
    parser.add_argument("--verdicts-topic", default=ROLLOUT_VERDICTS.name)
    parser.add_argument("--evaluations-topic", default=EVALUATIONS.name,
                        help="judge and guardrail results (the quality score and guardrail flags compared)")
    parser.add_argument("--bake-s", type=float, default=defaults.bake_s, help="bake time from the canary's start")
    parser.add_argument("--interval-s", type=float, default=defaults.interval_s, help="time between looks")
    parser.add_argument("--alpha", type=float, default=defaults.alpha,
                        help="false-fail rate over all metrics and looks of a bake")
    parser.add_argument("--reservoir", type=int, default=DEFAULT_CAPACITY, help="values kept per side and metric")
    parser.add_argument("--out-of-orderness-s", type=float, default=5.0)
    parser.add_argument("--idle-s", type=float, default=30.0, help="a source partition silent this long is idle")
    parser.add_argument("--checkpoint-s", type=float, default=5.0, help="checkpoint interval (events' latency)")
    add_quiet_option(parser)
    add_start_option(parser)
    add_jars_option(parser)
    args = parser.parse_args(argv)
    config = BakeConfig(bake_s=args.bake_s, interval_s=args.interval_s, alpha=args.alpha, reservoir=args.reservoir)
    env = execution_environment(args.jars)
    env.enable_checkpointing(int(args.checkpoint_s * 1000))
    build(env, args.brokers, args.group_id, config, args.out_of_orderness_s, args.idle_s, args.quiet_s,
          args.input_topic, args.verdicts_topic, start_ms=args.start_ms, evaluations_topic=args.evaluations_topic)
    env.execute(JOB)


if __name__ == "__main__":
    main()
