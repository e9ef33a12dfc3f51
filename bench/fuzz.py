"""Coverage-guided fuzzing of the code that reads untrusted bytes (issue #20): atheris (libFuzzer) runs each
target in its own process for a given time, starting from real payloads (``tests/support/fuzz_seeds.py``).

    python -m bench.fuzz --seconds-per-target 600 [--runs 10000000] [--targets otlp_spans,record_batches] [--parallel 2]
                         [--workers 2]
    python -m bench.fuzz --quick            # 10 s per target, nothing written

Each target runs until ``--seconds-per-target`` (wall) or, with ``--runs``, that many executions, whichever
comes first.

Targets, and what counts as a crash (besides a hang, a native crash or running out of memory):

- ``otlp_spans``: the normaliser's span decoder (``record_dicts_from_payload``) on bytes from the OTLP
  requests topic: any exception but protobuf's ``DecodeError``; a record ``validate`` rejects; a rejection
  without problems or whose span bytes are not one span of OTLP.
- ``otlp_metrics``: the pod-gauge decoder (``gauges_from_payload``) on bytes from the OTLP metrics topic: any
  exception but ``DecodeError``; a gauge of the wrong shape; and, downstream, the metrics job's pod roll-up
  failing on what the normaliser wrote (``infersight.pods``, read back with ``parse_batch``).
- ``record_batches``: an ``infersight.requests`` message as the metrics and archive jobs read it:
  ``parse_batch`` raising anything but ``orjson.JSONDecodeError``; ``validate`` raising on any item (it is
  documented never to); the archive job's ``ParseRecord`` raising (it dead-letters what it cannot read); the
  metrics job's ``PreAggregate`` path (``read_batch``, ``group_batch`` with its rejects, their dead letters,
  the groups' quality signals) or its window results raising; a window's quality-signals record that its contract
  (``schemas.quality_signals.problems``) refuses.
- ``traceparent``: request headers (``name: value`` lines) through ``Instrumentation.request(headers=)``, the
  vLLM adapter's ``RequestParents`` and the Triton helpers: any exception; an ``internal_error`` on
  ``infersight.instrumentation.errors``; a valid W3C ``traceparent`` not continued; ``inject`` then extract
  not continuing the trace.
- ``attributes``: requests with hostile model names, usage values, finish reasons, error types, stages and
  extra attributes through the real SDK providers: any exception out of the API; an ``internal_error``;
  exported spans that our OTLP encoder, the SDK's encoder or the normaliser's decoder cannot handle.

A Python exception is recorded once per signature (type and innermost frame in this repository) with the
input that first raised it, and fuzzing goes on, so one shallow bug does not hide the rest; libFuzzer's own
findings (timeouts, out-of-memory, native crashes) stop the process, which is restarted for the time left.
A timeout is replayed alone in a fresh process (limit 120 s): on a loaded machine a niced worker can be
starved past libFuzzer's wall-clock limit, and a timeout that does not reproduce is listed as
``unreproduced``, not counted. ``crashes`` in the results counts the rest. Every finding becomes a test
in ``tests/unit/test_fuzz_regressions.py``.

Structured targets read their input through ``Data`` (below), a byte reader in plain Python rather than
atheris' ``FuzzedDataProvider``: a finding's bytes then replay identically in the unit tests, which run
without atheris.

Results: ``bench/results/fuzz.json`` (``bench.results_file.save_results``). Run from a clean checkout of a
commit (``git worktree add``; with an editable install, put a folder on ``PYTHONPATH`` whose ``infersight``
links the checkout's component folders, as ``pyproject.toml``'s package-dir maps them) so the recorded
commit is the code that was fuzzed. ``--merge`` replaces only the targets run, keeping the others' entries; each
entry carries its own ``commit`` and ``measured_at`` (the goal is hours of one core per target, run target by target).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import math
import re
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "fuzz.json"


class Violation(Exception):
    """A property of a target broken without an exception from the code under test; the text before the
    first colon names the property (it is the finding's signature)."""


# ---------------------------------------------------------------------------------------------- input reader

class Data:
    """Structured values from fuzz bytes, deterministic and in plain Python (see the module doc). Reads past
    the end give zeros, so every input is a complete case."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def byte(self) -> int:
        pos = self.pos
        if pos < len(self.buf):
            self.pos = pos + 1
            return self.buf[pos]
        return 0

    def take(self, n: int) -> bytes:
        out = self.buf[self.pos:self.pos + n]
        self.pos += len(out)
        return out

    def int_in(self, lo: int, hi: int) -> int:
        span = hi - lo
        if span <= 0:
            return lo
        raw = self.take((span.bit_length() + 7) // 8)
        return lo + int.from_bytes(raw, "little") % (span + 1)

    def flag(self) -> bool:
        return bool(self.byte() & 1)

    def pick(self, seq: Any) -> Any:
        return seq[self.int_in(0, len(seq) - 1)]

    def text(self, max_len: int = 64) -> str:
        """A string: ASCII, UTF-8 (replacement characters), or UTF-16 code units (lone surrogates too)."""
        mode, n = self.byte() % 4, self.int_in(0, max_len)
        if mode == 0:
            return self.take(n).decode("latin-1")
        if mode == 1:
            return self.take(n).decode("utf-8", "replace")
        if mode == 2:
            raw = self.take(2 * n)
            return "".join(chr(int.from_bytes(raw[i:i + 2], "little")) for i in range(0, len(raw) - 1, 2))
        return self.pick(_TEXTS)

    def integer(self) -> int:
        if self.flag():
            return self.pick(_INTS)
        return int.from_bytes(self.take(8), "little", signed=True)

    def real(self) -> float:
        if self.flag():
            return self.pick(_FLOATS)
        raw = self.take(8)
        return struct.unpack("<d", raw.ljust(8, b"\0"))[0]

    def value(self, depth: int = 0) -> Any:
        """Any value a caller might pass as an attribute, a count or a name."""
        kind = self.byte() % 13
        if kind <= 2:
            return self.text()
        if kind == 3:
            return self.integer()
        if kind == 4:
            return self.real()
        if kind == 5:
            return self.flag()
        if kind == 6:
            return None
        if kind == 7:
            return self.take(self.int_in(0, 16))
        if kind == 8 and depth < 3:
            return [self.value(depth + 1) for _ in range(self.int_in(0, 4))]
        if kind == 9 and depth < 3:
            return tuple(self.text(8) for _ in range(self.int_in(0, 4)))
        if kind == 10 and depth < 3:
            return {self.text(8): self.value(depth + 1) for _ in range(self.int_in(0, 3))}
        if kind == 11:
            return 2 ** self.int_in(62, 130) * (-1 if self.flag() else 1)
        return self.pick(_TEXTS)


_TEXTS = ("", " ", "stop", "length", "error", "llama-3-8b", "chat", "queue", "prefill", "decode", "safety",
          "\x1f", "a\x1fb", "\x00", "\ud800", "\udfff\ud800", "\u202e", "é", "😀", "x" * 300, "x" * 5000,
          "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "nan", "-1", "1e309", "None", "{}")
_INTS = (0, 1, -1, 2, 255, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, -2**63, -2**63 - 1, 2**64, 2**64 - 1, 10**30)
_FLOATS = (0.0, -0.0, 1.0, -1.0, 0.5, 1e-9, 5e-324, 1e308, -1e308, math.inf, -math.inf, math.nan, 2.0**63, 1e19)


# ---------------------------------------------------------------------------------------------- targets

def make_otlp_spans() -> Callable[[bytes], None]:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from infersight.flink_jobs.normalize.span_records import Rejected, record_dicts_from_payload
    from infersight.schemas.records import dump_batch, validate
    from tests.support.fuzz_seeds import NOW_NS

    def check(data: bytes) -> None:
        try:
            items = list(record_dicts_from_payload(data, NOW_NS))
        except DecodeError:
            return
        records = []
        for item in items:
            if isinstance(item, Rejected):
                if not item.problems or not all(isinstance(p, str) and p for p in item.problems):
                    raise Violation(f"rejection-without-problems: {item.problems!r}")
                try:
                    single = ExportTraceServiceRequest.FromString(item.span_bytes)
                except DecodeError as exc:
                    raise Violation(f"rejected-span-bytes-undecodable: {exc}") from exc
                spans = [s for rs in single.resource_spans for ss in rs.scope_spans for s in ss.spans]
                if len(spans) != 1 or not isinstance(item.trace_id, str):
                    raise Violation(f"rejection-not-one-span: {len(spans)} spans")
                json.dumps(item.problems)  # the dead letter's JSON
            elif isinstance(item, dict):
                problems = validate(item)
                if problems:
                    raise Violation(f"record-breaks-contract: {problems}")
                records.append(item)
            else:
                raise Violation(f"unexpected-item: {type(item).__name__}")
        if records:
            dump_batch(records)  # the infersight.requests message

    return check


def make_otlp_metrics() -> Callable[[bytes], None]:
    from google.protobuf.message import DecodeError

    from infersight.flink_jobs.metrics import core as metrics
    from infersight.flink_jobs.normalize.pod_gauges import gauges_from_payload
    from infersight.schemas.pipeline import POD_GAUGE_STATS
    from infersight.schemas.records import dump_batch
    from infersight.schemas.topics import PODS
    from infersight.schemas.units import MS

    pricing = metrics.Pricing.load(None)
    window_ms = 10_000
    shape = {"region": str, "pod": str, "metric": str, "value": float, "time_ns": int, "gpu_type": str,
             "gpu_count": int, "engine": str}  # at least these keys, of these types

    def check(data: bytes) -> None:
        try:
            items = list(gauges_from_payload(data))
        except DecodeError:
            return
        gauges = []
        for item in items:
            if isinstance(item, str):
                if not item:
                    raise Violation("empty-problem: a dead letter without a reason")
                continue
            if (not isinstance(item, dict) or not shape.keys() <= item.keys()
                    or any(type(item[k]) is not t for k, t in shape.items())
                    or not item["region"] or item["metric"] not in POD_GAUGE_STATS or item["time_ns"] <= 0):
                raise Violation(f"gauge-shape: {item!r:.300}")
            gauges.append(item)
        if not gauges:
            return
        # downstream: what the normaliser writes to infersight.pods, as the metrics job's PreAggregatePods reads it
        letters: list[str] = []
        rejected: list[Any] = []
        groups, _late = metrics.group_gauges(metrics.read_batch(dump_batch(gauges), PODS.name, letters), window_ms,
                                             -2**63, rejected)
        for letter in letters + metrics.dead_letters(rejected, PODS.name):
            json.loads(letter)
        totals = {"gpu_seconds": 0.0, "cost_usd": 0.0, "idle_usd": 0.0}
        for (key, end_ms), points in groups.items():  # key: a deployment or one of its roll-ups
            window = metrics.PodWindow.of(points)
            gpu_s, cost, idle = window.cost(window_ms / 1000, pricing)
            totals["gpu_seconds"] += gpu_s
            totals["cost_usd"] += cost
            totals["idle_usd"] += idle
            metrics.encode_pods(key, end_ms * MS, window, totals, end_ms * MS - window_ms * MS)

    return check


def make_record_batches() -> Callable[[bytes], None]:
    import orjson

    from infersight.flink_jobs.archive.functions import ParseRecord
    from infersight.flink_jobs.common.keys import global_key
    from infersight.flink_jobs.common.request_signals import signal_rows
    from infersight.flink_jobs.metrics import core as metrics
    from infersight.flink_jobs.metrics.quality_signals import signals_record
    from infersight.flink_jobs.metrics.window_stats import Cumulative, fact_of, window_of, window_of_groups
    from infersight.schemas.quality_signals import problems as quality_signal_problems
    from infersight.schemas.records import parse_batch, validate
    from infersight.schemas.topics import REQUESTS
    from infersight.schemas.units import MS

    archive = ParseRecord(60_000)
    window_ms = 10_000

    def check(data: bytes) -> None:
        text = data.decode("utf-8", "replace")  # both jobs read the topic's values as strings
        for _ in archive.flat_map(text):  # the archive job's ParseRecord: dead-letters what it cannot read
            pass
        try:
            items = parse_batch(data)
        except orjson.JSONDecodeError:
            items = []
        if not isinstance(items, list):
            raise Violation(f"batch-not-a-list: {type(items).__name__}")
        for item in items:
            validate(item)  # documented never to raise
        # the metrics job's PreAggregate: the batch, its groups (off-contract items rejected), their dead letters
        letters: list[str] = []
        records = metrics.read_batch(text, REQUESTS.name, letters)
        rejected: list[Any] = []
        groups, late = metrics.group_batch(records, window_ms, NOW_MS, rejected)
        letters += metrics.dead_letters(rejected, REQUESTS.name)
        for letter in letters:
            json.loads(letter)
        # ... and its window results, from what it grouped, with their quality signals (schemas.quality_signals)
        rows = signal_rows(list(groups.values())).tolist()
        for ((key, end_ms), group), row in zip(groups.items(), rows, strict=True):
            stats = window_of_groups([([fact_of(record) for record in group], tuple(row))])
            end_ns = end_ms * MS
            cumulative = Cumulative(end_ns - window_ms * MS).add_window(stats)
            metrics.encode_window(key, end_ns, stats, cumulative)
            metrics.encode_window(global_key(key), end_ns, stats, cumulative)
            signals = json.loads(signals_record(key, end_ns, stats, window_ms))
            if quality_signal_problems(signals):
                raise Violation(f"quality-signals-off-contract: {quality_signal_problems(signals)[0]}")
        for key, group in late.items():
            stats = window_of(group)
            start = min(r["end_ns"] for r in group)
            metrics.encode_totals(key, start + MS, Cumulative(start).add_window(stats))

    return check


NOW_MS = 1_780_000_000 * 1000 - 30_000  # the metrics job's watermark: half a minute before the seeds' clock


def _parse_headers(data: bytes) -> dict[str, str]:
    """``name: value`` lines (latin-1, as ASGI servers decode header bytes); later lines win."""
    headers: dict[str, str] = {}
    for line in data.decode("latin-1").split("\n"):
        name, sep, value = line.rstrip("\r").partition(":")
        if sep:
            headers[name.strip()] = value.strip()
    return headers


_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


def _finished_spans() -> Any:
    """A span processor keeping the sampled spans it is handed, as ``SimpleSpanProcessor(InMemorySpanExporter())``
    does (``get_finished_spans``, ``clear``), without the per-span context attach/detach, export call and lock
    (a fuzz target runs one input at a time): the provider, the instrumentation's span path (a processor that is
    not a BatchSpanProcessor gets ``on_end``) and the spans are the same."""
    from opentelemetry.sdk.trace import SpanProcessor

    class FinishedSpans(SpanProcessor):
        def __init__(self) -> None:
            self.spans: list[Any] = []

        def on_end(self, span: Any) -> None:
            if span.context.trace_flags.sampled:
                self.spans.append(span)

        def get_finished_spans(self) -> tuple[Any, ...]:
            return tuple(self.spans)

        def clear(self) -> None:
            self.spans.clear()

    return FinishedSpans()


def _instrumented() -> tuple[Any, Any, list[tuple[str, str]]]:
    """An SDK tracer provider keeping its finished spans in memory (``_finished_spans``), one Instrumentation on
    it, and the bad inputs it counts (``(kind, detail)``, also counted as usual). Made once per target process
    (and per regression test), never per input."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from infersight.instrumentation import Instrumentation, Settings

    exporter = _finished_spans()
    provider = TracerProvider(resource=Resource.create({"cloud.region": "us-east-1"}))
    provider.add_span_processor(exporter)
    inst = Instrumentation(tracer_provider=provider, meter_provider=MeterProvider(),
                           settings=Settings(capture_content=True), gpu=False)
    bad_inputs: list[tuple[str, str]] = []
    count = inst.self_telemetry.bad_input

    def bad_input(kind: str, detail: str) -> None:
        bad_inputs.append((kind, detail))
        count(kind, detail)

    inst.self_telemetry.bad_input = bad_input
    return inst, exporter, bad_inputs


