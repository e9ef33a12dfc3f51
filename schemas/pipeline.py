"""What the Flink jobs emit: the windowed metric names and labels, and how pod gauges and cost roll up per
deployment (region, model, model version, track), per region and globally.

Prometheus names follow from the OTLP names by the remote-write translation (dots to underscores, unit
suffix, ``_total`` on counters): ``gen_ai.server.time_to_first_token`` (s, histogram) becomes
``gen_ai_server_time_to_first_token_seconds_bucket``; ``infersight.requests`` becomes
``infersight_requests_total``. Labels are the window key below and nothing per request or tenant.
"""

from __future__ import annotations

from typing import NamedTuple

from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas.prometheus import prometheus_name

# --- window key (metric labels), in key order ---
LABEL_REGION = "region"
LABEL_MODEL = "model"
LABEL_MODEL_VERSION = "model_version"
LABEL_TRACK = "track"
LABEL_ENGINE = "engine"
SERIES_LABELS = (LABEL_REGION, LABEL_MODEL, LABEL_MODEL_VERSION, LABEL_TRACK, LABEL_ENGINE)
GLOBAL_REGION = "global"  # the region label of the roll-up over regions
# The regions the local stack runs a gateway for and the simulated fleet serves from (any names work).
DEFAULT_REGIONS: tuple[str, ...] = ("us-east-1", "eu-west-1", "ap-southeast-1")
LABEL_ERROR_TYPE = "error_type"
LABEL_TOKEN_TYPE = "token_type"  # input, output, cached
LABEL_QUANTILE = "quantile"
LABEL_STAT = "stat"  # sum, mean, min, max of a pod gauge over the pods of a deployment, region or all
LABEL_GPU_TYPE = "gpu_type"
LABEL_SIGNAL = "signal"  # the detect job's window-stats signal (schemas.detection.SIGNALS); the quality job's drift
# signal (schemas.quality.DRIFT_SIGNALS)
LABEL_SCOPE_KIND = "scope_kind"  # series, model_region, region, multi_region, global
LABEL_KIND = "kind"  # an incident's kind (schemas.detection.INCIDENT_KINDS)
LABEL_EVALUATOR = "evaluator"  # the quality job's: gen_ai.evaluation.name (schemas.quality names ours)
LABEL_DISTANCE = "distance"  # the quality job's: kl, js, wasserstein, psi (schemas.quality.DISTANCES)
# --- pods' gauges and cost: keyed by deployment, and rolled up ---
# A deployment is a model version on a track in a region (the request series' key without the engine).
# Roll-ups: region="global" over regions, and model=model_version=track="all" over every deployment, so
# each window has four levels: a deployment, a region (all deployments), a deployment everywhere, everything.
DEPLOYMENT_LABELS = (LABEL_REGION, LABEL_MODEL, LABEL_MODEL_VERSION, LABEL_TRACK)
ALL_DEPLOYMENTS = "all"  # the model, model_version and track of a roll-up over every deployment
# Cardinality: past a label's bound on distinct values per time span, a value is folded into this one (the jobs'
# counterpart of the OpenTelemetry SDK's overflow series, whose attribute is ``otel.metric.overflow=true``).
OVERFLOW_VALUE = "_OTHER"
OVERFLOW_ATTRIBUTE = "otel.metric.overflow"

