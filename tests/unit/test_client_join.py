"""The client TTFT join (issue #22), pure parts: real client and server spans (the OpenAI client instrumentation
calling, over an httpx transport, a handler instrumented with ``Instrumentation``) through normalize's core into
client-call halves; the join per trace (parent first, time second, timeouts, bounds); the totals as OTLP."""

from __future__ import annotations

import json
import time

import orjson
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infersight.flink_jobs.metrics import client_join as J
from infersight.flink_jobs.normalize.client_calls import client_halves
from infersight.flink_jobs.normalize.core import normalize
from infersight.instrumentation import Instrumentation, Settings
from infersight.instrumentation.openai_client import OpenAIClientInstrumentor
from infersight.schemas import attributes as A
from infersight.schemas import client_calls as C
from infersight.schemas import pipeline as P
from infersight.schemas.metrics import TTFT_BUCKETS
from infersight.schemas.records import parse_batch
from infersight.schemas.topics import CLIENT_CALLS, DLQ, OTLP_REQUESTS, REQUESTS
from tests.support.otlp_requests import encode_requests
from tests.support.sample_requests import sample_records

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
NS = 1_000_000_000


def _run(payload: bytes, now_ns: int | None = None) -> dict[str, list]:
    out: dict[str, list] = {}
    for topic, value, _t in normalize(OTLP_REQUESTS.name, 0, 7, payload, now_ns or time.time_ns()):
        out.setdefault(topic, []).extend(parse_batch(value) if topic != DLQ.name else [json.loads(value)])
    return out


def _called_request() -> tuple[bytes, object, object]:
    """One streamed chat: the real OpenAI client instrumented, the server side instrumented with our SDK under the
    client's traceparent. Returns the OTLP payload of both spans (as a gateway batch), the client span and the
    server's root span."""
    client_spans, server_spans = InMemorySpanExporter(), InMemorySpanExporter()
    client_tp = TracerProvider(resource=Resource.create({A.CLOUD_REGION: "client-laptop"}))
    client_tp.add_span_processor(SimpleSpanProcessor(client_spans))
    server_tp = TracerProvider(resource=Resource.create({A.CLOUD_REGION: "eu-west-1"}))
    server_tp.add_span_processor(SimpleSpanProcessor(server_spans))
    server = Instrumentation(tracer_provider=server_tp, gpu=False, settings=Settings(region="eu-west-1"))

    def handler(request):
        with server.request("served-model", headers=dict(request.headers)) as req:
            time.sleep(0.002)
            req.first_token()
            req.token()
            req.usage(input_tokens=3, output_tokens=2)
            req.finish("stop")
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "served-model",
                 "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
        body = b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    inst = OpenAIClientInstrumentor(tracer_provider=client_tp)
    inst.instrument()
    try:
        client = openai.OpenAI(base_url="http://server:8000/v1", api_key="x", max_retries=0,
                               http_client=httpx.Client(transport=httpx.MockTransport(handler)))
        for _chunk in client.chat.completions.create(model="asked-model", stream=True,
                                                     messages=[{"role": "user", "content": "q"}]):
            pass
    finally:
        inst.uninstrument()
    (client_span,) = client_spans.get_finished_spans()
    root = next(s for s in server_spans.get_finished_spans() if A.E2E in s.attributes)
    payload = encode_spans([client_span, *server_spans.get_finished_spans()]).SerializeToString()
    return payload, client_span, root


