"""The normalize and metrics jobs on the real stack (Kafka, Flink with the Kafka connector, the sink
collector, Prometheus): exactly-once through a job kill and a task-manager kill, correctness of the
windowed output against an offline computation, late records, and SDK telemetry end to end."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import uuid
from collections import Counter, defaultdict

import numpy as np
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from infersight.flink_jobs.archive.core import read_archive
from infersight.flink_jobs.common import keys
from infersight.flink_jobs.common.kafka_io import QUIET_S
from infersight.flink_jobs.metrics.job import CATCHUP_S
from infersight.flink_jobs.metrics.window_stats import distribution_values, exponential_index
from infersight.schemas import metrics as M
from infersight.schemas import pipeline as P
from infersight.schemas.records import RequestRecord
from infersight.schemas.topics import LATE, METRICS, REQUESTS
from infersight.schemas.units import NS
from infersight.stack import jobs as flink
from tests.integration.pipeline_util import (
    Jobs,
    produce_requests,
    prom_value,
    read_all,
    request_records,
    wait_until,
)
from tests.support.sample_requests import sample_records

REQUESTS_TOTAL, WINDOW_REQUESTS, LATE_TOTAL = P.prom(P.REQUESTS), P.prom(P.WINDOW_REQUESTS), P.prom(P.LATE_RECORDS)

pytestmark = pytest.mark.integration
WINDOW_S = 10


@pytest.fixture(scope="module")
def jobs(stack, tmp_path_factory):
    j = Jobs(stack, tmp_path_factory.mktemp("archive"))
    j.args["infersight.flink_jobs.metrics.job"] += ["--client-join-timeout-s", "20"]  # unmatched calls show sooner
    j.start()
    wait_until(j.running, 120, "the jobs to run")
    yield j
    j.stop_quietly()


def batch(model: str, n: int, end_ns: int, seed: int, slow_region: str | None = None) -> list[RequestRecord]:
    """``n`` records of ``model`` ending in the 8 s before ``end_ns``, in event-time order."""
    records = list(sample_records(n, end_ns - 8 * NS, 8.0, seed=seed, models=(model,), slow_region=slow_region))
    return sorted(records, key=lambda r: r.end_ns)


def wait_for_new_checkpoints(jobs: Jobs, n: int = 2) -> None:
    before = jobs.checkpoints()
    wait_until(lambda: all(c >= before[m] + n for m, c in jobs.checkpoints().items()), 90, "new checkpoints")


def kill_task_manager(stack) -> None:
    pid = stack.running_components()["flink-taskmanager"]
    os.kill(pid, signal.SIGKILL)
    # gone, or already started again under another pid (a supervised stack restarts what dies)
    wait_until(lambda: stack.running_components().get("flink-taskmanager") != pid, 30, "the task manager to die")
    stack.up()  # starts what is not running; the jobs restart from their last checkpoints


# The latest event time any flusher of this session produced: the jobs' watermarks may stand there, so a
# later test that needs its records on time places them after it (each poll moves a flusher 5 s ahead).
_FLUSHED_TO_NS = [0]


class Flusher:
    """Requests in a throwaway model, each later in event time than the last, so that every earlier
    window closes. A restarted job's watermark starts over and moves only with new records, so the
    tests keep flushing while they wait (a live fleet does this by itself)."""

    def __init__(self, bootstrap: str, after_ns: int) -> None:
        self.bootstrap, self.at = bootstrap, after_ns + 3 * WINDOW_S * NS

    def __call__(self) -> None:
        produce_requests(self.bootstrap, batch(f"flush-{uuid.uuid4().hex[:6]}", 1, self.at, seed=1))
        _FLUSHED_TO_NS[0] = max(_FLUSHED_TO_NS[0], self.at)
        self.at += 5 * NS


def flushing(flusher: Flusher, check):
    def flush_then_check():
        flusher()
        return check()
    return flush_then_check


def decode_points(bootstrap: str, model: str) -> list[tuple[str, dict[str, str], int, object]]:
    """(metric name, labels, time, point) of every committed point on infersight.metrics for ``model``; a
    histogram's exponential form (its native histogram in Prometheus) under its name + ``NATIVE``."""
    out = []
    for msg in read_all(bootstrap, METRICS.name):
        req = ExportMetricsServiceRequest.FromString(msg.value())
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    name = metric.name + (NATIVE if kind == "exponential_histogram" else "")
                    for point in getattr(metric, kind).data_points:
                        labels = {kv.key: kv.value.string_value for kv in point.attributes}
                        if labels.get(P.LABEL_MODEL) == model:
                            out.append((name, labels, point.time_unix_nano, point))
    return out