# --- cumulative counters (monotonic OTLP sums, one point per window end) ---
REQUESTS = "infersight.requests"
ERRORS = "infersight.request.errors"
TOKENS = "infersight.tokens"
LATE_RECORDS = "infersight.late.records"
# the detect job's
ANOMALY_SCORE = "infersight.detect.anomaly.score"  # gauge per window, while an anomaly lasts
ANOMALIES = "infersight.detect.anomalies"  # counter of onsets
OPEN_INCIDENTS = "infersight.detect.incidents.open"  # gauge per window
HELD_SERIES = "infersight.detect.notices.series"  # gauge per window: series held quiet under an open notice
# the quality job's (docs/quality.md), gauges per window and series (a deployment: region, model, version, track)
QUALITY_SCORE = "infersight.quality.score"  # weighted mean score per evaluator (guardrails: the flag rate)
QUALITY_SCORE_CI_LOW = "infersight.quality.score.ci_low"  # its 95 % interval's bounds
QUALITY_SCORE_CI_HIGH = "infersight.quality.score.ci_high"
QUALITY_PASS_RATIO = "infersight.quality.pass.ratio"  # scored evaluators: weighted share passing
QUALITY_FLAG_RATIO = "infersight.quality.flag.ratio"  # guardrails: weighted share flagged
QUALITY_SAMPLES = "infersight.quality.samples"  # judged samples behind the estimates (raw, unweighted)
QUALITY_COMPOSITE = "infersight.quality.composite"  # the composite quality score, 1 best
DRIFT_DISTANCE = "infersight.quality.drift.distance"  # per drift signal and distance: current vs baseline
DRIFT_ALARM = "infersight.quality.drift.alarm"  # per drift signal: 1 while its alarm is open
SCORE_UNIT, SAMPLES_UNIT, DISTANCE_UNIT, ALARM_UNIT = "{score}", "{evaluation}", "{distance}", "{bool}"
# --- per-window gauges ---
WINDOW_REQUESTS = "infersight.window.requests"
WINDOW_ERROR_RATIO = "infersight.window.error.ratio"
ROLLUP_REGIONS = "infersight.rollup.regions"
WINDOW_QUANTILE_SUFFIX = ".quantile"  # e.g. gen_ai.server.time_to_first_token.quantile{quantile="0.99"}
QUANTILES = (0.5, 0.9, 0.99)
SKETCH_RELATIVE_ACCURACY = 0.005  # DDSketch: every quantile within 0.5 % of the exact value
# The latency histograms are also written as OTLP exponential histograms, Prometheus native histograms under
# the histogram's name (no _bucket suffix): base 2**(2**-6), buckets 1.09 % wide, so histogram_quantile over
# any range is within ~1 % of exact (the semconv buckets jump from 0.1 to 0.25 s: a p99 70 % off).
EXPONENTIAL_SCALE = 6
# --- cost (per deployment and its roll-ups, per window) ---
GPU_SECONDS = "infersight.cost.gpu.time"               # counter, s: GPU-seconds paid for
COST_USD = "infersight.cost.usd"                       # counter
IDLE_COST_USD = "infersight.cost.idle.usd"             # counter: each pod's cost x (1 - its GPU utilisation)
USD_PER_1M_OUTPUT_TOKENS = "infersight.cost.usd_per_1m_output_tokens"  # gauge per window
# --- the client's view (issue #22): client and server halves of a request joined by trace ---
CLIENT_TTFT = M.CLIENT_TTFT_METRIC  # histogram per region and model (the server record's), the clients' own values
CLIENT_OUTSIDE_SERVER = "infersight.client.time_to_first_token.outside_server"  # client TTFT - the record's TTFT
CLIENT_UNMATCHED = "infersight.client.unmatched"  # counter per model: client calls with no request record joined
USD = "{USD}"  # the unit of the cost metrics (UCUM has no currency: an annotation; the name says USD)

# The latency distributions of a window: record field -> (OTLP histogram name, bucket boundaries).
# Each is exported as a cumulative histogram with the semconv / our bounds and as sketch quantiles.
DISTRIBUTIONS: dict[str, tuple[str, tuple[float, ...]]] = {
    "ttft_s": (M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, M.TTFT_BUCKETS),
    "tpot_s": (M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, M.TPOT_BUCKETS),
    "itl_p99_s": (M.ITL_P99_METRIC, M.ITL_BUCKETS),
    "e2e_s": (M.GEN_AI_SERVER_REQUEST_DURATION, M.REQUEST_DURATION_BUCKETS),
    "queue_s": (M.QUEUE_TIME_METRIC, M.QUEUE_BUCKETS),
}



class PodGauge(NamedTuple):
    """How a pod gauge rolls up: the output's OTLP name and unit, and the stats over the pods' values."""

    name: str
    unit: str
    stats: tuple[str, ...]