def make_traceparent() -> Callable[[bytes], None]:
    from opentelemetry import propagate

    from infersight.instrumentation.selftelemetry import INTERNAL
    from infersight.instrumentation.triton.client import trace_headers
    from infersight.instrumentation.triton.python_backend import request_parent_context
    from infersight.instrumentation.vllm_adapter.tracecontext import RequestParents

    inst, exporter, bad_inputs = _instrumented()
    parents = RequestParents(limit=8)

    class TritonRequest:
        def __init__(self, context: str, parameters: str) -> None:
            self.context, self.params = context, parameters

        def trace(self) -> Any:
            return self

        def get_context(self, mode: str = "") -> str:
            return self.context

        def parameters(self) -> str:
            return self.params

    def check(data: bytes) -> None:
        exporter.clear()
        bad_inputs.clear()
        headers = _parse_headers(data)
        with inst.request("m", headers=headers) as req:
            carrier = req.inject({})
        spans = exporter.get_finished_spans()
        if len(spans) != 1:
            raise Violation(f"root-span-count: {len(spans)}")
        root = spans[0]
        parent = headers.get("traceparent")
        match = _TRACEPARENT.fullmatch(parent) if parent is not None else None
        if match and int(match[1], 16) and int(match[2], 16):
            if (root.context.trace_id != int(match[1], 16) or root.parent is None
                    or root.parent.span_id != int(match[2], 16)):
                raise Violation(f"valid-traceparent-not-continued: {headers!r:.300}")
        exporter.clear()
        if carrier:
            with inst.request("m", headers=carrier):
                pass
            children = exporter.get_finished_spans()
            if len(children) != 1 or children[0].context.trace_id != root.context.trace_id:
                raise Violation(f"inject-extract-round-trip: {carrier!r}")
        internal = [detail for kind, detail in bad_inputs if kind == INTERNAL]
        if internal:
            raise Violation(f"internal-error: {internal[0]:.300} (headers {headers!r:.200})")
        # the vLLM adapter: headers remembered by request id, found again by a parallel-sampling child's id
        request_id = headers.get("x-request-id", "cmpl-1")
        parents.headers.put(request_id, dict(headers))
        if request_id and parents.pop_headers(f"0_{request_id}") != headers:
            raise Violation(f"request-parents-lost-headers: {request_id!r}")
        # the Triton client helper: exactly one traceparent, ours, whatever case the caller's had
        out = trace_headers(headers, req.context)
        names = [k for k in out if k.lower() == "traceparent"]
        if names != ["traceparent"]:
            raise Violation(f"trace-headers-not-replaced: {names}")
        # the Triton Python backend: the trace carrier and the request's parameters
        context = json.dumps({k.lower(): v for k, v in headers.items()})
        ctx = request_parent_context(TritonRequest(context, json.dumps(headers)))
        if ctx is not None:
            propagate.inject({}, context=ctx)

    return check