NATIVE = "#exponential"


def test_a_burst_then_silence_reaches_prometheus_within_the_quiet_bound(jobs, stack):
    """Nothing follows the burst (this test runs first: no flusher has run): its windows close only because
    event time follows the wall clock once the sources have read nothing for QUIET_S."""
    bootstrap, prom_url = stack.layout.kafka_bootstrap, stack.layout.prometheus_url
    model = f"quiet-{uuid.uuid4().hex[:8]}"
    sent = batch(model, 600, time.time_ns(), seed=31)
    produce_requests(bootstrap, sent)
    stopped = time.monotonic()
    bound_s = WINDOW_S + QUIET_S + 2  # window + quiet + the metrics job's checkpoint interval (docs/reliability.md)
    slack_s = 40  # normalize's checkpoint (5 s), the sink's poll, Prometheus' scrape (5 s), a loaded CI host
    regional = f'model="{model}",region!="global"'
    wait_until(lambda: prom_value(prom_url, f"sum({REQUESTS_TOTAL}{{{regional}}})") == len(sent),
               bound_s + slack_s, f"the burst's {len(sent)} requests in Prometheus, no traffic after it")
    took = time.monotonic() - stopped
    assert prom_value(prom_url, f"sum(sum_over_time({WINDOW_REQUESTS}{{{regional}}}[30m]))") == len(sent)
    wait_until(lambda: prom_value(prom_url, f'sum({REQUESTS_TOTAL}{{model="{model}",region="global"}})')
               == len(sent), 30, "the global roll-up of the burst")
    print(f"quiet traffic: a burst's last windows in Prometheus {took:.1f} s after it (bound {bound_s:.0f} s + "
          f"delivery)")


