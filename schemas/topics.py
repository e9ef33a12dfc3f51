"""Every Kafka topic of the pipeline: name, payload, partitions and retention.

Partition counts follow the parallelism the jobs can use on one node (a production
cluster raises them; keys keep per-trace / per-series order either way). Retention is
set per topic on purpose: raw OTLP is replayable for a day, derived streams for a week,
the dead-letter topic for two weeks so nobody loses bad input before reading it.
"""

from __future__ import annotations

from dataclasses import dataclass

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True)
class Topic:
    name: str
    payload: str
    key: str
    partitions: int
    retention_ms: int
    producer: str
    description: str
    # "compact" keeps the newest record per key (a state topic read from its start, like the verdicts)
    cleanup_policy: str = "delete"

    def config(self) -> dict[str, str]:
        return {
            "retention.ms": str(self.retention_ms),
            "cleanup.policy": self.cleanup_policy,
            "compression.type": "producer",
        }


OTLP_SPANS = Topic(
    "infersight.otlp.spans", "OTLP ExportTraceServiceRequest (protobuf)", "trace id",
    partitions=3, retention_ms=DAY_MS, producer="regional otelcol gateways",
    description="Every span from every region, region stamped as resource cloud.region.",
)
OTLP_REQUESTS = Topic(
    "infersight.otlp.requests", "OTLP ExportTraceServiceRequest (protobuf), request-level spans only",
    "none (one record per gateway batch)", partitions=3, retention_ms=DAY_MS, producer="regional otelcol gateways",
    description="Only the spans that describe a whole request (our root span, vLLM's llm_request, "
                "Triton's request spans): what the normalize job reads. See docs/architecture.md for why.",
)
OTLP_METRICS = Topic(
    "infersight.otlp.metrics", "OTLP ExportMetricsServiceRequest (protobuf)", "none",
    partitions=3, retention_ms=DAY_MS, producer="regional otelcol gateways",
    description="Pod metrics (queue depth, KV-cache use, GPU gauges) from every region.",
)
REQUESTS = Topic(
    "infersight.requests", "JSON array of per-request records", "none",
    partitions=3, retention_ms=7 * DAY_MS, producer="flink normalize job",
    description="The normalised records of one OTLP export per message (a batch: PyFlink pays per "
                "element, not per request); the message timestamp is the batch's latest request end. "
                "Read with schemas.records.parse_batch.",
)
PODS = Topic(
    "infersight.pods", "JSON array of per-pod gauge records", "none",
    partitions=1, retention_ms=7 * DAY_MS, producer="flink normalize job",
    description="The pod gauge data points (queue depth, KV-cache use, GPU gauges) of one OTLP export per "
                "message; the message timestamp is the batch's latest point. Read with "
                "schemas.records.parse_batch.",
)
METRICS = Topic(
    "infersight.metrics", "OTLP ExportMetricsServiceRequest (protobuf)", "none",
    partitions=1, retention_ms=7 * DAY_MS, producer="flink metrics job",
    description="Windowed metrics; the sink collector writes them to Prometheus.",
)
DLQ = Topic(
    "infersight.dlq", "dead-letter record (JSON, schemas.deadletter: reason, job, source topic/partition/offset, "
                      "raw bytes capped with their size and SHA-256)",
    "none", partitions=1, retention_ms=14 * DAY_MS, producer="every flink job",
    description="Telemetry that could not be decoded or broke the contract, with the reason.",
)
LATE = Topic(
    "infersight.late", "per-request record (JSON)", "none",
    partitions=1, retention_ms=7 * DAY_MS, producer="flink metrics job",
    description="Records that arrived after their window closed; counted, never dropped.",
)
ANOMALIES = Topic(
    "infersight.anomalies", "anomaly event (JSON)", "series",
    partitions=1, retention_ms=7 * DAY_MS, producer="flink detect job",
    description="Regional and cross-region anomaly events.",
)
QUALITY = Topic(
    "infersight.quality", "quality/drift event (JSON)", "model",
    partitions=1, retention_ms=7 * DAY_MS, producer="flink quality job",
    description="Quality scores and drift events against a baseline.",
)
ROLLOUT_VERDICTS = Topic(
    "infersight.rollout.verdicts", "canary verdict event (JSON, schemas.canary)",
    "rollout: model/canary_version/region (schemas.canary.rollout_id)",
    partitions=1, retention_ms=7 * DAY_MS, producer="flink canary job",
    description="Canary-vs-stable verdicts, the latest per rollout kept (compacted): the verdict service "
                "rebuilds its state from it.",
    cleanup_policy="compact",
)

WINDOW_STATS = Topic(
    "infersight.window_stats", "window-stats row (JSON, schemas.detection: window_end, region, model, track, "
                               "signal, value)", "series (region/model/track)",
    partitions=3, retention_ms=7 * DAY_MS, producer="flink metrics job",
    description="One value per series, signal and 10 s window: what the detect job reads (never OTLP).",
)

QUALITY_SIGNALS = Topic(
    "infersight.quality_signals", "quality-signals record (JSON, schemas.quality_signals: window_end_ms, window_ms, "
                                  "series, requests, per signal its bin counts)", "none",
    partitions=3, retention_ms=7 * DAY_MS, producer="flink metrics job",
    description="Per request series and 10 s window, the every-request drift signals (lengths, TTFT, finish "
                "reasons, error types) as bin counts: what the quality job reads instead of every request record.",
)

EVALUATIONS = Topic(
    "infersight.evaluations", "JSON array of evaluation records (schemas.evaluation)", "none",
    partitions=1, retention_ms=7 * DAY_MS, producer="flink normalize job",
    description="The judge and guardrail results of one OTLP export per message, each keyed to its request by "
                "trace and span id and carrying its sample rate; the message timestamp is the latest result's "
                "time. Read with schemas.records.parse_batch.",
)

CLIENT_CALLS = Topic(
    "infersight.client_calls", "JSON array of client-call records (schemas.client_calls)", "none",
    partitions=1, retention_ms=7 * DAY_MS, producer="flink normalize job",
    description="Both ends of a request (issue #22): a client half per CLIENT span carrying infersight.client.ttft, "
                "a server half per request record whose span has a parent; the metrics job joins them by trace. "
                "Read with schemas.records.parse_batch.",
)

GATEWAY_BEACONS = Topic(
    "infersight.otlp.beacons", "OTLP ExportMetricsServiceRequest (protobuf): a gateway's own telemetry", "none",
    partitions=1, retention_ms=DAY_MS, producer="regional otelcol gateways (their internal telemetry, periodically)",
    description="Each gateway's own counters every few seconds (spans and points received and exported, queue "
                "size, uptime): written into the regional Kafka and mirrored like the rest, they tell the global "
                "side whether a silent region is delayed or down (schemas.region_status).",
)
REGION_STATUS = Topic(
    "infersight.region_status", "region status (JSON, schemas.region_status)", "region",
    partitions=1, retention_ms=7 * DAY_MS, producer="region status service",
    description="Per region: ok, link_delayed, gateways_down or no_traffic, with the link lag and backlog; the "
                "latest per region kept (compacted), a record on every change and a refresh every few seconds.",
    cleanup_policy="compact",
)

ALL_TOPICS: tuple[Topic, ...] = (
    OTLP_SPANS, OTLP_REQUESTS, OTLP_METRICS, REQUESTS, PODS, METRICS, DLQ, LATE, ANOMALIES, QUALITY, ROLLOUT_VERDICTS,
    WINDOW_STATS, QUALITY_SIGNALS, EVALUATIONS, CLIENT_CALLS, GATEWAY_BEACONS, REGION_STATUS,
)
