"""The TTFT benchmark's real-pipeline side (``bench/ttft_truth.py --pipeline stack``): what a regional gateway
delivered to Kafka, the client TTFT per joined call from the pipeline's records, and the client TTFT quantiles
Prometheus answers.

- ``KafkaTap``: a consumer thread on the gateway's topics (``infersight.otlp.spans``: every span, for the edge and
  engine TTFT and the order check; ``infersight.otlp.metrics``: the loop-lag histogram) and on normalize's
  ``infersight.client_calls`` (the client and server halves of called requests), ``read_committed``.
- ``joined_client_ttfts``: those halves joined per trace with the metrics job's own pure join
  (``flink_jobs/metrics/client_join.py: add``, the server span's parent is the client span): per joined call, the
  client TTFT exactly as the pipeline carries it, under the server record's region and model.
- ``prometheus_quantile``: ``histogram_quantile`` over the metrics job's native histogram
  ``infersight_client_time_to_first_token_seconds{region, model}``. Its series are cumulative per (region, model)
  since the job started, so a model served for one pass only holds exactly that pass's calls.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from infersight.flink_jobs.metrics import client_join
from infersight.schemas import client_calls as C
from infersight.schemas import pipeline as P
from infersight.schemas.topics import CLIENT_CALLS, OTLP_METRICS, OTLP_SPANS

CLIENT_TTFT_SERIES = P.prom(P.CLIENT_TTFT)  # the native histogram under the bare name


class KafkaTap:
    """Every message of the gateway's span and metric topics and of ``infersight.client_calls`` from the start,
    kept in arrival order: ``kept`` (OTLP trace payloads, bytes), ``kept_metrics`` (parsed metric exports),
    ``client_calls`` (JSON batches). Lists only grow; readers take copies."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.kept: list[bytes] = []
        self.kept_metrics: list[Any] = []
        self.client_calls: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-tap", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> KafkaTap:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        from confluent_kafka import Consumer
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"ttft-truth-{uuid.uuid4().hex}",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "isolation.level": "read_committed"})
        consumer.subscribe([OTLP_SPANS.name, OTLP_METRICS.name, CLIENT_CALLS.name])
        try:
            while not self._stop.is_set():
                msg = consumer.poll(0.5)
                if msg is None or msg.error():
                    continue
                topic, value = msg.topic(), msg.value()
                if topic == OTLP_SPANS.name:
                    self.kept.append(value)
                elif topic == OTLP_METRICS.name:
                    self.kept_metrics.append(ExportMetricsServiceRequest.FromString(value))
                else:
                    self.client_calls.append(value)
        except BaseException as exc:  # noqa: BLE001 - reported by the benchmark, not lost in a thread
            self.error = exc
        finally:
            consumer.close()


def joined_client_ttfts(messages: Iterable[bytes | str], model: str, region: str | None = None
                        ) -> dict[str, tuple[float, float | None]]:
    """Trace id -> (client TTFT, server record TTFT) in seconds of each call joined to its request by the
    metrics job's rule (a server half whose parent span is the client half's span), served as ``model`` (and in
    ``region``, when given). Halves that break the contract are left out (the job dead-letters them); a trace with
    more than one joined call keeps its first."""
    halves: dict[str, list[dict[str, Any]]] = {}
    letters: list[str] = []
    for message in messages:
        for half in client_join.read_halves(message, letters):
            halves.setdefault(half["trace_id"], []).append(half)
    out: dict[str, tuple[float, float | None]] = {}
    for trace_id, items in halves.items():
        pending = None
        for now_ms, half in enumerate(items):
            pending, outcome = client_join.add(pending, half, now_ms)
            for j in outcome.joined:
                if j.model == model and (region is None or j.region == region) and trace_id not in out:
                    out[trace_id] = (j.client_ttft_s, j.server_ttft_s)
    return out


def server_halves(messages: Iterable[bytes | str], model: str) -> int:
    """How many server halves of ``model`` the records hold (requests called with a parent span)."""
    letters: list[str] = []
    return sum(1 for m in messages for h in client_join.read_halves(m, letters)
               if h["side"] == C.SERVER and h["model"] == model)


def exact_ms(values_s: Iterable[float], q: float, method: str = "linear") -> float | None:
    """The ``q`` quantile (0..1) of values in seconds, in ms: numpy's ``linear`` (as the client's own figures) or
    ``inverted_cdf`` (nearest rank: the smallest value with at least q of them at or below it, which a histogram
    estimates)."""
    values = np.asarray(list(values_s), dtype=float)
    if values.size == 0:
        return None
    return round(float(np.quantile(values, q, method=method)) * 1e3, 3)


def max_abs_diff_ms(measured_s: Mapping[str, float], pipeline_s: Mapping[str, float]) -> float | None:
    """The largest |pipeline - measured| in ms over the requests both hold (by trace id)."""
    common = measured_s.keys() & pipeline_s.keys()
    if not common:
        return None
    return round(max(abs(pipeline_s[t] - measured_s[t]) for t in common) * 1e3, 6)


def instant_value(response: Mapping[str, Any]) -> float | None:
    """The one value of a Prometheus ``/api/v1/query`` answer (a vector or a scalar): None when the vector is
    empty; an error for a failed query or more than one series (the query must name one series)."""
    if response.get("status") != "success":
        raise ValueError(f"Prometheus query failed: {response.get('errorType')}: {response.get('error')}")
    data = response.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return float(result[1])
    if kind != "vector":
        raise ValueError(f"expected a vector or a scalar, got {kind!r}")
    if not result:
        return None
    if len(result) > 1:
        labels = [r.get("metric") for r in result]
        raise ValueError(f"expected one series, got {len(result)}: {labels}")
    return float(result[0]["value"][1])  # Prometheus writes "NaN", "+Inf" as strings: float() reads them


def series_selector(region: str, model: str) -> str:
    def quote(v: str) -> str:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{{{P.LABEL_REGION}={quote(region)},{P.LABEL_MODEL}={quote(model)}}}"


def quantile_query(q: float, region: str, model: str) -> str:
    """Prometheus' quantile of the client TTFT native histogram of one (region, model): the whole series, which
    for a model served in one pass only is exactly that pass's calls."""
    return f"histogram_quantile({q}, {CLIENT_TTFT_SERIES}{series_selector(region, model)})"


def count_query(region: str, model: str) -> str:
    return f"{CLIENT_TTFT_SERIES}_count{series_selector(region, model)}"


def query(prom_url: str, promql: str) -> float | None:
    import requests

    resp = requests.get(f"{prom_url}/api/v1/query", params={"query": promql}, timeout=10)
    resp.raise_for_status()
    return instant_value(resp.json())


def relative_error(got: float | None, exact: float | None) -> float | None:
    if got is None or exact is None or exact == 0:
        return None
    return round(abs(got - exact) / exact, 5)