def exported_ok(exporter: Any, bad_inputs: list[tuple[str, str]], what: str) -> None:
    """After a request: no ``internal_error`` counted, and its exported spans encoded by our OTLP encoder (valid
    OTLP), by the SDK's (the OTLP/HTTP exporter's) and read by the normaliser's decoder without an exception."""
    (_exported_ok or _make_exported_ok())(exporter, bad_inputs, what)


_exported_ok: Callable[[Any, list[tuple[str, str]], str], None] | None = None


def _make_exported_ok() -> Callable[[Any, list[tuple[str, str]], str], None]:
    """``exported_ok`` with its imports done once (they ran for every input), and the SDK's encoder run span by
    span once a batch's resource and scope are known (``sdk_encodes``)."""
    global _exported_ok
    from google.protobuf.message import DecodeError
    from opentelemetry.exporter.otlp.proto.common._internal import trace_encoder
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from infersight.flink_jobs.normalize.span_records import record_dicts_from_payload
    from infersight.instrumentation.otlp_encoder import encode_spans
    from infersight.instrumentation.selftelemetry import INTERNAL

    parse, now_ns = ExportTraceServiceRequest.FromString, time.time_ns
    encode_span = getattr(trace_encoder, "_encode_span", None)  # what encode_spans runs per span
    known: dict[tuple[int, int], tuple[Any, Any]] = {}  # (resource, scope) pairs encode_spans has written

    def sdk_encodes(spans: Any) -> None:
        """The SDK encoder's message for ``spans``, serialized. Its whole run (grouping by resource, hashing
        the resource's attributes as JSON for every span, then the resource and scope messages) is the same
        for every input of a target (one provider, one scope): it runs whole whenever a batch holds a resource
        or scope not seen before, and otherwise ``_encode_span`` per span, which is where spans differ (and
        all the SDK encoder's findings so far were)."""
        if encode_span is not None:
            for span in spans:
                if (id(span.resource), id(span.instrumentation_scope)) not in known:
                    break
            else:
                for span in spans:
                    encode_span(span).SerializeToString()
                return
        sdk_encode(spans).SerializeToString()
        for span in spans:  # the objects are kept, so their ids are never reused
            pair = (span.resource, span.instrumentation_scope)
            known[id(pair[0]), id(pair[1])] = pair

    def check(exporter: Any, bad_inputs: list[tuple[str, str]], what: str) -> None:
        for kind, detail in bad_inputs:
            if kind == INTERNAL:
                raise Violation(f"internal-error: {detail:.300} ({what:.100})")
        spans = exporter.get_finished_spans()
        payload = encode_spans(spans)
        try:
            parse(payload)
        except DecodeError as exc:
            raise Violation(f"encoder-wrote-invalid-otlp: {exc}") from exc
        sdk_encodes(spans)
        for _ in record_dicts_from_payload(payload, now_ns()):
            pass

    _exported_ok = check
    return check