# Pod gauges -> their roll-up over the pods of a deployment (or region, or everything) in a window (each
# pod's last value first). Additive quantities are summed; fractions are averaged (a sum of fractions
# means nothing) and their max shows the hottest pod; sizes per pod are averaged with a max. Output names
# are ``infersight.pods.<what>`` in the pod metric's unit (Prometheus: ``infersight_pods_queue_depth``,
# ``infersight_pods_kv_cache_usage_ratio``, ``infersight_pods_gpu_memory_usage_bytes``).
POD_GAUGES: dict[str, PodGauge] = {
    M.QUEUE_DEPTH: PodGauge("infersight.pods.queue.depth", "{request}", ("sum", "max")),
    M.REQUESTS_RUNNING: PodGauge("infersight.pods.requests.running", "{request}", ("sum", "max")),
    M.KV_CACHE_USAGE: PodGauge("infersight.pods.kv_cache.usage", "1", ("mean", "max")),
    M.BATCH_SIZE: PodGauge("infersight.pods.batch.size", "{request}", ("mean", "max")),
    M.HW_GPU_UTILIZATION: PodGauge("infersight.pods.gpu.utilization", "1", ("mean", "min", "max")),
    M.HW_GPU_MEMORY_USAGE: PodGauge("infersight.pods.gpu.memory.usage", "By", ("sum", "max")),
    M.HW_GPU_MEMORY_LIMIT: PodGauge("infersight.pods.gpu.memory.limit", "By", ("sum",)),
    M.HW_GPU_MEMORY_UTILIZATION: PodGauge("infersight.pods.gpu.memory.utilization", "1", ("mean", "max")),
}
POD_GAUGE_STATS: dict[str, tuple[str, ...]] = {metric: gauge.stats for metric, gauge in POD_GAUGES.items()}
# Engines' own spellings, read from pods that export them (e.g. a collector scraping vLLM's /metrics).
POD_GAUGE_ALIASES: dict[str, str] = {
    M.VLLM_NUM_WAITING: M.QUEUE_DEPTH,
    M.VLLM_NUM_RUNNING: M.REQUESTS_RUNNING,
    M.VLLM_KV_CACHE_USAGE: M.KV_CACHE_USAGE,
    M.TRITON_GPU_UTILIZATION: M.HW_GPU_UTILIZATION,
}

# --- resource attributes a pod sets for cost (no convention exists for a pod's GPU type/count) ---
GPU_TYPE_ATTRIBUTE = "infersight.gpu.type"
GPU_COUNT_ATTRIBUTE = "infersight.gpu.count"
# The model a pod serves, for its gauges' deployment key: this attribute on the pod's resource (no resource
# convention exists for it; "" when unset); its model version and track are the resource's
# ``infersight.model.version`` and ``infersight.deployment.track``, as for its requests.
POD_MODEL_ATTRIBUTE = A.GEN_AI_REQUEST_MODEL


# --- the metrics job's output, as documented (docs/telemetry-reference.md is generated from this) ---
class MetricOutput(NamedTuple):
    """One metric the metrics job writes: OTLP name, kind (``prometheus.KINDS``), UCUM unit, labels, meaning."""

    name: str
    kind: str
    unit: str
    labels: str
    meaning: str
    per_window: bool = False  # a gauge per window (else cumulative since the series started)

    @property
    def prometheus(self) -> str:
        """The name Prometheus stores it under (a histogram's series add ``_bucket``/``_sum``/``_count``)."""
        return prometheus_name(self.name, self.unit, self.kind)


_KEY = ", ".join(SERIES_LABELS)
_DEPLOYMENT = ", ".join(DEPLOYMENT_LABELS)
_EVALUATOR = f"{', '.join(DEPLOYMENT_LABELS)}, {LABEL_EVALUATOR}"
_LEVELS = (f"per deployment, with roll-ups region=\"{GLOBAL_REGION}\" and "
           f"model=model_version=track=\"{ALL_DEPLOYMENTS}\"")