def test_exactly_once_through_job_and_task_manager_kills_and_correct_windows(jobs, stack):
    bootstrap, prom_url = stack.layout.kafka_bootstrap, stack.layout.prometheus_url
    model = f"eo-{uuid.uuid4().hex[:8]}"
    sent: list[RequestRecord] = []
    t = time.time_ns()

    # phase A: steady state, checkpointed
    sent += batch(model, 1500, t, seed=21, slow_region="ap-southeast-1")
    produce_requests(bootstrap, sent)
    # a gateway re-sending a batch after a restart: 200 requests again (the newest, so within the 3 s
    # out-of-orderness, not late); the windows and the archive must count each once
    copies = sent[-200:]
    produce_requests(bootstrap, copies)
    wait_for_new_checkpoints(jobs)

    # phase B: kill both jobs mid-stream, resume from their retained checkpoints
    part = batch(model, 1500, t + 10 * NS, seed=22, slow_region="ap-southeast-1")
    produce_requests(bootstrap, part)
    sent += part
    jobs.cancel()
    jobs.start(restore=True)
    wait_until(jobs.running, 120, "the restored jobs to run")

    # phase C: kill the task manager mid-stream; Flink restarts the jobs from their last checkpoints
    part = batch(model, 1500, t + 20 * NS, seed=23, slow_region="ap-southeast-1")
    produce_requests(bootstrap, part)
    sent += part
    kill_task_manager(stack)
    wait_until(jobs.running, 180, "the jobs to recover on the new task manager")

    n = len(sent)
    selector = f'model="{model}"'
    flusher = Flusher(bootstrap, max(r.end_ns for r in sent))
    wait_until(flushing(flusher, lambda: prom_value(
        prom_url, f'sum({REQUESTS_TOTAL}{{{selector},region!="global"}})') == n),
        300, f"Prometheus to count {n} requests", every_s=5)
    # the roll-up is a window downstream of the regional ones: its counters may come a checkpoint later
    wait_until(flushing(flusher, lambda: prom_value(
        prom_url, f'sum({REQUESTS_TOTAL}{{{selector},region="global"}})') == n),
        120, f"Prometheus to count {n} requests in the global roll-up", every_s=5)
    per_window = prom_value(prom_url, f'sum(sum_over_time({WINDOW_REQUESTS}{{{selector},'
                                      f'region!="global"}}[30m]))')
    assert per_window == n  # every window counted once: no loss, no double counting

    # the committed request records hold each request exactly once, plus the re-sent copies (normalize
    # passes them on: they are the same trace and span id)
    ours = [r for r in request_records(bootstrap, REQUESTS.name) if r["model"] == model]
    assert len(ours) == n + len(copies)
    assert {(r["trace_id"], r["span_id"]) for r in ours} == {(r.trace_id, r.span_id) for r in sent}

    # the Parquet archive too, partitioned by day and region, after the same kills
    def archived() -> list[str] | None:
        table = read_archive(jobs.archive_root)
        ids = [t for t, m in zip(table.column("trace_id").to_pylist(), table.column("model").to_pylist(),
                                 strict=True) if m == model]
        return ids if len(ids) >= n else None
    rows = wait_until(flushing(flusher, archived), 180, f"{n} archived rows", every_s=5)
    assert sorted(rows) == sorted(r.trace_id for r in sent)  # no duplicate, none missing
    regions = {p.name for p in jobs.archive_root.glob("day=*/region=*")}
    assert regions == {f"region={r}" for r in {r.region for r in sent}}

    # ---- correctness against an offline computation over the same records ----
    def committed_points():
        """The committed metrics, once they include the last windows (Prometheus reads uncommitted data,
        so it can be a checkpoint ahead of a read_committed reader)."""
        points = decode_points(bootstrap, model)
        last: dict[tuple, tuple[int, float]] = {}
        for name, lab, ts, point in points:
            key = (lab[P.LABEL_REGION], lab[P.LABEL_TRACK])
            if name == P.REQUESTS and lab[P.LABEL_REGION] != P.GLOBAL_REGION and ts >= last.get(key, (0, 0))[0]:
                last[key] = (ts, point.as_double)
        return points if sum(v for _, v in last.values()) == n else None

    points = wait_until(flushing(flusher, committed_points), 120, "the last windows committed", every_s=5)
    windows = [(lab[P.LABEL_REGION], lab[P.LABEL_TRACK], ts) for name, lab, ts, _ in points
               if name == P.WINDOW_REQUESTS]
    assert len(windows) == len(set(windows)), "a window was emitted twice on the committed topic"

    by_series: dict[tuple[str, str], list[dict]] = defaultdict(list)
    by_window: dict[tuple[str, str, int], list[dict]] = defaultdict(list)
    for r in (r.to_dict() for r in sent):
        window_end = (r["end_ns"] // 1_000_000 // (WINDOW_S * 1000) + 1) * WINDOW_S * 1000 * 1_000_000
        for region in (r["region"], P.GLOBAL_REGION):
            by_series[(region, r["track"])].append(r)
            by_window[(region, r["track"], window_end)].append(r)

    def final(metric: str) -> dict[tuple[str, str], object]:
        latest: dict[tuple[str, str], tuple[int, object]] = {}
        for name, lab, ts, point in points:
            key = (lab[P.LABEL_REGION], lab[P.LABEL_TRACK])
            if name == metric and ts >= latest.get(key, (0, None))[0]:
                latest[key] = (ts, point)
        return {key: point for key, (_, point) in latest.items()}

    final_hist = final(M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN)
    final_native = final(M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN + NATIVE)
    assert set(final_hist) == set(final_native) == set(by_series)
    for key, point in final_hist.items():
        ttfts = [distribution_values(r)["ttft_s"] for r in by_series[key] if "ttft_s" in distribution_values(r)]
        expected = np.bincount(np.searchsorted(M.TTFT_BUCKETS, ttfts, side="left"),
                               minlength=len(M.TTFT_BUCKETS) + 1).tolist()
        assert list(point.bucket_counts) == expected, key
        # the native form counts the same requests, each in its exponential bucket, through the same kills
        native = final_native[key]
        indexes = Counter(exponential_index(v) for v in ttfts)
        assert native.count == len(ttfts) and native.zero_count == 0, key
        assert {native.positive.offset + i: c for i, c in enumerate(native.positive.bucket_counts) if c} == \
            dict(indexes), key

    checked = 0
    for name, lab, ts, point in points:
        if name != M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN + P.WINDOW_QUANTILE_SUFFIX:
            continue
        records = by_window[(lab[P.LABEL_REGION], lab[P.LABEL_TRACK], ts)]
        ttfts = [distribution_values(r)["ttft_s"] for r in records if "ttft_s" in distribution_values(r)]
        exact = float(np.quantile(ttfts, float(lab[P.LABEL_QUANTILE]), method="lower"))
        assert point.as_double == pytest.approx(exact, rel=0.01), (lab, ts)
        checked += 1
    assert checked >= 3 * 4 * 2  # regions + global, windows, tracks (at least)

    # averaging the regions' p99s would have been wrong on this data (one slow region)
    stable_global = [ts for (region, track, ts) in by_window if region == P.GLOBAL_REGION and track == "stable"]
    busiest = max(stable_global, key=lambda ts: len(by_window[(P.GLOBAL_REGION, "stable", ts)]))
    p99 = {lab[P.LABEL_REGION]: point.as_double for name, lab, ts, point in points
           if name == M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN + P.WINDOW_QUANTILE_SUFFIX and ts == busiest
           and lab[P.LABEL_TRACK] == "stable" and lab[P.LABEL_QUANTILE] == "0.99"}
    glob = p99.pop(P.GLOBAL_REGION)
    ttfts = [r["ttft_s"] for r in by_window[(P.GLOBAL_REGION, "stable", busiest)] if r["error_type"] is None]
    exact_global = float(np.quantile(ttfts, 0.99, method="lower"))
    assert glob == pytest.approx(exact_global, rel=0.01)
    assert abs(np.mean(list(p99.values())) - exact_global) / exact_global > 0.05


def test_late_records_go_to_the_late_topic_are_counted_and_join_the_totals_when_the_series_stops(jobs, stack):
    bootstrap, prom_url = stack.layout.kafka_bootstrap, stack.layout.prometheus_url
    now = time.time_ns()
    [lead] = batch(f"lead-{uuid.uuid4().hex[:6]}", 1, now + 60 * NS, seed=3)
    produce_requests(bootstrap, [lead])
    # A lead record a minute ahead moves the watermark only where it lands: normalize's output may land on
    # any partition, and one that keeps getting only old records holds the watermark back (it is
    # never idle). So every poll sends a copy of the lead with a fresh one-minute-old request of one series,
    # in one message (normalize keeps a message's records together), until one is late (the watermark never
    # moves back, so it stays late from then on). Late: older than the catch-up bound behind the lead (a record
    # within it gets a catch-up window of its own, test_metrics_catchup.py).
    late_by_s = CATCHUP_S + 60
    model = f"late-{uuid.uuid4().hex[:6]}"
    # a region of its own: the late counter is per region, and each module's metrics job counts from zero
    first = dataclasses.replace(batch(model, 1, now - int(late_by_s * NS), seed=4)[0], region=model)
    sent: list[RequestRecord] = []

    def send_then_check() -> bool:
        record = dataclasses.replace(first, trace_id=uuid.uuid4().hex, span_id=uuid.uuid4().hex[:16])
        lead_copy = dataclasses.replace(lead, trace_id=uuid.uuid4().hex, span_id=uuid.uuid4().hex[:16])
        produce_requests(bootstrap, [lead_copy, record])
        sent.append(record)
        ids = {r.trace_id for r in sent}
        return any(r["trace_id"] in ids for r in request_records(bootstrap, LATE.name))

    wait_until(send_then_check, 150, "a late record on infersight.late", every_s=5.0)
    wait_until(lambda: (prom_value(prom_url, f'sum({LATE_TOTAL}{{region="{model}"}})') or 0) >= 1, 120,
               "the late counter of the late records' region")
    # the series stops: within two windows its totals are shown alone, late requests included, stamped just after
    # its window (beyond the catch-up bound: older than an instant query's 5 min look-back, so read its newest)
    total = f'sum(last_over_time({REQUESTS_TOTAL}{{model="{model}",region!="global"}}[1h]))'
    wait_until(lambda: prom_value(prom_url, total) == len(sent), 120, f"{len(sent)} requests of {model} in its "
               "counter without a next window")
    glob = f'sum(last_over_time({REQUESTS_TOTAL}{{model="{model}",region="global"}}[1h]))'
    assert prom_value(prom_url, glob) == len(sent)
    # and a next on-time window after that flush still reaches Prometheus (its samples stay in time order)
    ahead = int((late_by_s + 70) * NS)  # 70 s after now, as the lead
    on_time = dataclasses.replace(first, trace_id=uuid.uuid4().hex, span_id=uuid.uuid4().hex[:16],
                                  start_ns=first.start_ns + ahead, end_ns=first.end_ns + ahead)
    produce_requests(bootstrap, [on_time])
    wait_until(flushing(Flusher(bootstrap, on_time.end_ns), lambda: prom_value(prom_url, total) == len(sent) + 1),
               180, f"{len(sent) + 1} requests of {model} in its counter")
    assert prom_value(prom_url, glob) == len(sent) + 1


def test_sdk_telemetry_through_a_gateway_becomes_a_request_record_sampled_or_not(jobs, stack):
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    from infersight.flink_jobs.normalize.otlp_spans import iter_spans
    from infersight.instrumentation import Instrumentation
    from infersight.schemas.topics import OTLP_REQUESTS, OTLP_SPANS

    region, bootstrap = stack.layout.regions[2], stack.layout.kafka_bootstrap
    models = {}
    for sampler in (ALWAYS_ON, ALWAYS_OFF):
        provider = TracerProvider(sampler=sampler, resource=Resource.create({"service.name": "jobs-test"}))
        provider.add_span_processor(SimpleSpanProcessor(
            OTLPSpanExporter(endpoint=stack.layout.otlp_endpoint(region), insecure=True)))
        inst = Instrumentation(tracer_provider=provider, meter_provider=MeterProvider(), gpu=False)
        model = f"sdk-{uuid.uuid4().hex[:6]}"
        with inst.request(model) as req:
            with req.stage("queue"):
                time.sleep(0.001)
            req.first_token()
            req.token()
            req.usage(input_tokens=5, output_tokens=2)
            req.finish("stop")
        provider.shutdown()
        models[sampler is ALWAYS_ON] = (model, format(req._root.span_context.trace_id, "032x"))

    for sampled, (model, trace_id) in models.items():
        record = wait_until(lambda m=model: next((r for r in request_records(bootstrap, REQUESTS.name)
                                                  if r["model"] == m), None), 120, f"the record of {model}")
        assert record["region"] == region and record["tokens_out"] == 2 and record["queue_s"] > 0
        assert record["trace_id"] == trace_id
        assert keys.series_key(record).startswith(region)
        assert sum(r["model"] == model for r in request_records(bootstrap, REQUESTS.name)) == 1
        # the gateway: request topic = the root span only; full-trace topic = the sampled trace only
        on_requests = [s for m in read_all(bootstrap, OTLP_REQUESTS.name) for s in iter_spans(m.value())
                       if s["trace_id"] == trace_id]
        on_traces = [s["name"] for m in read_all(bootstrap, OTLP_SPANS.name) for s in iter_spans(m.value())
                     if s["trace_id"] == trace_id]
        assert [s["name"] for s in on_requests] == [f"chat {model}"]
        assert sorted(on_traces) == (sorted([f"chat {model}", "queue"]) if sampled else [])


def test_a_client_call_joins_its_request_and_its_ttft_reaches_prometheus_under_the_servers_region(jobs, stack):
    """Issue #22: the real OpenAI client, instrumented, calls (over an httpx transport) a handler instrumented with
    our SDK under the call's traceparent; client spans go to one region's gateway, server spans to another's. The
    client's TTFT lands in Prometheus once, in its bucket, under the server's region and model, its sum within
    1 ms of what the client measured; a call no server reported is counted as unmatched and published under no
    region."""
    import json

    import httpx
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from infersight.instrumentation import Instrumentation
    from infersight.instrumentation.openai_client import OpenAIClientInstrumentor
    from infersight.schemas import attributes as A
    from tests.integration.pipeline_util import prom

    server_region, client_region = stack.layout.regions[0], stack.layout.regions[1]
    url = stack.layout.prometheus_url

    def provider(region: str, service: str) -> TracerProvider:
        tp = TracerProvider(resource=Resource.create({"service.name": service}))
        tp.add_span_processor(SimpleSpanProcessor(
            OTLPSpanExporter(endpoint=stack.layout.otlp_endpoint(region), insecure=True)))
        return tp

    client_tp, server_tp = provider(client_region, "jobs-test-client"), provider(server_region, "jobs-test-server")
    measured = InMemorySpanExporter()
    client_tp.add_span_processor(SimpleSpanProcessor(measured))
    server = Instrumentation(tracer_provider=server_tp, meter_provider=MeterProvider(), gpu=False)
    model, lonely = f"client-{uuid.uuid4().hex[:6]}", f"lonely-{uuid.uuid4().hex[:6]}"

    def handler(request):
        asked = json.loads(request.content)["model"]
        if asked == model:  # the lonely call's server reports nothing
            with server.request(model, headers=dict(request.headers)) as req:
                time.sleep(0.12)
                req.first_token()
                req.token()
                req.usage(input_tokens=3, output_tokens=1)
                req.finish("stop")
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": asked,
                 "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
        return httpx.Response(200, content=b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})

    openai = pytest.importorskip("openai")
    inst = OpenAIClientInstrumentor(tracer_provider=client_tp, meter_provider=MeterProvider())
    inst.instrument()
    try:
        client = openai.OpenAI(base_url="http://server:8000/v1", api_key="x", max_retries=0,
                               http_client=httpx.Client(transport=httpx.MockTransport(handler)))
        for asked in (model, lonely):
            for _chunk in client.chat.completions.create(model=asked, stream=True,
                                                         messages=[{"role": "user", "content": "q"}]):
                pass
    finally:
        inst.uninstrument()
        client_tp.shutdown()
        server_tp.shutdown()
    ttft = next(s.attributes[A.CLIENT_TTFT] for s in measured.get_finished_spans()
                if s.attributes[A.GEN_AI_REQUEST_MODEL] == model)

    name, here = P.prom(P.CLIENT_TTFT), f'region="{server_region}",model="{model}"'
    count = wait_until(lambda: prom_value(url, f"{name}_count{{{here}}}"), 120, "the client's TTFT in Prometheus",
                       last_of=lambda: prom(url, f'{{model="{model}"}}'))
    assert count == 1
    upper = next(b for b in M.TTFT_BUCKETS if ttft <= b)
    assert prom_value(url, f'{name}_bucket{{{here},le="{upper:.15g}"}}') == 1
    below = [b for b in M.TTFT_BUCKETS if b < upper]
    if below:
        assert prom_value(url, f'{name}_bucket{{{here},le="{below[-1]:.15g}"}}') == 0
    assert abs(prom_value(url, f"{name}_sum{{{here}}}") - ttft) < 1e-3  # the goal: within 1 ms of the client
    assert [r["metric"]["region"] for r in prom(url, f'{name}_count{{model="{model}"}}')] == [server_region]
    assert prom_value(url, f"{P.prom(P.CLIENT_OUTSIDE_SERVER)}_count{{{here}}}") == 1

    unmatched = P.prom(P.CLIENT_UNMATCHED)
    assert wait_until(lambda: prom_value(url, f'{unmatched}{{model="{lonely}"}}'), 90, "the lonely call counted") == 1
    assert prom(url, f'{{__name__=~"{name}.*",model="{lonely}"}}') == []  # never under a region
    assert prom(url, f'{unmatched}{{model="{model}"}}') == []