def make_attributes() -> Callable[[bytes], None]:
    from infersight.instrumentation import STAGES

    inst, exporter, bad_inputs = _instrumented()
    spans_ok = _exported_ok or _make_exported_ok()
    reasons = ("stop", "length", "abort", "error", "content_filter", "tool_calls", None)

    class ServingError(Exception):
        pass

    def op(req: Any, d: Data, stages: list[Any]) -> None:
        which = d.byte() % 16
        if which == 0:
            name = d.pick(STAGES) if d.flag() else d.value()
            attrs = {d.text(12): d.value() for _ in range(d.int_in(0, 3))}
            stages.append(req.stage(name, **attrs))
        elif which == 1 and stages:
            d.pick(stages).set_attribute(d.value() if d.flag() else d.text(12), d.value())
        elif which == 2 and stages:
            d.pick(stages).end()
        elif which == 3:
            req.first_token()
        elif which == 4:
            req.token()
        elif which == 5:
            req.mark_tokens([d.value() if d.flag() else d.integer() for _ in range(d.int_in(0, 4))])
        elif which == 6:
            req.usage(*(d.value() if d.flag() else d.int_in(0, 10_000) for _ in range(3)))
        elif which == 7:
            req.prefix_cache(d.value(), d.value())
        elif which == 8:
            req.response(d.value(), d.value())
        elif which == 9:
            req.error(d.value() if d.flag() else ServingError(d.text()))
        elif which == 10:
            req.prompt(d.value())
        elif which == 11:
            req.completion(d.value())
        elif which == 12:
            req.evaluation(d.value(), d.value(), d.value(), d.real() if d.flag() else 1.0, d.value())
        elif which == 13:
            stage = req.safety(d.value(), d.value())
            stage.verdict(d.value(), d.value())
            stages.append(stage)
        elif which == 14:
            req.end_stage(d.value())
        else:
            req.finish(d.pick(reasons) if d.flag() else d.value())

    def check(data: bytes) -> None:
        exporter.clear()
        bad_inputs.clear()
        d = Data(data)
        model = d.value() if d.flag() else d.text(300)
        operation = d.value() if d.flag() else None
        raising = d.byte() % 8 == 0
        stages: list[Any] = []
        try:
            with inst.request(model, operation=operation) as req:
                for _ in range(d.int_in(0, 12)):
                    op(req, d, stages)
                if raising:
                    raise ServingError("the server's own failure")
            if raising:
                raise Violation("serving-exception-swallowed")
        except ServingError:
            if not raising:
                raise
        req.evaluation("late", 0.5)  # a judge after the request finished
        spans_ok(exporter, bad_inputs, f"model {model!r:.200}")

    return check