def test_real_client_and_server_spans_become_two_halves_that_join_with_the_clients_ttft_exactly():
    payload, client_span, root = _called_request()
    out = _run(payload)
    assert DLQ.name not in out
    [record] = out[REQUESTS.name]  # the client span is never a request record
    assert record["model"] == "served-model" and record["region"] == "eu-west-1"
    halves = {h["side"]: h for h in out[CLIENT_CALLS.name]}
    assert set(halves) == {C.CLIENT, C.SERVER} and not any(C.problems(h) for h in halves.values())
    client, server = halves[C.CLIENT], halves[C.SERVER]
    assert client["ttft_s"] == client_span.attributes[A.CLIENT_TTFT]  # the client's own value, unchanged
    assert client["model"] == "asked-model" and client["span_id"] == format(client_span.context.span_id, "016x")
    assert server["parent_span_id"] == client["span_id"]  # the traceparent made the request span its child
    assert server["trace_id"] == client["trace_id"] == record["trace_id"]
    assert server["span_id"] == format(root.context.span_id, "016x") and server["ttft_s"] == record["ttft_s"]

    pending, outcome = J.add(None, server, 1000)
    assert not outcome.joined and pending.servers
    pending, outcome = J.add(pending, client, 1500)
    [joined] = outcome.joined
    assert not pending and joined.region == "eu-west-1" and joined.model == "served-model"
    assert joined.client_ttft_s == client_span.attributes[A.CLIENT_TTFT]
    assert joined.outside_server_s == pytest.approx(client["ttft_s"] - record["ttft_s"])
    assert joined.outside_server_s >= 0  # causality: the client sees the token after the server sent it


def test_a_root_request_span_makes_no_server_half_and_a_payload_without_client_spans_is_not_decoded_twice():
    records = list(sample_records(5, time.time_ns() - 5 * NS, 2.0, seed=3))
    out = _run(encode_requests(records))
    assert len(out[REQUESTS.name]) == 5 and CLIENT_CALLS.name not in out
    assert list(client_halves(b"not even protobuf", time.time_ns())) == []  # the marker is not in it


def _client_span(ttft: object = 0.25, model: str | None = "m", start_ns: int | None = None,
                 duration_s: float = 1.0) -> bytes:
    start = start_ns or time.time_ns() - 5 * NS
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key=A.CLOUD_REGION, value=AnyValue(string_value="us-east-1")))
    span = rs.scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name, span.kind = bytes(range(1, 17)), bytes(range(1, 9)), "chat m", \
        Span.SPAN_KIND_CLIENT
    span.start_time_unix_nano, span.end_time_unix_nano = start, start + int(duration_s * NS)
    if model is not None:
        span.attributes.append(KeyValue(key=A.GEN_AI_REQUEST_MODEL, value=AnyValue(string_value=model)))
    value = (AnyValue(string_value=ttft) if isinstance(ttft, str) else AnyValue(bool_value=ttft)
             if isinstance(ttft, bool) else AnyValue(double_value=ttft))
    span.attributes.append(KeyValue(key=A.CLIENT_TTFT, value=value))
    return req.SerializeToString()


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"ttft": "fast"}, f"{A.CLIENT_TTFT}: expected double"),
    ({"ttft": True}, f"{A.CLIENT_TTFT}: expected double"),
    ({"ttft": -0.5}, f"{A.CLIENT_TTFT}: must be a finite non-negative"),
    ({"ttft": float("nan")}, f"{A.CLIENT_TTFT}: must be a finite non-negative"),
    ({"ttft": 2.0}, f"{A.CLIENT_TTFT}: 2.0 exceeds the span's duration"),
    ({"model": None}, f"{A.GEN_AI_REQUEST_MODEL}: missing"),
    ({"start_ns": 1_000_000}, "start_time_unix_nano:"),
])
def test_a_malformed_client_span_is_dead_lettered_with_its_reason_and_never_a_record(kwargs, field):
    out = _run(_client_span(**kwargs))
    [letter] = out[DLQ.name]
    assert letter["reason"].startswith("client span: ") and any(p.startswith(field) for p in letter["problems"])
    assert letter["trace_id"] == bytes(range(1, 17)).hex()
    assert REQUESTS.name not in out and CLIENT_CALLS.name not in out
    replay = ExportTraceServiceRequest.FromString(__import__("base64").b64decode(letter["raw_base64"]))
    assert replay.resource_spans[0].scope_spans[0].spans[0].name == "chat m"  # the span alone, to replay


def test_a_valid_client_span_alone_is_a_client_half_with_its_gateways_region_kept_apart():
    [half] = _run(_client_span(0.25))[CLIENT_CALLS.name]
    assert half["side"] == C.CLIENT and half["ttft_s"] == 0.25 and half["region"] == "us-east-1"
    assert half["parent_span_id"] == "" and not C.problems(half)