def test_each_kind_of_bad_input_lands_in_the_dlq_and_the_valid_records_around_it_all_arrive(jobs, stack):
    from confluent_kafka import Producer

    from infersight.schemas.topics import DLQ, OTLP_REQUESTS
    from tests.bad_telemetry import KINDS, bad_payload
    from tests.support.otlp_requests import encode_requests

    bootstrap = stack.layout.kafka_bootstrap
    good = batch(f"dlq-{uuid.uuid4().hex[:6]}", 4 * (len(KINDS) + 1), time.time_ns(), seed=31)
    producer = Producer({"bootstrap.servers": bootstrap})
    where: dict[str, tuple[int, int]] = {}
    for i, kind in enumerate(KINDS):  # valid, bad, valid, bad, ..., valid
        producer.produce(OTLP_REQUESTS.name, encode_requests(good[4 * i:4 * i + 4]), key=b"dlq")
        producer.produce(OTLP_REQUESTS.name, bad_payload(kind)[0], key=b"dlq",
                         on_delivery=lambda err, msg, k=kind: where.__setitem__(k, (msg.partition(), msg.offset())))
    producer.produce(OTLP_REQUESTS.name, encode_requests(good[-4:]), key=b"dlq")
    assert producer.flush(30) == 0 and len(where) == len(KINDS)

    by_source = {kind: (OTLP_REQUESTS.name, *pos) for kind, pos in where.items()}

    def letters():
        found = {}
        for letter in request_records(bootstrap, DLQ.name):
            src = letter["source"]
            for kind, source in by_source.items():
                if (src["topic"], src["partition"], src["offset"]) == source:
                    found[kind] = letter
        return found if len(found) == len(KINDS) else None

    found = wait_until(letters, 120, "a dead letter for each kind of bad input")
    for kind in KINDS:
        field = bad_payload(kind)[1]
        assert any(p.startswith(field) for p in found[kind]["problems"]), (kind, found[kind]["reason"])
        assert found[kind]["raw_base64"]
    ids = {r.trace_id for r in good}
    wait_until(lambda: ids <= {r["trace_id"] for r in request_records(bootstrap, REQUESTS.name)}, 120,
               "every valid record around the bad ones")
    assert flink.job_state(stack.layout, jobs.ids["infersight.flink_jobs.normalize.job"]) == "RUNNING"