@dataclass(frozen=True)
class Target:
    make: Callable[[], Callable[[bytes], None]]
    seeds: Callable[[], list[bytes]]
    max_len: int
    tokens: tuple[str, ...] = ()  # libFuzzer dictionary entries
    functions: Callable[[], list[Callable[..., Any]]] = lambda: []  # also coverage-instrumented (other packages)


def _seeds(name: str) -> Callable[[], list[bytes]]:
    def seeds() -> list[bytes]:
        from tests.support import fuzz_seeds

        return getattr(fuzz_seeds, name)()
    return seeds


def _random_seeds() -> list[bytes]:
    return [bytes((i * 37 + j * 11) % 256 for j in range(64)) for i in range(8)] + [b"\xff" * 64, b"\x00" * 64]


def _attribute_tokens() -> tuple[str, ...]:
    from infersight.schemas import attributes as A
    from infersight.schemas import triton as T

    names = {v for k, v in vars(A).items() if k.isupper() and isinstance(v, str) and "." in v}
    return tuple(sorted(names | set(T.TRITON_EVENTS) | {T.TRITON_MODEL_NAME, T.TRITON_MODEL_VERSION,
                                                         "llm_request", "us-east-1"}))


def _record_tokens() -> tuple[str, ...]:
    from infersight.schemas.records import FINISH_REASONS, RECORD_FIELDS

    return (*(f'"{f}":' for f in RECORD_FIELDS), *(f'"{r}"' for r in FINISH_REASONS), "null", "true", "1e308",
            "18446744073709551615", "-9223372036854775808", '"\\u001f"', '"\\ud800"', "[{", "}]", '"canary"')