# ---- the join ----

def _half(side: str, span: str, parent: str = "", start_s: float = 0.0, end_s: float = 1.0, model: str = "m",
          region: str | None = "eu-west-1", ttft: float | None = 0.2, trace: str = "ab" * 16) -> dict:
    return {"side": side, "trace_id": trace, "span_id": span, "parent_span_id": parent, "model": model,
            "region": region if side == C.SERVER else None, "start_ns": int((100 + start_s) * NS),
            "end_ns": int((100 + end_s) * NS), "ttft_s": ttft}


A1, A2, S1, S2 = "a1" * 8, "a2" * 8, "51" * 8, "52" * 8


def test_either_half_may_come_first_and_the_result_is_the_same():
    client = _half(C.CLIENT, A1, ttft=0.3)
    server = _half(C.SERVER, S1, parent=A1, start_s=0.01, end_s=0.9, ttft=0.25, region="ap-southeast-1")
    for first, second in ((client, server), (server, client)):
        pending, outcome = J.add(None, first, 0)
        assert not outcome.joined
        pending, outcome = J.add(pending, second, 10)
        assert outcome.joined == [J.Joined("ap-southeast-1", "m", 0.3, 0.25)] and not pending


def test_two_calls_in_one_trace_join_by_parent_even_against_the_clock():
    # the second call's server half arrives first and also lies within the first call (a skewed clock):
    # its parent says whose it is
    c1 = _half(C.CLIENT, A1, start_s=0.0, end_s=5.0, ttft=0.1)
    c2 = _half(C.CLIENT, A2, start_s=0.1, end_s=5.0, ttft=0.9)
    s2 = _half(C.SERVER, S2, parent=A2, start_s=0.2, end_s=4.0, model="second")
    s1 = _half(C.SERVER, S1, parent=A1, start_s=0.05, end_s=4.0, model="first")
    pending, joined = None, []
    for half in (c1, s2, c2, s1):
        pending, outcome = J.add(pending, half, 0)
        joined += outcome.joined
    assert sorted((j.model, j.client_ttft_s) for j in joined) == [("first", 0.1), ("second", 0.9)]
    assert not pending


def test_without_the_parent_link_a_call_joins_the_request_within_it_at_the_timeout_give_or_take_the_tolerance():
    client = _half(C.CLIENT, A1, start_s=1.0, end_s=2.0, ttft=0.4)
    proxied = _half(C.SERVER, S1, parent="77" * 8, start_s=0.8, end_s=1.9)  # under a proxy's span, 0.2 s skew
    pending, outcome = J.add(None, client, 0)
    pending, outcome = J.add(pending, proxied, 5)
    assert not outcome.joined and len(pending.clients) == len(pending.servers) == 1  # not yet: by parent only
    strict, outcome = J.expire(J.Pending(list(pending.clients), list(pending.servers)), 60_000, 60_000,
                               tolerance_ns=int(0.1 * NS))
    assert not outcome.joined and len(outcome.unmatched_clients) == 1 and strict.servers  # beyond 0.1 s
    pending, outcome = J.expire(pending, 60_000, 60_000, tolerance_ns=int(0.5 * NS))
    assert outcome.joined == [J.Joined("eu-west-1", "m", 0.4, 0.2)] and not pending


def test_halves_alone_expire_after_the_timeout_clients_as_unmatched_servers_dropped():
    pending, _ = J.add(None, _half(C.CLIENT, A1), 1_000)
    pending, _ = J.add(pending, _half(C.SERVER, S1, parent="77" * 8, start_s=50, end_s=51), 3_000)  # no match
    assert pending.deadline(60_000) == 61_000
    pending, outcome = J.expire(pending, 60_999, 60_000)
    assert not outcome.unmatched_clients and pending
    pending, outcome = J.expire(pending, 61_000, 60_000)
    assert [c["span_id"] for c in outcome.unmatched_clients] == [A1] and outcome.dropped_servers == 0
    assert pending.deadline(60_000) == 63_000
    pending, outcome = J.expire(pending, 63_000, 60_000)
    assert outcome.dropped_servers == 1 and not pending and pending.deadline(60_000) is None