def test_poison_on_the_jobs_input_topics_is_dead_lettered_by_each_job_and_every_valid_record_counted(jobs, stack):
    """Issue #20 item 1: what normalize writes is read by the metrics and archive jobs; poison written there
    directly (non-JSON, JSON of the wrong shape, records and gauges off the contract, a 7 MiB payload: the
    broker takes up to 8 MiB) must become dead letters of each job, capped, while the jobs keep running and
    count the valid batches around it."""
    import hashlib
    import json
    import math

    from confluent_kafka import Producer

    from infersight.schemas.deadletter import MAX_PAYLOAD_BYTES
    from infersight.schemas.records import dump_batch
    from infersight.schemas.topics import DLQ, PODS

    bootstrap, prom_url = stack.layout.kafka_bootstrap, stack.layout.prometheus_url
    model = f"poison-{uuid.uuid4().hex[:6]}"
    good = batch(model, 40, time.time_ns(), seed=41)
    off_contract = {**good[0].to_dict(), "trace_id": uuid.uuid4().hex, "engine": 5}
    huge = os.urandom(7 << 19).hex().encode()  # 7 MiB of text: under the broker's 8 MiB, over the DLQ's cap
    poison = [b"not json", b"[1]", b'{"a":[]}', b'["ab",null]', dump_batch([off_contract]).encode(), huge]
    gauge = {"region": "r", "pod": "p", "metric": M.QUEUE_DEPTH, "value": 1.0, "time_ns": time.time_ns()}
    pod_poison = [b"{not json", b"[1]", dump_batch([{**gauge, "value": None}]).encode(),
                  dump_batch([{**gauge, "time_ns": 2**64 - 1}]).encode()]
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 8_000_000, "linger.ms": 5})
    half = len(good) // 2
    for records in (good[:half], None, good[half:]):  # valid, all the poison, valid
        if records is None:
            for value in poison:
                producer.produce(REQUESTS.name, value, timestamp=good[half].end_ns // 1_000_000)
            for value in pod_poison:
                producer.produce(PODS.name, value, timestamp=gauge["time_ns"] // 1_000_000)
            continue
        producer.produce(REQUESTS.name, dump_batch([r.to_dict() for r in records]).encode(),
                         timestamp=max(r.end_ns for r in records) // 1_000_000)
    assert producer.flush(60) == 0
    def shas(value: bytes) -> list[str]:  # a batch that parses is dead-lettered item by item
        try:
            parsed = json.loads(value)
        except ValueError:
            return [hashlib.sha256(value).hexdigest()]
        items = parsed if isinstance(parsed, list) else [parsed]
        return [hashlib.sha256(json.dumps(i, separators=(",", ":")).encode()).hexdigest() for i in items]

    expected = {(job, REQUESTS.name, sha) for job in ("infersight-metrics", "infersight-archive")
                for value in poison[:4] + poison[5:] for sha in shas(value)}
    expected |= {("infersight-metrics", PODS.name, sha) for value in pod_poison for sha in shas(value)}
    # the off-contract record's letter carries the record re-serialised: matched by its trace id
    item_letters = {("infersight-metrics", off_contract["trace_id"]), ("infersight-archive", off_contract["trace_id"])}

    def letters():
        found, by_item = {}, set()
        for letter in request_records(bootstrap, DLQ.name):
            key = (letter.get("job"), letter["source"]["topic"], letter.get("raw_sha256"))
            if key in expected:
                found[key] = letter
            if (letter.get("job"), letter.get("trace_id")) in item_letters:
                by_item.add((letter["job"], letter["trace_id"]))
        return found if expected <= found.keys() and by_item == item_letters else None

    found = wait_until(letters, 180, "each job's dead letters for every poison message")
    big = hashlib.sha256(huge).hexdigest()
    for job in ("infersight-metrics", "infersight-archive"):
        letter = found[(job, REQUESTS.name, big)]
        assert letter["raw_size"] == len(huge) and letter["raw_truncated"]
        assert len(letter["raw_base64"]) <= math.ceil(MAX_PAYLOAD_BYTES / 3) * 4
        assert found[(job, REQUESTS.name, hashlib.sha256(b"not json").hexdigest())]["reason"].startswith("payload")
    # the valid records around the poison are all counted, and every job still runs
    total = f'sum({REQUESTS_TOTAL}{{model="{model}",region!="global"}})'
    wait_until(flushing(Flusher(bootstrap, good[-1].end_ns), lambda: prom_value(prom_url, total) == len(good)),
               180, f"{len(good)} requests of {model} in its counter")
    for module in ("normalize", "metrics", "archive"):
        assert flink.job_state(stack.layout, jobs.ids[f"infersight.flink_jobs.{module}.job"]) == "RUNNING"
