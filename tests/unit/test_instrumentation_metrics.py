"""Metrics: semconv names and buckets, every request whatever the sampler, temporality, gauges, GPU."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

from infersight.instrumentation import Instrumentation, Settings, views
from infersight.instrumentation.gpu import register_gpu_gauges
from infersight.instrumentation.meters import takes_bucket_advisory
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas.registry import histogram_buckets
from tests.unit.fakes import FakeClock, metric_points

ADVISORY = takes_bucket_advisory(MeterProvider().get_meter("probe"))


def make(sampler=ALWAYS_ON, reader=None, meter_provider=None, **kwargs):
    exporter = InMemorySpanExporter()
    tp = TracerProvider(sampler=sampler)
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = reader or InMemoryMetricReader()
    # an API older than 1.30 takes no bucket advisory: the registry's buckets then come from our views
    mp = meter_provider or MeterProvider(metric_readers=[reader], views=[] if ADVISORY else views())
    clock = FakeClock()
    kwargs.setdefault("settings", Settings(region="us-east-1", track="stable", model_version="v1"))
    inst = Instrumentation(tracer_provider=tp, meter_provider=mp, clock=clock, gpu=False, **kwargs)
    return SimpleNamespace(inst=inst, exporter=exporter, reader=reader, clock=clock, mp=mp)


def one_request(h, ttft_ms=30.0, gaps_ms=(20.0, 20.0, 20.0), queue_ms=4.0, model="llama", error=None):
    with h.inst.request(model) as req:
        with req.stage("queue"):
            h.clock.ms(queue_ms)
        h.clock.ms(ttft_ms - queue_ms)
        req.first_token()
        for gap in gaps_ms:
            h.clock.ms(gap)
            req.token()
        req.usage(input_tokens=100)
        if error:
            req.error(error)
        req.finish("error" if error else "stop")


HISTS = (M.GEN_AI_SERVER_REQUEST_DURATION, M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
         M.ITL_P99_METRIC, M.QUEUE_TIME_METRIC, M.GEN_AI_CLIENT_TOKEN_USAGE)


@pytest.mark.parametrize("fast", [True, False], ids=["in-process-bank", "api-instruments"])
def test_histograms_have_semconv_names_registry_buckets_and_right_counts(fast):
    h = make(fast_metrics=fast)
    one_request(h)
    points = metric_points(h.reader)
    for name in HISTS:
        assert name in points, name
        assert tuple(points[name][0].explicit_bounds) == histogram_buckets(name)
    (ttft,) = points[M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN]
    assert ttft.count == 1 and ttft.sum == pytest.approx(0.030)
    assert ttft.bucket_counts[histogram_buckets(M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN).index(0.04)] == 1
    assert sum(ttft.bucket_counts) == 1
    (tpot,) = points[M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN]
    assert tpot.sum == pytest.approx(0.020) and tpot.min == pytest.approx(0.020)
    (queue,) = points[M.QUEUE_TIME_METRIC]
    assert queue.sum == pytest.approx(0.004)
    assert queue.bucket_counts[histogram_buckets(M.QUEUE_TIME_METRIC).index(0.005)] == 1
    tokens = {p.attributes[A.GEN_AI_TOKEN_TYPE]: p for p in points[M.GEN_AI_CLIENT_TOKEN_USAGE]}
    assert tokens["input"].sum == 100 and tokens["output"].sum == 4
    attrs = ttft.attributes
    assert attrs[A.GEN_AI_REQUEST_MODEL] == "llama" and attrs[A.DEPLOYMENT_TRACK] == "stable"
    assert attrs[A.MODEL_VERSION] == "v1" and A.ERROR_TYPE not in attrs


@pytest.mark.parametrize("fast", [True, False], ids=["in-process-bank", "api-instruments"])
def test_two_instrumentations_on_one_meter_provider_keep_their_own_series(fast):
    stable = make(fast_metrics=fast)
    canary = make(fast_metrics=fast, meter_provider=stable.mp,
                  settings=Settings(region="us-east-1", track="canary", model_version="v2"))
    one_request(stable)
    for _ in range(2):
        one_request(canary)
    by_track = {p.attributes[A.DEPLOYMENT_TRACK]: p for p in
                metric_points(stable.reader)[M.GEN_AI_SERVER_REQUEST_DURATION]}
    assert {t: p.count for t, p in by_track.items()} == {"stable": 1, "canary": 2}
    assert by_track["canary"].attributes[A.MODEL_VERSION] == "v2"


def test_value_on_a_bucket_bound_counts_in_that_bucket():
    h = make()
    one_request(h, ttft_ms=100.0, queue_ms=1.0)  # exactly the 0.1 bound: OTel buckets are (lower, upper]
    (ttft,) = metric_points(h.reader)[M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN]
    assert ttft.bucket_counts[histogram_buckets(M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN).index(0.1)] == 1


@pytest.mark.parametrize("sampler", [ALWAYS_OFF, ParentBased(ALWAYS_OFF)])
def test_sampled_out_requests_still_feed_every_metric(sampler):
    h = make(sampler=sampler)
    for _ in range(3):
        one_request(h)
    spans = h.exporter.get_finished_spans()  # only the record-only roots: no trace was sampled
    assert len(spans) == 3 and all(s.attributes[A.RECORD_ONLY] is True and s.parent is None for s in spans)
    points = metric_points(h.reader)
    for name in (M.GEN_AI_SERVER_REQUEST_DURATION, M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, M.ITL_P99_METRIC):
        assert points[name][0].count == 3


def test_remote_not_sampled_parent_builds_no_trace_spans_but_records_metrics():
    h = make(sampler=ParentBased(ALWAYS_ON))
    with h.inst.request("llama", headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}):
        pass
    [record] = h.exporter.get_finished_spans()
    assert record.attributes[A.RECORD_ONLY] is True
    assert format(record.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert metric_points(h.reader)[M.GEN_AI_SERVER_REQUEST_DURATION][0].count == 1


def test_failed_requests_carry_error_type_and_skip_ttft():
    h = make()
    one_request(h, error="EngineDeadError")
    points = metric_points(h.reader)
    (duration,) = points[M.GEN_AI_SERVER_REQUEST_DURATION]
    assert duration.attributes[A.ERROR_TYPE] == "EngineDeadError"
    assert M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN not in points


def test_cumulative_then_delta_temporality():
    delta_reader = InMemoryMetricReader(preferred_temporality={Histogram: AggregationTemporality.DELTA})
    cumulative_reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[delta_reader, cumulative_reader])
    h = make(meter_provider=mp, reader=cumulative_reader)
    one_request(h)
    one_request(h)
    assert metric_points(delta_reader)[M.GEN_AI_SERVER_REQUEST_DURATION][0].count == 2
    one_request(h)
    delta = metric_points(delta_reader)[M.GEN_AI_SERVER_REQUEST_DURATION][0]
    assert delta.count == 1
    assert metric_points(cumulative_reader)[M.GEN_AI_SERVER_REQUEST_DURATION][0].count == 3


def test_two_instrumentations_on_one_provider_share_one_series():
    h = make()
    other = Instrumentation(tracer_provider=TracerProvider(), meter_provider=h.mp, gpu=False,
                            settings=Settings(track="stable", model_version="v1"), clock=h.clock)
    one_request(h)
    with other.request("llama"):
        pass
    data = h.reader.get_metrics_data()
    names = [m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    assert names.count(M.GEN_AI_SERVER_REQUEST_DURATION) == 1
    assert metric_points(h.reader)[M.GEN_AI_SERVER_REQUEST_DURATION][0].count == 2


def test_views_helper_fixes_buckets_for_the_api_path():
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader], views=views())
    h = make(meter_provider=mp, reader=reader, fast_metrics=False)
    one_request(h)
    (itl,) = metric_points(reader)[M.ITL_P99_METRIC]
    assert tuple(itl.explicit_bounds) == histogram_buckets(M.ITL_P99_METRIC)


def test_server_gauges_and_prefix_cache_counters():
    h = make()
    h.inst.gauges.queue_depth = 7
    h.inst.gauges.running = 3
    h.inst.gauges.kv_cache_usage = 0.42
    h.inst.gauges.batch_size = 16
    for _ in range(2):
        with h.inst.request("llama") as req:
            req.prefix_cache(queried_tokens=64, hit_tokens=48)
    points = metric_points(h.reader)
    assert points[M.QUEUE_DEPTH][0].value == 7
    assert points[M.REQUESTS_RUNNING][0].value == 3
    assert points[M.KV_CACHE_USAGE][0].value == pytest.approx(0.42)
    assert points[M.BATCH_SIZE][0].value == 16
    assert points[M.PREFIX_CACHE_QUERIES][0].value == 128
    assert points[M.PREFIX_CACHE_HITS][0].value == 96
    assert req.record().tokens_cached == 48


def test_unset_gauges_report_nothing():
    h = make()
    assert M.QUEUE_DEPTH not in metric_points(h.reader)


class FakeNvml:
    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=50 + handle, memory=20)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=1000 * (handle + 1), total=8000)


def test_gpu_gauges_from_nvml():
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    assert register_gpu_gauges(mp.get_meter("t"), nvml=FakeNvml()) is True
    points = metric_points(reader)
    util = {p.attributes[A.HW_ID]: p.value for p in points[M.HW_GPU_UTILIZATION]}
    assert util == {"0": pytest.approx(0.5), "1": pytest.approx(0.51)}
    assert {p.value for p in points[M.HW_GPU_MEMORY_USAGE]} == {1000, 2000}
    assert points[M.HW_GPU_MEMORY_UTILIZATION][0].value == pytest.approx(0.2)


def test_no_nvml_is_one_log_line_and_nothing_else(caplog):
    class Broken:
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    with caplog.at_level(logging.INFO, logger="infersight.instrumentation"):
        assert register_gpu_gauges(mp.get_meter("t"), nvml=Broken(), find_device=lambda: None) is False
    assert len(caplog.records) == 1 and "NVML" in caplog.records[0].getMessage()
    assert caplog.records[0].levelno == logging.INFO  # a CPU pod: nothing to warn about
    assert metric_points(reader) == {}


def test_nvml_bindings_come_with_the_base_install():
    import importlib.util

    assert importlib.util.find_spec("pynvml") is not None  # nvidia-ml-py: no extra needed for GPU gauges


NVMLError_LibraryNotFound = type("NVMLError_LibraryNotFound", (Exception,), {})  # as pynvml names its errors


@pytest.mark.parametrize("failure, cause, fix", [
    (NVMLError_LibraryNotFound("NVML Shared Library Not Found"), "libnvidia-ml.so.1", "NVIDIA_DRIVER_CAPABILITIES"),
    (OSError("libnvidia-ml.so.1: cannot open shared object file"), "libnvidia-ml.so.1", "NVIDIA Container Toolkit"),
    (ImportError("No module named 'pynvml'"), "nvidia-ml-py", "pip install nvidia-ml-py"),
], ids=["library-not-found", "dlopen", "no-bindings"])
def test_a_gpu_device_without_nvml_is_one_warning_with_cause_and_fix(caplog, failure, cause, fix):
    class Broken:
        def nvmlInit(self):
            raise failure

    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    with caplog.at_level(logging.INFO, logger="infersight.instrumentation"):
        assert register_gpu_gauges(mp.get_meter("t"), nvml=Broken(), find_device=lambda: "/dev/nvidia0") is False
    (record,) = caplog.records
    message = record.getMessage()
    assert record.levelno == logging.WARNING and "/dev/nvidia0" in message
    assert cause in message and "Fix: " in message and fix in message.split("Fix: ", 1)[1]
    assert metric_points(reader) == {}


def test_without_nvml_bindings_a_gpu_device_is_still_warned_about(caplog, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with caplog.at_level(logging.INFO, logger="infersight.instrumentation"):
        assert register_gpu_gauges(MeterProvider().get_meter("t"), find_device=lambda: "/dev/nvidia3") is False
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "pip install nvidia-ml-py" in record.getMessage()


def test_a_gpu_device_that_nvml_does_not_see_is_warned_about(caplog):
    class NoDevices(FakeNvml):
        def nvmlDeviceGetCount(self):
            return 0

    with caplog.at_level(logging.INFO, logger="infersight.instrumentation"):
        assert register_gpu_gauges(MeterProvider().get_meter("t"), nvml=NoDevices(),
                                   find_device=lambda: "/dev/nvidia0") is False
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "NVIDIA_VISIBLE_DEVICES" in record.getMessage()


def test_gpu_device_nodes_are_found_by_name(tmp_path, monkeypatch):
    from infersight.instrumentation import gpu

    monkeypatch.setattr(gpu.glob, "glob", lambda pattern: ["/dev/nvidia1", "/dev/nvidia0", "/dev/nvidiactl"]
                        if pattern.startswith("/dev/nvidia") else [])
    assert gpu.gpu_device() == "/dev/nvidia0"
    monkeypatch.setattr(gpu.glob, "glob", lambda pattern: [])
    assert gpu.gpu_device() is None


def test_settings_from_environment(caplog):
    s = Settings.from_env({"INFERSIGHT_REGION": "ap-south-1", "INFERSIGHT_DEPLOYMENT_TRACK": "Canary",
                           "INFERSIGHT_MODEL_VERSION": "2024-06", "INFERSIGHT_CAPTURE_CONTENT": "true"})
    assert (s.region, s.track, s.model_version, s.capture_content) == ("ap-south-1", "canary", "2024-06", True)
    assert s.resource_attributes() == {A.CLOUD_REGION: "ap-south-1", A.DEPLOYMENT_TRACK: "canary",
                                       A.MODEL_VERSION: "2024-06"}
    with caplog.at_level(logging.WARNING, logger="infersight.instrumentation"):
        bad = Settings.from_env({"INFERSIGHT_DEPLOYMENT_TRACK": "blue"})
    assert bad.track == "stable" and "INFERSIGHT_DEPLOYMENT_TRACK" in caplog.text
    assert Settings.from_env({}).capture_content is False
    assert Settings.from_env({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "1"}).capture_content