def test_a_trace_holds_at_most_max_pending_halves_per_side():
    pending, unmatched = None, []
    for i in range(J.MAX_PENDING + 3):
        pending, outcome = J.add(pending, _half(C.CLIENT, f"{i + 1:016x}", start_s=10 * i, end_s=10 * i + 1), i)
        unmatched += outcome.unmatched_clients
    assert len(pending.clients) == J.MAX_PENDING
    assert [c["span_id"] for c in unmatched] == [f"{i + 1:016x}" for i in range(3)]  # the oldest went


def test_totals_are_ttft_histograms_per_region_and_model_and_an_unmatched_count_per_model():
    totals = J.Totals(start_ns=5 * NS)
    joined = J.Joined("eu-west-1", "m", 0.2, 0.15)
    key = J.joined_key(joined)
    totals.add(joined)
    batch = ExportMetricsServiceRequest.FromString(J.encode(key, totals, 9 * NS))
    metrics = {m.name + ":" + m.WhichOneof("data"): m for m in batch.resource_metrics[0].scope_metrics[0].metrics}
    hist = metrics[P.CLIENT_TTFT + ":histogram"].histogram.data_points[0]
    labels = {kv.key: kv.value.string_value for kv in hist.attributes}
    assert labels == {P.LABEL_REGION: "eu-west-1", P.LABEL_MODEL: "m"}
    assert list(hist.explicit_bounds) == list(TTFT_BUCKETS) and hist.count == 1 and hist.sum == 0.2
    assert hist.bucket_counts[TTFT_BUCKETS.index(0.25)] == 1  # (0.1, 0.25]
    assert (hist.start_time_unix_nano, hist.time_unix_nano) == (5 * NS, 9 * NS)
    assert metrics[P.CLIENT_TTFT + ":exponential_histogram"].exponential_histogram.data_points[0].count == 1
    outside = metrics[P.CLIENT_OUTSIDE_SERVER + ":histogram"].histogram.data_points[0]
    assert outside.count == 1 and outside.sum == pytest.approx(0.05)

    unmatched = J.Totals(start_ns=5 * NS)
    client = _half(C.CLIENT, A1, model="asked")
    for _ in range(2):
        unmatched.add(client)
    batch = ExportMetricsServiceRequest.FromString(J.encode(J.unmatched_key(client), unmatched, 9 * NS))
    [metric] = batch.resource_metrics[0].scope_metrics[0].metrics
    point = metric.sum.data_points[0]
    assert metric.name == P.CLIENT_UNMATCHED and point.as_double == 2
    assert {kv.key: kv.value.string_value for kv in point.attributes} == {P.LABEL_MODEL: "asked"}  # no region


def test_a_joined_call_without_a_server_ttft_has_no_outside_server_value():
    totals = J.Totals(0).add(J.Joined("r", "m", 0.2, None))
    assert totals.ttft.n == 1 and totals.outside.n == 0


def test_read_halves_dead_letters_what_breaks_the_contract_and_keeps_the_rest():
    good = _half(C.SERVER, S1, parent=A1)
    bad = {**_half(C.CLIENT, A1), "ttft_s": None}
    letters: list[str] = []
    assert J.read_halves(orjson.dumps([good, bad, 7]), letters) == [good]
    reasons = [json.loads(letter)["reason"] for letter in letters]
    assert reasons[0] == "ttft_s: missing on a client half" and reasons[1].startswith("client call: not a JSON")
    letters = []
    assert J.read_halves(b"{nope", letters) == [] and json.loads(letters[0])["reason"].startswith("payload:")


def test_the_schema_names_each_bad_field():
    ok = _half(C.SERVER, S1, parent=A1)
    assert C.problems(ok) == []
    for change, field in (({"side": "proxy"}, "side:"), ({"trace_id": "0" * 32}, "trace_id:"),
                          ({"span_id": "XYZ"}, "span_id:"), ({"parent_span_id": "0" * 16}, "parent_span_id:"),
                          ({"model": ""}, "model:"), ({"region": None}, "region:"), ({"end_ns": 1}, "end_ns:"),
                          ({"start_ns": True}, "start_ns:"), ({"ttft_s": float("inf")}, "ttft_s:")):
        problems = C.problems({**ok, **change})
        assert problems and problems[0].startswith(field), (change, problems)