OUTPUTS: tuple[MetricOutput, ...] = (
    MetricOutput(REQUESTS, "counter", "{request}", _KEY,
                 "Requests ended, cumulative per series (region=\"global\": the roll-up)."),
    MetricOutput(ERRORS, "counter", "{request}", f"{_KEY}, {LABEL_ERROR_TYPE}",
                 "Failed requests by error.type, cumulative."),
    MetricOutput(TOKENS, "counter", "{token}", f"{_KEY}, {LABEL_TOKEN_TYPE}",
                 "Input, output and cached (prefix-hit) tokens, cumulative."),
    *(MetricOutput(name, "histogram", "s", _KEY,
                   f"From the records' {field}: classic buckets as the instrument's (_bucket, _sum, _count) "
                   f"and a native histogram at scale {EXPONENTIAL_SCALE} under the bare name.")
      for field, (name, _b) in DISTRIBUTIONS.items()),
    *(MetricOutput(name + WINDOW_QUANTILE_SUFFIX, "gauge", "s", f"{_KEY}, {LABEL_QUANTILE}",
                   f"p50/p90/p99 of {field} in the window, from a merged DDSketch "
                   f"({SKETCH_RELATIVE_ACCURACY:.1%} relative accuracy).", per_window=True)
      for field, (name, _b) in DISTRIBUTIONS.items()),
    MetricOutput(WINDOW_REQUESTS, "gauge", "{request}", _KEY, "Requests that ended in the window.", per_window=True),
    MetricOutput(WINDOW_ERROR_RATIO, "gauge", "1", _KEY, "Failed / all requests in the window.", per_window=True),
    MetricOutput(ROLLUP_REGIONS, "gauge", "{region}", _KEY,
                 f"region=\"{GLOBAL_REGION}\" only: how many regions' windows the roll-up's window merged. Fewer "
                 "than the regions serving: partial (a region delayed); its result arriving later supersedes the "
                 "window's gauges 1 ms after the window's end (then 2 ms...), with the merged count.",
                 per_window=True),
    *(MetricOutput(gauge.name, "gauge", gauge.unit, f"{_DEPLOYMENT}, {LABEL_STAT}",
                   f"{metric}: the pods' last values in the window, {', '.join(gauge.stats)}; {_LEVELS}.",
                   per_window=True)
      for metric, gauge in POD_GAUGES.items()),
    MetricOutput(GPU_SECONDS, "counter", "s", _DEPLOYMENT,
                 f"GPU-seconds paid for (GPUs of every pod seen x window length); {_LEVELS}."),
    MetricOutput(COST_USD, "counter", USD, _DEPLOYMENT, f"GPU cost in USD from the pricing file; {_LEVELS}."),
    MetricOutput(IDLE_COST_USD, "counter", USD, _DEPLOYMENT,
                 f"Each pod's cost x (1 - its mean GPU utilisation): paid for, not used; {_LEVELS}."),
    MetricOutput(USD_PER_1M_OUTPUT_TOKENS, "gauge", USD, _DEPLOYMENT,
                 f"Window cost / output tokens x 1e6; {_LEVELS}.", per_window=True),
    MetricOutput(CLIENT_TTFT, "histogram", "s", f"{LABEL_REGION}, {LABEL_MODEL}",
                 "The clients' own TTFT (infersight.client.ttft on the CLIENT span), each call joined by trace with "
                 "the request record it called, under that record's region and model; TTFT buckets, classic and "
                 "native, cumulative."),
    MetricOutput(CLIENT_OUTSIDE_SERVER, "histogram", "s", f"{LABEL_REGION}, {LABEL_MODEL}",
                 "Per joined call, client TTFT - the record's TTFT (the edge TTFT with the vLLM plugin): the "
                 "network both ways and what happens before the app; TTFT buckets, classic and native."),
    MetricOutput(CLIENT_UNMATCHED, "counter", "{call}", LABEL_MODEL,
                 "Client calls with no request record of their trace within the join's timeout (model: the "
                 "client's requested model); never published under a region."),
    MetricOutput(LATE_RECORDS, "counter", "{request}", LABEL_REGION,
                 "Records that missed their window (they go to infersight.late)."),
    # the detect job's (docs/detection.md)
    MetricOutput(ANOMALY_SCORE, "gauge", "1", f"{LABEL_REGION}, {LABEL_MODEL}, {LABEL_TRACK}, {LABEL_SIGNAL}",
                 "The detect job: the peak score of each anomaly while it lasts (track: track@version).",
                 per_window=True),
    MetricOutput(ANOMALIES, "counter", "{anomaly}", f"{LABEL_REGION}, {LABEL_MODEL}, {LABEL_SIGNAL}",
                 "The detect job: anomaly onsets, cumulative (signal=\"silent\": a series that stopped)."),
    MetricOutput(OPEN_INCIDENTS, "gauge", "{incident}", f"{LABEL_SCOPE_KIND}, {LABEL_KIND}",
                 "The detect job: incidents open at the window's end, by scope and kind.", per_window=True),
    MetricOutput(HELD_SERIES, "gauge", "{series}", f"{LABEL_REGION}, {LABEL_KIND}",
                 "The detect job: series of a region silent at the window's end whose silence its region status "
                 "explains (an open notice, kind delayed or no_traffic: not paged); 0 once they resumed.",
                 per_window=True),
    # the quality job's (docs/quality.md): per window (--window-s) and deployment, estimates weighted by 1/sample rate
    MetricOutput(QUALITY_SCORE, "gauge", SCORE_UNIT, _EVALUATOR,
                 "The quality job: weighted mean score of the evaluator in the window (0..1; a guardrail's is its "
                 "flag rate).", per_window=True),
    MetricOutput(QUALITY_SCORE_CI_LOW, "gauge", SCORE_UNIT, _EVALUATOR,
                 "The quality job: lower bound of the weighted mean's 95 % Student-t interval (two samples or "
                 "more).", per_window=True),
    MetricOutput(QUALITY_SCORE_CI_HIGH, "gauge", SCORE_UNIT, _EVALUATOR,
                 "The quality job: upper bound of the weighted mean's 95 % interval.", per_window=True),
    MetricOutput(QUALITY_PASS_RATIO, "gauge", "1", _EVALUATOR,
                 "The quality job: weighted share of judged answers passing (score >= 0.5; <= 0.5 where lower is "
                 "better); scored evaluators only.", per_window=True),
    MetricOutput(QUALITY_FLAG_RATIO, "gauge", "1", _EVALUATOR,
                 "The quality job: weighted share of answers a guardrail flagged; guardrails only.", per_window=True),
    MetricOutput(QUALITY_SAMPLES, "gauge", SAMPLES_UNIT, _EVALUATOR,
                 "The quality job: judged results behind the window's estimates (raw count, not weighted).",
                 per_window=True),
    MetricOutput(QUALITY_COMPOSITE, "gauge", SCORE_UNIT, _DEPLOYMENT,
                 "The quality job: composite quality score (0..1, 1 best) of the evaluators present in the window.",
                 per_window=True),
    MetricOutput(DRIFT_DISTANCE, "gauge", DISTANCE_UNIT, f"{_DEPLOYMENT}, {LABEL_SIGNAL}, {LABEL_DISTANCE}",
                 "The quality job: distance of a drift signal's current window set from its baseline (kl and psi "
                 "in nats, js and the normalised wasserstein in 0..1).", per_window=True),
    MetricOutput(DRIFT_ALARM, "gauge", ALARM_UNIT, f"{_DEPLOYMENT}, {LABEL_SIGNAL}",
                 "The quality job: 1 while the drift signal's alarm is open, else 0 (signals measured in the "
                 "window).", per_window=True),
)
_BY_NAME = {o.name: o for o in OUTPUTS}


def output(name: str) -> MetricOutput:
    """The documented output of that OTLP name (KeyError names it when the metrics job writes no such metric)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a metric the metrics job writes (see schemas.pipeline.OUTPUTS)") from None


def prom(name: str) -> str:
    """The Prometheus name of a metrics-job output, for queries (``prom(REQUESTS)``: ``infersight_requests_total``)."""
    return output(name).prometheus