def _w3c_parsers() -> list[Callable[..., Any]]:
    """OpenTelemetry's W3C trace-context and baggage parsing (atheris instruments whole top-level packages
    on import, and the rest of OpenTelemetry would only slow the target down)."""
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from opentelemetry.trace.span import TraceState

    return [TraceContextTextMapPropagator.extract, W3CBaggagePropagator.extract, TraceState.from_header]


TARGETS: dict[str, Target] = {
    "otlp_spans": Target(make_otlp_spans, _seeds("otlp_span_payloads"), 16384, tokens=("attributes",)),
    "otlp_metrics": Target(make_otlp_metrics, _seeds("otlp_metric_payloads"), 8192, tokens=("attributes",)),
    "record_batches": Target(make_record_batches, _seeds("request_batches"), 8192, tokens=("records",)),
    "traceparent": Target(make_traceparent, _seeds("header_blocks"), 2048,
                          tokens=("traceparent: 00-", "tracestate: ", "baggage: ", "Traceparent", "-01", "-00",
                                  "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", "x-request-id: ",
                                  "rojo=00f067aa0ba902b7", "\n"),
                          functions=_w3c_parsers),
    "attributes": Target(make_attributes, _random_seeds, 4096),
}


def _escape(token: str) -> str:
    """A libFuzzer dictionary entry: quoted, with \\xNN for every byte that is not plain printable ASCII."""
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in b'"\\' else f"\\x{b:02x}"
                         for b in token.encode()) + '"'


def dictionary(target: Target) -> list[str]:
    tokens: tuple[str, ...] = ()
    for token in target.tokens:
        if token == "attributes":
            tokens += _attribute_tokens()
        elif token == "records":
            tokens += _record_tokens()
        else:
            tokens += (token,)
    return [_escape(t) for t in tokens]


# ---------------------------------------------------------------------------------------------- findings

def signature(exc: BaseException) -> tuple[str, str]:
    """(signature, where) of a finding. The signature names the exception type and the innermost function
    of this repository it went through (``path:function``, no line number, so it survives edits elsewhere
    in the file); ``where`` adds the line. A ``Violation`` is signed by the property it names."""
    if isinstance(exc, Violation):
        return f"Violation {str(exc).split(':', 1)[0]}", _where(exc.__cause__)[1] if exc.__cause__ else "bench/fuzz.py"
    function, where = _where(exc)
    return f"{type(exc).__name__} at {function}", where


_OUTSIDE = (ROOT / "bench", ROOT / ".venv", ROOT / "tests")


def _where(exc: BaseException) -> tuple[str, str]:
    """The innermost frame in the project's own code (else the innermost of all): ``path:function`` and
    ``path:line function``."""
    inner = ours = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        path = Path(frame.f_code.co_filename).resolve()  # a run from a clean checkout may import via links
        inner = (path, line, frame.f_code.co_name)
        if path.is_relative_to(ROOT) and not any(path.is_relative_to(p) for p in _OUTSIDE):
            ours = inner
    if inner is None:
        return "?", "?"
    path, line, function = ours or inner
    if ours:
        name = str(path.relative_to(ROOT))
    elif "site-packages" in path.parts:
        name = "/".join(path.parts[path.parts.index("site-packages") + 1:])
    else:
        name = path.name
    return f"{name}:{function}", f"{name}:{line} {function}"


def guarded(check: Callable[[bytes], None], findings: Path, artifacts: Path) -> Callable[[bytes], None]:
    """``check`` recording each new exception signature (``findings``: one JSON line each, with the input;
    the input also as ``artifacts/crash-<sha1>``) and swallowing the repeats, those of earlier processes of
    the same run (in ``findings`` already) too."""
    seen: dict[str, int] = {}
    if findings.exists():
        seen.update((json.loads(line)["signature"], 1) for line in findings.read_text().splitlines() if line)

    def one_input(data: bytes) -> None:
        try:
            check(data)
        except RecursionError:
            raise  # libFuzzer reports it; a retry of the whole process would be no wiser
        except Exception as exc:  # noqa: BLE001 - every exception is a finding
            sig, where = signature(exc)
            n = seen.get(sig, 0) + 1
            seen[sig] = n
            if n == 1:
                digest = hashlib.sha1(data).hexdigest()
                (artifacts / f"crash-{digest}").write_bytes(data)
                line = {"signature": sig, "where": where, "exception": f"{type(exc).__name__}: {exc!s:.500}",
                        "input_b64": base64.b64encode(data).decode(), "sha1": digest,
                        "traceback": "".join(traceback.format_exception(exc))[-3000:]}
                with findings.open("a") as f:
                    f.write(json.dumps(line) + "\n")

    return one_input