# ---- the Flink functions, on fakes of what they ask of Flink ----

class _State:
    def __init__(self):
        self.v = None

    def value(self):
        return self.v

    def update(self, v):
        self.v = v

    def clear(self):
        self.v = None


class _Runtime:
    def __init__(self):
        self.states, self.counters = {}, {}

    def get_state(self, descriptor):
        self.states[descriptor.name] = (_State(), descriptor)
        return self.states[descriptor.name][0]

    def get_metrics_group(self):
        runtime = self

        class Group:
            def counter(self, name):
                class Counter:
                    n = 0

                    def inc(self, k=1):
                        self.n += k
                runtime.counters[name] = Counter()
                return runtime.counters[name]
        return Group()


class _Ctx:
    def __init__(self, key=None):
        self.now, self.timers, self.key = 0, set(), key

    def timer_service(self):
        ctx = self

        class Timers:
            def current_processing_time(self):
                return ctx.now

            def register_processing_time_timer(self, t):
                ctx.timers.add(t)

            def delete_processing_time_timer(self, t):
                ctx.timers.discard(t)
        return Timers()

    def get_current_key(self):
        return self.key


def test_the_join_function_keeps_one_timer_per_waiting_trace_and_clears_what_is_joined_or_expired():
    from infersight.flink_jobs.metrics import functions as F

    join = F.JoinClientCalls(timeout_ms=10_000, tolerance_ns=int(0.5 * NS))
    runtime, ctx = _Runtime(), _Ctx()
    join.open(runtime)
    state, descriptor = runtime.states["pending"]
    assert descriptor._ttl_config.get_ttl().to_milliseconds() == 20_000  # the TTL backs the timer up
    server = _half(C.SERVER, S1, parent=A1, ttft=0.15)
    ctx.now = 1_000
    assert list(join.process_element((server["trace_id"], server), ctx)) == [] and ctx.timers == {11_000}
    ctx.now = 2_000
    [(key, joined)] = list(join.process_element((server["trace_id"], _half(C.CLIENT, A1, ttft=0.2)), ctx))
    assert key == J.joined_key(joined) and joined == J.Joined("eu-west-1", "m", 0.2, 0.15)
    assert state.value() is None and ctx.timers == set()  # joined: nothing waits, no timer left

    lonely = _half(C.CLIENT, A2, model="asked")
    assert list(join.process_element((lonely["trace_id"], lonely), ctx)) == [] and ctx.timers == {12_000}
    ctx.timers.clear()  # it fires
    [(key, client)] = list(join.on_timer(12_000, ctx))
    assert key == J.unmatched_key(lonely) and client is lonely and state.value() is None and ctx.timers == set()
    assert (runtime.counters["client_calls_joined"].n, runtime.counters["client_calls_unmatched"].n) == (1, 1)


def test_the_totals_function_emits_at_most_once_a_second_stamped_in_order():
    from infersight.flink_jobs.metrics import functions as F

    cumulate = F.CumulateClient(ttl_s=3600)
    runtime, ctx = _Runtime(), _Ctx()
    cumulate.open(runtime)
    joined = J.Joined("eu-west-1", "m", 0.2, 0.15)
    ctx.key, ctx.now = J.joined_key(joined), 5_300
    for _ in range(3):
        assert cumulate.process_element((ctx.key, joined), ctx) is None  # nothing before the timer
    assert ctx.timers == {6_000}
    stamps = []
    for t in (6_000, 7_000):
        [encoded] = list(cumulate.on_timer(t, ctx))
        point = ExportMetricsServiceRequest.FromString(encoded).resource_metrics[0].scope_metrics[0].metrics[0]
        assert point.histogram.data_points[0].count == 3
        stamps.append(point.histogram.data_points[0].time_unix_nano)
    assert stamps[1] > stamps[0]
