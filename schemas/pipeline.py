"""What the Flink jobs emit: the windowed metric names and labels, and how pod gauges roll up per region.

Prometheus names follow from the OTLP names by the remote-write translation (dots to underscores, unit
suffix, ``_total`` on counters): ``gen_ai.server.time_to_first_token`` (s, histogram) becomes
``gen_ai_server_time_to_first_token_seconds_bucket``; ``infersight.requests`` becomes
``infersight_requests_total``. Labels are the window key below and nothing per request or tenant.
"""

from __future__ import annotations

from typing import NamedTuple

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
LABEL_STAT = "stat"  # sum, mean, max of a pod gauge over a region's pods
LABEL_GPU_TYPE = "gpu_type"

# --- cumulative counters (monotonic OTLP sums, one point per window end) ---
REQUESTS = "infersight.requests"
ERRORS = "infersight.request.errors"
TOKENS = "infersight.tokens"
LATE_RECORDS = "infersight.late.records"
# --- per-window gauges ---
WINDOW_REQUESTS = "infersight.window.requests"
WINDOW_ERROR_RATIO = "infersight.window.error.ratio"
WINDOW_QUANTILE_SUFFIX = ".quantile"  # e.g. gen_ai.server.time_to_first_token.quantile{quantile="0.99"}
QUANTILES = (0.5, 0.9, 0.99)
SKETCH_RELATIVE_ACCURACY = 0.005  # DDSketch: every quantile within 0.5 % of the exact value
# --- cost (per region, per window) ---
GPU_SECONDS = "infersight.cost.gpu.seconds"            # counter
COST_USD = "infersight.cost.usd"                       # counter
IDLE_COST_USD = "infersight.cost.idle.usd"             # counter: cost x (1 - GPU utilisation)
USD_PER_1M_OUTPUT_TOKENS = "infersight.cost.usd_per_1m_output_tokens"  # gauge per window

# The latency distributions of a window: record field -> (OTLP histogram name, bucket boundaries).
# Each is exported as a cumulative histogram with the semconv / our bounds and as sketch quantiles.
DISTRIBUTIONS: dict[str, tuple[str, tuple[float, ...]]] = {
    "ttft_s": (M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, M.TTFT_BUCKETS),
    "tpot_s": (M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, M.TPOT_BUCKETS),
    "itl_p99_s": (M.ITL_P99_METRIC, M.ITL_BUCKETS),
    "e2e_s": (M.GEN_AI_SERVER_REQUEST_DURATION, M.REQUEST_DURATION_BUCKETS),
    "queue_s": (M.QUEUE_TIME_METRIC, M.QUEUE_BUCKETS),
}

# Pod gauges -> how a region's value is formed from its pods' values in a window (each pod's last
# value first). Additive quantities are summed; fractions are averaged (a sum of fractions means
# nothing) and their max shows the hottest pod; sizes per pod are averaged with a max.
POD_GAUGE_STATS: dict[str, tuple[str, ...]] = {
    M.QUEUE_DEPTH: ("sum", "max"),
    M.REQUESTS_RUNNING: ("sum", "max"),
    M.KV_CACHE_USAGE: ("mean", "max"),
    M.BATCH_SIZE: ("mean", "max"),
    M.HW_GPU_UTILIZATION: ("mean", "min", "max"),
    M.HW_GPU_MEMORY_USAGE: ("sum", "max"),
    M.HW_GPU_MEMORY_LIMIT: ("sum",),
    M.HW_GPU_MEMORY_UTILIZATION: ("mean", "max"),
}
# Engines' own spellings, read from pods that export them (e.g. a collector scraping vLLM's /metrics).
POD_GAUGE_ALIASES: dict[str, str] = {
    M.VLLM_NUM_WAITING: M.QUEUE_DEPTH,
    M.VLLM_NUM_RUNNING: M.REQUESTS_RUNNING,
    M.VLLM_KV_CACHE_USAGE: M.KV_CACHE_USAGE,
    M.TRITON_GPU_UTILIZATION: M.HW_GPU_UTILIZATION,
}
REGION_GAUGE_PREFIX = "infersight.region."  # infersight.region.<gauge name>{stat=...}

# --- resource attributes a pod sets for cost (no convention exists for a pod's GPU type/count) ---
GPU_TYPE_ATTRIBUTE = "infersight.gpu.type"
GPU_COUNT_ATTRIBUTE = "infersight.gpu.count"


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
OUTPUTS: tuple[MetricOutput, ...] = (
    MetricOutput(REQUESTS, "counter", "{request}", _KEY,
                 "Requests ended, cumulative per series (region=\"global\": the roll-up)."),
    MetricOutput(ERRORS, "counter", "{request}", f"{_KEY}, {LABEL_ERROR_TYPE}",
                 "Failed requests by error.type, cumulative."),
    MetricOutput(TOKENS, "counter", "{token}", f"{_KEY}, {LABEL_TOKEN_TYPE}",
                 "Input, output and cached (prefix-hit) tokens, cumulative."),
    *(MetricOutput(name, "histogram", "s", _KEY, f"From the records' {field}; bounds as the instrument's.")
      for field, (name, _b) in DISTRIBUTIONS.items()),
    *(MetricOutput(name + WINDOW_QUANTILE_SUFFIX, "gauge", "s", f"{_KEY}, {LABEL_QUANTILE}",
                   f"p50/p90/p99 of {field} in the window, from a merged DDSketch "
                   f"({SKETCH_RELATIVE_ACCURACY:.1%} relative accuracy).", per_window=True)
      for field, (name, _b) in DISTRIBUTIONS.items()),
    MetricOutput(WINDOW_REQUESTS, "gauge", "{request}", _KEY, "Requests that ended in the window.", per_window=True),
    MetricOutput(WINDOW_ERROR_RATIO, "gauge", "1", _KEY, "Failed / all requests in the window.", per_window=True),
    *(MetricOutput(REGION_GAUGE_PREFIX + gauge, "gauge", "", f"{LABEL_REGION}, {LABEL_STAT}",
                   f"Pods' last values rolled up per region: {', '.join(stats)}.", per_window=True)
      for gauge, stats in POD_GAUGE_STATS.items()),
    MetricOutput(GPU_SECONDS, "counter", "s", LABEL_REGION,
                 "GPU-seconds paid for (GPUs of every pod seen x window length)."),
    MetricOutput(COST_USD, "counter", "", LABEL_REGION, "GPU cost in USD from the pricing file."),
    MetricOutput(IDLE_COST_USD, "counter", "", LABEL_REGION, "Cost x (1 - mean GPU utilisation): paid for, not used."),
    MetricOutput(USD_PER_1M_OUTPUT_TOKENS, "gauge", "", LABEL_REGION, "Window cost / output tokens x 1e6.",
                 per_window=True),
    MetricOutput(LATE_RECORDS, "counter", "{request}", LABEL_REGION,
                 "Records that missed their window (they go to infersight.late)."),
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