def replay(name: str, data: bytes) -> None:
    """Run one input through a target without atheris (what the regression tests do); raises on a finding."""
    check = _made.get(name)
    if check is None:
        check = _made[name] = TARGETS[name].make()
    check(data)


_made: dict[str, Callable[[bytes], None]] = {}


# ---------------------------------------------------------------------------------------------- worker

def worker(name: str, workdir: Path, libfuzzer_args: list[str]) -> None:
    """One target under atheris, in this process (started by ``run_target``)."""
    import atheris

    logging.disable(logging.CRITICAL)  # bad input is logged by design; stderr is libFuzzer's report
    target = TARGETS[name]
    with atheris.instrument_imports(include=["infersight"]):
        check = target.make()
    for function in target.functions():
        atheris.instrument_func(function)
    one_input = guarded(check, workdir / "findings.jsonl", workdir / "artifacts")
    atheris.Setup([sys.argv[0], *libfuzzer_args], one_input)
    atheris.Fuzz()


# ---------------------------------------------------------------------------------------------- driver

@dataclass
class Run:
    name: str
    seconds: float = 0.0
    executions: int = 0
    restarts: int = 0
    corpus: int = 0
    findings: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)
    unreproduced: list[str] = field(default_factory=list)  # timeouts that ran in time when replayed alone

    def summary(self) -> dict[str, Any]:
        crashes = len(self.findings) + len(self.artifacts)
        return {"executions": self.executions, "crashes": crashes, "seconds": round(self.seconds, 1),
                "execs_per_s": round(self.executions / self.seconds) if self.seconds else 0,
                "corpus": self.corpus, "restarts": self.restarts,
                "findings": [{k: f[k] for k in ("signature", "where", "exception", "input_b64")}
                             for f in self.findings],
                "libfuzzer_artifacts": self.artifacts, "unreproduced": self.unreproduced}


_EXECUTED = re.compile(r"stat::number_of_executed_units:\s*(\d+)")
_PROGRESS = re.compile(r"^#(\d+)\s", re.M)


def executed(log: str) -> int:
    """Executions from a libFuzzer log: the final stats line, else the last progress line."""
    final = _EXECUTED.findall(log)
    if final:
        return int(final[-1])
    progress = _PROGRESS.findall(log)
    return int(progress[-1]) if progress else 0


def _fuzz_process(name: str, index: int, deadline: float, workdir: Path, runs: int | None) -> tuple[int, int]:
    """One libFuzzer process on the target's shared corpus until ``deadline`` (monotonic) or ``runs``
    executions, restarted after a libFuzzer finding while time (and executions) are left: (executions,
    restarts)."""
    target = TARGETS[name]
    corpus, artifacts, dict_file = workdir / "corpus", workdir / "artifacts", workdir / "tokens.dict"
    executions = restarts = 0
    while (left := deadline - time.monotonic()) >= 5 and (runs is None or executions < runs):
        limit = [] if runs is None else [f"-runs={runs - executions}"]
        args = [f"-max_total_time={int(left)}", *limit, "-print_final_stats=1", "-timeout=60", "-rss_limit_mb=2048",
                f"-max_len={target.max_len}", f"-artifact_prefix={artifacts}/", f"-dict={dict_file}", str(corpus)]
        log_path = workdir / f"libfuzzer-{index}-{restarts}.log"
        with log_path.open("w") as log:
            proc = subprocess.run([sys.executable, "-m", "bench.fuzz", "--worker", name, "--workdir", str(workdir),
                                   "--", *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=left + 120, check=False)
        text = log_path.read_text(errors="replace")
        executions += executed(text)
        if proc.returncode == 0:
            break
        print(f"[{name}/{index}] libFuzzer stopped (exit {proc.returncode}); {text[-1500:]}", file=sys.stderr)
        restarts += 1
        if executions == 0:
            break  # it could not even start: rerunning will not help
    return executions, restarts


def run_target(name: str, seconds: float, workdir: Path, runs: int | None = None, workers: int = 1) -> Run:
    """Fuzz one target for ``seconds`` (wall) or ``runs`` executions in all, in ``workers`` processes sharing one
    corpus (libFuzzer reloads the corpus directory every second, so each process picks up what the others
    found; their executions add up)."""
    target = TARGETS[name]
    corpus, artifacts = workdir / "corpus", workdir / "artifacts"
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(exist_ok=True)
    for seed in target.seeds():
        (corpus / f"seed-{hashlib.sha1(seed).hexdigest()}").write_bytes(seed)
    (workdir / "tokens.dict").write_text("\n".join(dictionary(target)) + "\n")
    run = Run(name)
    started = time.monotonic()
    share = None if runs is None else math.ceil(runs / workers)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(lambda i: _fuzz_process(name, i, started + seconds, workdir, share), range(workers)))
    run.seconds = time.monotonic() - started
    run.executions = sum(e for e, _ in done)
    run.restarts = sum(r for _, r in done)
    findings_file = workdir / "findings.jsonl"
    if findings_file.exists():
        first: dict[str, dict[str, Any]] = {}
        for line in findings_file.read_text().splitlines():
            if line:
                finding = json.loads(line)
                first.setdefault(finding["signature"], finding)
        run.findings = list(first.values())
    python_crashes = {f"crash-{f['sha1']}" for f in run.findings}
    for found in sorted(p.name for p in artifacts.iterdir() if p.name not in python_crashes
                        and p.name.split("-")[0] in ("crash", "timeout", "oom", "leak")):
        if found.startswith("timeout-") and not _reproduces(name, artifacts / found):
            run.unreproduced.append(found)
        else:
            run.artifacts.append(found)
    run.corpus = sum(1 for _ in corpus.iterdir())
    return run


def _reproduces(name: str, artifact: Path) -> bool:
    """Whether ``artifact`` still fails its target when run alone in a fresh worker (limit 120 s)."""
    with tempfile.TemporaryDirectory(prefix="infersight-fuzz-replay-") as scratch:
        (Path(scratch) / "artifacts").mkdir()
        proc = subprocess.run([sys.executable, "-m", "bench.fuzz", "--worker", name, "--workdir", scratch, "--",
                               "-timeout=120", "-rss_limit_mb=2048", f"-artifact_prefix={scratch}/", str(artifact)],
                              cwd=ROOT, capture_output=True, timeout=600, check=False)
    return proc.returncode != 0


def _fuzz_all(names: list[str], seconds: float, runs: int | None, parallel: int, workers: int,
              keep: Path | None) -> Iterator[Run]:
    base = Path(tempfile.mkdtemp(prefix="infersight-fuzz-")) if keep is None else keep
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        yield from pool.map(lambda n: run_target(n, seconds, base / n, runs, workers), names)
    print(f"corpora and logs in {base}", file=sys.stderr)


def _measured(seconds: float, runs: int | None, workers: int) -> dict[str, Any]:
    """What a target's entry carries of its own run, so that ``--merge`` keeps entries of several runs honest: a
    campaign too long for one sitting (10M executions of every target: hours per target on 2 cores) is run target by
    target, and each entry says which code it fuzzed, when, and under which limits."""
    from bench.results_file import git_commit

    return {"commit": git_commit(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds_limit": seconds, "runs_limit": runs, "workers": workers}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:  # --worker NAME --workdir DIR -- LIBFUZZER_ARGS...
        worker(argv[1], Path(argv[3]), argv[argv.index("--") + 1:])
        return
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds-per-target", type=float, help="wall seconds each (default 60; --quick: 10)")
    parser.add_argument("--runs", type=int, help="stop a target after this many executions (default: time only)")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of: {', '.join(TARGETS)}")
    parser.add_argument("--quick", action="store_true", help="a look, not a measurement: 10 s per target unless "
                        "given, results printed, not written")
    parser.add_argument("--parallel", type=int, default=1, help="targets fuzzed at once (one process each)")
    parser.add_argument("--workers", type=int, default=1, help="processes per target, sharing its corpus; "
                        "their executions add up (--runs is the total)")
    parser.add_argument("--keep", type=Path, help="where the corpora, findings and logs go (default: a temp dir)")
    parser.add_argument("--merge", action="store_true", help="replace only these targets in the results file, "
                        "keeping the others' entries (each entry names the commit and time it was measured at)")
    args = parser.parse_args(argv)
    names = [n for n in args.targets.split(",") if n]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    seconds = args.seconds_per_target or (10.0 if args.quick else 60.0)
    runs = {}
    for run in _fuzz_all(names, seconds, args.runs, args.parallel, max(1, args.workers), args.keep):
        runs[run.name] = run.summary() | _measured(seconds, args.runs, max(1, args.workers))
        s = runs[run.name]
        print(f"{run.name:15s} {s['executions']:>12,d} execs  {s['execs_per_s']:>7,d}/s  {s['crashes']} crashes  "
              f"corpus {s['corpus']}", flush=True)
        for f in s["findings"]:
            print(f"    {f['signature']}: {f['exception']:.200}", flush=True)
        for a in s["libfuzzer_artifacts"]:
            print(f"    libFuzzer: {a}", flush=True)
    if args.quick:
        return
    from importlib.metadata import version

    from bench.results_file import save_results

    if args.merge and RESULTS.exists():
        runs = json.loads(RESULTS.read_text()).get("targets", {}) | runs
    save_results(RESULTS, {
        "targets": runs,
        "seconds_per_target": seconds,
        "runs_per_target": args.runs,
        "parallel": args.parallel,
        "atheris": version("atheris"),
        "goal": ">= 10,000,000 executions per target, 0 crashes",
    })
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
